"""MLflow tracking against a real tracking server: `mlflow server` with its basic-auth app and a
sqlite backend, started from its own venv (scripts/setup_mlflow_server.sh, run by `make test`)
on a free port of 127.0.0.1 once for this module (~20 s to start on the CI machines).

The client side is EnvACE's own: mlflow-skinny in .venv, credentials from the environment
(MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD), as on the cluster."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from envace.errors import UserInputError
from envace.train.tracking import MetricsLogger, MlflowTarget, TrackedRun

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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    mlflow = SERVER_VENV / "bin" / "mlflow"
    if not mlflow.exists():
        raise RuntimeError(f"{mlflow} missing: run `bash scripts/setup_mlflow_server.sh`")
    root = tmp_path_factory.mktemp("mlflow-server")
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


@pytest.fixture
def credentials(server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", server.password)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return server


def _runs(server: Server, experiment: str) -> list[dict[str, Any]]:
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


def _history(server: Server, run_id: str, key: str) -> list[tuple[int, float]]:
    got = httpx.get(
        f"{server.uri}/api/2.0/mlflow/metrics/get-history",
        params={"run_id": run_id, "metric_key": key, "max_results": 1000},
        auth=(USER, server.password),
    )
    got.raise_for_status()
    return sorted((int(m["step"]), float(m["value"])) for m in got.json()["metrics"])


def _tags(run: dict[str, Any]) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def _params(run: dict[str, Any]) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params", [])}


def test_a_resumed_run_continues_one_mlflow_run_with_each_step_once(
    tmp_path: Path, credentials: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Attempt 1 logs iterations 1-4 and is killed (no close); its last checkpoint was 2. The
    resume (a new logger for the same run, `truncate_after(2)`) redoes 3-6. MLflow holds ONE
    run with steps 1-6 each once: 3 and 4 keep attempt 1's values (MLflow can only append;
    metrics.jsonl holds the redone ones). A fresh start of the same run name is a new run."""
    target = MlflowTarget(credentials.uri, "resume")
    run = TrackedRun("minio://envace/runs/exp1", "2026-12-01T10:00:00Z")
    config = {"train": {"lr": 1e-6, "iterations": 6}, "tensorboard": False}

    def attempt(resume_at: int | None, steps: range, offset: float) -> MetricsLogger:
        logger = MetricsLogger(tmp_path, tensorboard=False, config=config, run=run, mlflow=target)
        if resume_at is not None:
            logger.truncate_after(resume_at)
        for it in steps:
            logger.log({"iteration": it, "loss": it + offset, "reward/mean": 0.1 * it})
        return logger

    attempt(None, range(1, 5), 0.0)  # killed: never closed, left RUNNING
    (run_1,) = _runs(credentials, "resume")
    assert run_1["info"]["status"] == "RUNNING"
    with caplog.at_level("WARNING"):
        attempt(2, range(3, 7), 0.5).close()
    assert "MLflow already holds iteration 3 (before the resume); kept" in caplog.text
    (got,) = _runs(credentials, "resume")
    assert got["info"]["run_id"] == run_1["info"]["run_id"]
    assert got["info"]["status"] == "FINISHED"
    assert got["info"]["run_name"] == "exp1"
    assert _tags(got)["envace.run"] == "minio://envace/runs/exp1"
    assert _tags(got)["envace.run_key"] == run.key
    assert _params(got) == {"train.lr": "1e-06", "train.iterations": "6", "tensorboard": "false"}
    run_id = got["info"]["run_id"]
    assert _history(credentials, run_id, "loss") == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 4.0),
        (5, 5.5),
        (6, 6.5),
    ]
    assert [s for s, _ in _history(credentials, run_id, "reward/mean")] == [1, 2, 3, 4, 5, 6]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["loss"] for line in lines] == [1.0, 2.0, 3.5, 4.5, 5.5, 6.5]
    # --overwrite (or a fresh start after a kill before the first checkpoint): a new run
    fresh = TrackedRun(run.name, "2026-12-02T09:00:00Z")
    MetricsLogger(tmp_path, tensorboard=False, run=fresh, mlflow=target).close()
    assert len(_runs(credentials, "resume")) == 2


def test_a_setting_changed_at_a_resume_keeps_its_first_param(
    tmp_path: Path, credentials: Server, caplog: pytest.LogCaptureFixture
) -> None:
    target = MlflowTarget(credentials.uri, "params")
    run = TrackedRun(str(tmp_path), "2026-12-01T10:00:00Z")
    MetricsLogger(
        tmp_path, tensorboard=False, config={"iterations": 2}, run=run, mlflow=target
    ).close()
    with caplog.at_level("WARNING"):
        MetricsLogger(
            tmp_path, tensorboard=False, config={"iterations": 4, "new": 1}, run=run, mlflow=target
        ).close()
    assert "not updated there: iterations" in caplog.text
    (got,) = _runs(credentials, "params")
    assert _params(got) == {"iterations": "2", "new": "1"}


