"""A real MLflow tracking server for the tests: `mlflow server` with its basic-auth app and a sqlite
backend, started from its own venv (scripts/setup_mlflow_server.sh, run by `make test`) on a free
port of 127.0.0.1 (~15-20 s to start on a 2-core machine; tests/conftest.py starts one a session).
Runs are read back over MLflow's REST API with httpx: no MLflow code on the reading side."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
SERVER_VENV = Path(os.environ.get("MLFLOW_VENV", REPO / ".cache" / "mlflow-venv"))
USER = "admin"


@dataclass(frozen=True)
class Server:
    uri: str
    password: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_until_up(proc: subprocess.Popen[bytes], uri: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mlflow server exited ({proc.returncode}):\n{log.read_text()}")
        try:
            if httpx.get(f"{uri}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"mlflow server not up after {timeout_s} s:\n{log.read_text()[-3000:]}")


@contextmanager
def serve_mlflow(root: Path) -> Iterator[Server]:
    """An MLflow server keeping its database, artifacts and log under `root`, stopped after."""
    mlflow = SERVER_VENV / "bin" / "mlflow"
    if not mlflow.exists():
        raise RuntimeError(f"{mlflow} missing: run `bash scripts/setup_mlflow_server.sh`")
    port, password = _free_port(), secrets.token_urlsafe(16)
    env = {
        **os.environ,
        "MLFLOW_AUTH_ADMIN_PASSWORD": password,  # the basic-auth app's admin user
        "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # no background job runner process
    }
    log = root / "server.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [
                str(mlflow),
                "server",
                "--app-name",
                "basic-auth",
                "--backend-store-uri",
                f"sqlite:///{root / 'mlflow.db'}",
                "--default-artifact-root",
                str(root / "artifacts"),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            cwd=root,  # the basic-auth app keeps its user database in the working directory
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the server and its workers
        )
    uri = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(proc, uri, log, timeout_s=180)
        yield Server(uri, password)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def runs(server: Server, experiment: str) -> list[dict[str, Any]]:
    """Every run of `experiment`, read over MLflow's REST API (no MLflow code)."""
    auth = (USER, server.password)
    api = f"{server.uri}/api/2.0/mlflow"
    got = httpx.get(
        f"{api}/experiments/get-by-name", params={"experiment_name": experiment}, auth=auth
    )
    got.raise_for_status()
    experiment_id = got.json()["experiment"]["experiment_id"]
    found = httpx.post(f"{api}/runs/search", json={"experiment_ids": [experiment_id]}, auth=auth)
    found.raise_for_status()
    return list(found.json().get("runs", []))


def history(server: Server, run_id: str, key: str) -> list[tuple[int, float]]:
    got = httpx.get(
        f"{server.uri}/api/2.0/mlflow/metrics/get-history",
        params={"run_id": run_id, "metric_key": key, "max_results": 1000},
        auth=(USER, server.password),
    )
    got.raise_for_status()
    return sorted((int(m["step"]), float(m["value"])) for m in got.json()["metrics"])


def tags(run: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def params(run: dict[str, Any]) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params", [])}
