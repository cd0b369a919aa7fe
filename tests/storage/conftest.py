"""Fixtures: a real S3-protocol server (moto) on 127.0.0.1, buckets, and a fault-injecting proxy.

The tests speak S3 over real HTTP through the same `minio` client code production uses against
MinIO; no MinIO server binary can be installed here (TOOLCHAIN.md). The proxy is a real HTTP
server between client and moto that injects the faults a flaky network or an overloaded server
produces (503 SlowDown, hung responses, bodies cut mid-stream).
"""

from __future__ import annotations

import http.client
import http.server
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from minio import Minio
from moto.server import ThreadedMotoServer

from envace.storage import RetryPolicy, S3Settings
from envace.storage.s3 import S3Store

MiB = 1024 * 1024
ACCESS_KEY = "envace-test-access"
SECRET_KEY = "envace-test-SECRET-do-not-log-0123456789"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    @property
    def netloc(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.netloc}"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[Endpoint]:
    """One in-process moto S3 server for the session (starts in < 0.1 s)."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield Endpoint(host, port)
    server.stop()


def settings_for(endpoint: Endpoint, **overrides: Any) -> S3Settings:
    base = S3Settings(
        endpoint=endpoint.netloc,
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        secure=False,
        connect_timeout_s=2.0,
        read_timeout_s=30.0,
        part_size=5 * MiB,
    )
    return base.with_overrides(**overrides)


@pytest.fixture
def s3_settings(moto_endpoint: Endpoint) -> S3Settings:
    return settings_for(moto_endpoint)


@pytest.fixture
def fast_retry() -> RetryPolicy:
    """Real backoff, tiny delays: a test's retries cost milliseconds."""
    return RetryPolicy(max_attempts=4, base_delay=0.01, max_delay=0.05, total_budget_s=10.0)


def raw_client(endpoint: Endpoint) -> Minio:
    return Minio(endpoint.netloc, ACCESS_KEY, SECRET_KEY, secure=False)


# Test modules cannot import this conftest (importlib mode): helpers are handed out as fixtures.


@pytest.fixture
def make_settings() -> Any:
    """`make_settings(endpoint, **overrides)` -> S3Settings for a test server."""
    return settings_for


@pytest.fixture
def raw_s3(moto_endpoint: Endpoint) -> Minio:
    """The plain minio SDK on the test server, to set up or inspect state behind our back."""
    return raw_client(moto_endpoint)


@pytest.fixture
def secret_key() -> str:
    return SECRET_KEY


@pytest.fixture
def random_file() -> Any:
    """`random_file(path, size, seed=0)` writes pseudo-random bytes in chunks."""
    return write_random


@pytest.fixture
def bucket(moto_endpoint: Endpoint, s3_settings: S3Settings) -> Iterator[str]:
    """A fresh bucket per test, emptied afterwards (moto keeps objects in memory)."""
    name = f"t-{uuid.uuid4().hex[:16]}"
    raw_client(moto_endpoint).make_bucket(name)
    yield name
    S3Store(s3_settings, name).delete_prefix("")