def test_credentials_come_from_the_environment(
    tmp_path: Path,
    server: Server,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No credentials in the environment: refused at start (before any training), naming the
    variables to set; with them (and the URI from MLFLOW_TRACKING_URI), the run is logged and
    the password appears in no log line, param or tag."""
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server.uri)
    from envace.config import load_config

    cfg = load_config(None, ["mlflow_experiment=env"])
    run = TrackedRun(str(tmp_path), "2026-12-01T10:00:00Z")
    with pytest.raises(UserInputError, match=r"401.*MLFLOW_TRACKING_USERNAME"):
        MetricsLogger.from_config(tmp_path, cfg, run)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", server.password)
    with caplog.at_level("DEBUG"):
        logger = MetricsLogger.from_config(tmp_path, cfg, run)
        logger.log({"iteration": 1, "loss": 1.0})
        logger.close()
    (got,) = _runs(server, "env")
    assert _history(server, got["info"]["run_id"], "loss") == [(1, 1.0)]
    assert server.password not in caplog.text
    assert server.password not in json.dumps(got)
    assert _params(got)["mlflow_tracking_uri"] == "null"  # it came from the environment


@pytest.mark.slow
def test_a_run_that_loses_its_pod_keeps_its_tensorboard_events_and_mlflow_run(
    tmp_path: Path, credentials: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """`envace run` on a micro model into a store that is not its output folder: 1 iteration,
    then the folder is lost (a new pod's emptyDir) and a resume for 2 iterations continues
    from the store. The committed report's TensorBoard events (restored from the checkpoint,
    then continued) read back with every iteration's scalars once, equal to metrics.jsonl;
    MLflow holds one run with the same steps and values; the password is in no file."""
    import shutil

    from envace.config import load_config
    from envace.run import run_main
    from envace.storage.artifacts import fetch_dir
    from tests.helpers.micro import MICRO

    store = tmp_path / "store"
    sets = [
        *MICRO,
        "tensorboard=true",
        "train.save_every=1",
        "warm_start.enabled=false",
        "eval.max_tasks=1",
        f"mlflow_tracking_uri={credentials.uri}",
        "mlflow_experiment=pod",
    ]
    run_main(load_config(None, [*sets, "train.iterations=1"]), tmp_path / "pod1", str(store))
    assert (store / "checkpoints" / "rl" / "iter_000001" / "tensorboard").is_dir()
    shutil.rmtree(tmp_path / "pod1")
    with caplog.at_level("INFO"):
        summary = run_main(
            load_config(None, [*sets, "train.iterations=2"]), tmp_path / "pod2", str(store), True
        )
    assert summary["resumed_from"].endswith("iter_000001")
    report = tmp_path / "report"
    fetch_dir(str(store / "report"), report)
    lines = (report / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["iteration"] for r in records] == [1, 2]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(report / "tensorboard"))
    events.Reload()
    (run,) = _runs(credentials, "pod")
    assert run["info"]["status"] == "FINISHED"
    assert _tags(run)["envace.run"] == str(store)
    for key in ("time/rollout_s", "rows/caller", "reward/mean"):
        values = [r[key] for r in records]
        assert [e.step for e in events.Scalars(key)] == [1, 2]
        assert [e.value for e in events.Scalars(key)] == pytest.approx(values)  # float32
        assert _history(credentials, run["info"]["run_id"], key) == list(enumerate(values, 1))
    assert _params(run)["train.save_every"] == "1"
    secret = credentials.password.encode()
    for path in [*store.rglob("*"), *(tmp_path / "pod2").rglob("*")]:
        assert not path.is_file() or secret not in path.read_bytes(), path
    assert credentials.password not in caplog.text


@pytest.mark.slow
def test_pipeline_steps_track_into_one_mlflow_run(
    tmp_path: Path, credentials: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole pipeline under KFP's local runner (micro model, one round), MLflow turned on by
    $MLFLOW_TRACKING_URI as a Secret would on the cluster: the rollout, train and evaluate
    steps, each its own process, log into ONE MLflow run keyed by the pipeline run's store
    folder, at the RL iteration; a retried step's values are not logged twice."""
    from envace import stages
    from envace.config import load_config
    from pipelines.local import run_local
    from pipelines.pipeline import PipelineOptions
    from tests.helpers.micro import MICRO

    monkeypatch.setenv("MLFLOW_TRACKING_URI", credentials.uri)
    cfg = load_config(None, [*MICRO, "eval.max_tasks=1", "mlflow_experiment=pipeline"])
    store = tmp_path / "store"
    result = run_local(PipelineOptions(stages.config_struct(cfg), rounds=1), str(store), tmp_path)
    run_uri = result.checkpoint_uri.rsplit("/checkpoints/", 1)[0]
    (run,) = _runs(credentials, "pipeline")
    assert _tags(run)["envace.run"] == run_uri and run["info"]["status"] == "FINISHED"
    run_id = run["info"]["run_id"]
    assert [s for s, _ in _history(credentials, run_id, "reward/mean")] == [1]  # rollout
    assert [s for s, _ in _history(credentials, run_id, "policy/loss")] == [1]  # train
    success = result.metrics["success_rate"]
    assert _history(credentials, run_id, "eval/success_rate") == [(1, success)]  # evaluate
    assert _params(run)["model.preset"] == "test-micro"
    # a retry of the evaluate step sends its values again: MLflow keeps one per step
    assert stages.track_metrics(cfg, run_uri, 1, {"eval/success_rate": success + 0.5})
    assert _history(credentials, run_id, "eval/success_rate") == [(1, success)]
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert not stages.track_metrics(cfg, run_uri, 1, {"eval/success_rate": 0.0})  # none on
