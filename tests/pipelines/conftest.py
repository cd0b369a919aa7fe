"""Fixtures of the pipeline tests: the micro config, an S3 test server, a fake Kubernetes API.

The store is real: moto's S3 server on 127.0.0.1, spoken to over HTTP by the same `minio` client
production uses against MinIO (no MinIO binary is installable here, TOOLCHAIN.md). The Kubernetes
API is a test double, because no API server can run on the CI machines: tests/cluster's fake API
server (real HTTP, the real `kubernetes` client), extended here with pod listing and pod logs, and
with a stand-in for the Trainer controller that runs the TrainJob's command in-process.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from minio import Minio
from moto.server import ThreadedMotoServer

# Helpers live in importable modules (test modules cannot import a conftest in importlib mode).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipelines_testlib import FakeTrainer, serve_fake_trainer

from envace.config import Config, load_config
from tests.helpers.micro import MICRO

ACCESS_KEY = "pipeline-test-access"
SECRET_KEY = "pipeline-test-SECRET-0123456789"


@pytest.fixture(scope="session")
def micro() -> list[str]:
    """`--set` items of the micro preset (a whole run in seconds)."""
    return list(MICRO)


@pytest.fixture
def micro_cfg() -> Config:
    return load_config(None, MICRO)


# --- S3 test server ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_store(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket; ENVACE_S3_* point at the test server (what a pod gets from its Secret).
    Returns the store root URI `minio://<bucket>/runs`."""
    for name in list(os.environ):
        if name.startswith(("ENVACE_S3_", "AWS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ENVACE_S3_ENDPOINT", moto_url)
    monkeypatch.setenv("ENVACE_S3_ACCESS_KEY", ACCESS_KEY)
    monkeypatch.setenv("ENVACE_S3_SECRET_KEY", SECRET_KEY)
    bucket = f"p-{uuid.uuid4().hex[:16]}"
    Minio(moto_url.removeprefix("http://"), ACCESS_KEY, SECRET_KEY, secure=False).make_bucket(
        bucket
    )
    return f"minio://{bucket}/runs"


@pytest.fixture
def fake_trainer(tmp_path: Path) -> Iterator[FakeTrainer]:
    with serve_fake_trainer(tmp_path) as trainer:
        yield trainer