@pytest.fixture
def env_s3(moto_endpoint: Endpoint, monkeypatch: pytest.MonkeyPatch) -> Endpoint:
    """ENVACE_S3_* variables pointing at the test server (what a pod gets from its Secret)."""
    for name in list(os.environ):
        if name.startswith(("ENVACE_S3_", "AWS_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ENVACE_S3_ENDPOINT", moto_endpoint.url)
    monkeypatch.setenv("ENVACE_S3_ACCESS_KEY", ACCESS_KEY)
    monkeypatch.setenv("ENVACE_S3_SECRET_KEY", SECRET_KEY)
    return moto_endpoint


# -- a moto server in its own process: the one test that stops the server kills it ------------


@dataclass
class MotoProcess:
    endpoint: Endpoint
    proc: subprocess.Popen[bytes]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture
def moto_process() -> Iterator[MotoProcess]:
    """moto in a child process. Killing it drops every open connection, as a crashed server
    does; stopping an in-process server would leave keep-alive handler threads answering."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("moto server process did not start within 30 s")
    yield MotoProcess(Endpoint("127.0.0.1", port), proc)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)


# -- fault-injecting HTTP proxy ---------------------------------------------------------------

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}
_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)


@dataclass
class FaultPlan:
    """Faults for the next requests, consumed in order: ("503"), ("hang", s), ("cut", bytes)."""

    faults: list[tuple[str, float]] = field(default_factory=list)
    log: list[tuple[str, str, str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    only_method: str | None = None
    # STS front (`sts_token` set): AssumeRoleWithWebIdentity with this token is answered by
    # moto's own STS (minio sends the parameters in the URL, moto's server routes STS only by
    # a form body: the proxy moves them there); another token gets 403 AccessDenied. Each
    # request's (Action, token, RoleArn) goes to `sts_calls`, each S3 request's SigV4 access
    # key to `signed_by`.
    sts_token: str | None = None
    sts_calls: list[tuple[str, str, str]] = field(default_factory=list)
    signed_by: list[str] = field(default_factory=list)

    def next_fault(self, method: str) -> tuple[str, float] | None:
        with self.lock:
            if self.faults and self.only_method in (None, method):
                return self.faults.pop(0)
        return None


def _sts_front(handler: Any, plan: FaultPlan) -> bool:
    """Answer an STS request (True), or note an S3 request's signing key and leave it to the
    handler (False)."""
    query = urllib.parse.urlsplit(handler.path).query
    params = dict(urllib.parse.parse_qsl(query))
    if params.get("Action") != "AssumeRoleWithWebIdentity":
        auth = handler.headers.get("Authorization", "")
        if "Credential=" in auth:
            plan.signed_by.append(auth.split("Credential=", 1)[1].split("/", 1)[0])
        return False
    token = params.get("WebIdentityToken", "")
    plan.sts_calls.append((params["Action"], token, params.get("RoleArn", "")))
    handler.close_connection = True
    if token != plan.sts_token:
        denied = b"<ErrorResponse><Error><Code>AccessDenied</Code></Error></ErrorResponse>"
        handler._reply(403, {"Content-Type": "text/xml"}, denied)
        return True
    handler.path = "/"
    for name in ("Content-Type", "Content-Length"):
        del handler.headers[name]
    handler.headers["Content-Type"] = "application/x-www-form-urlencoded"
    handler._reply(*handler._forward(query.encode()))
    return True


def _make_handler(upstream: Endpoint, plan: FaultPlan) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the plan's log records what matters."""

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if plan.sts_token is not None and _sts_front(self, plan):
                return
            fault = plan.next_fault(self.command)
            plan.log.append(
                (self.command, self.path, self.headers.get("Range", ""), fault[0] if fault else "")
            )
            self.close_connection = True
            if fault and fault[0] == "503":
                self._reply(503, {"Content-Type": "application/xml"}, _SLOW_DOWN)
                return
            if fault and fault[0] == "hang":
                time.sleep(fault[1])
            status, headers, data = self._forward(body)
            if fault and fault[0] == "cut":
                self._reply(status, headers, data[: int(fault[1])], declared=len(data))
                return
            self._reply(status, headers, data)

        def _forward(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
            conn = http.client.HTTPConnection(upstream.host, upstream.port, timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            out = {k: v for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP}
            conn.close()
            return resp.status, out, data

        def _reply(
            self, status: int, headers: dict[str, str], data: bytes, declared: int | None = None
        ) -> None:
            self.send_response(status)
            for key, value in headers.items():
                if key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(data) if declared is None else declared))
            self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A hung handler finds its client (or moto) gone: expected here, nothing to report."""


@dataclass
class FlakyProxy:
    endpoint: Endpoint
    plan: FaultPlan


@pytest.fixture
def flaky_proxy(moto_endpoint: Endpoint) -> Iterator[FlakyProxy]:
    plan = FaultPlan()
    server = _QuietServer(("127.0.0.1", 0), _make_handler(moto_endpoint, plan))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield FlakyProxy(Endpoint("127.0.0.1", int(server.server_address[1])), plan)
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def write_random(path: Path, size: int, seed: int = 0) -> Path:
    """A file of `size` pseudo-random bytes, written in chunks (never all in memory)."""
    import random

    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        left = size
        while left:
            n = min(left, 4 * MiB)
            fh.write(rng.randbytes(n))
            left -= n
    return path


@dataclass(frozen=True)
class StoreRoot:
    """Where an artifact-level test writes: a local folder or a bucket, plus the settings."""

    kind: str
    uri: str
    config: S3Settings | None


@pytest.fixture(params=["local", "s3"])
def store_root(request: pytest.FixtureRequest, tmp_path: Path) -> StoreRoot:
    """Run the test once on a local folder and once on the S3 test server."""
    if request.param == "local":
        return StoreRoot("local", str(tmp_path / "store"), None)
    bucket_name = request.getfixturevalue("bucket")
    config = request.getfixturevalue("s3_settings")
    return StoreRoot("s3", f"minio://{bucket_name}/runs", config)
