"""MLflow tracking against a real tracking server (tests/helpers/mlflow_server.py: `mlflow server`
with its basic-auth app and a sqlite backend, one per test session, from its own venv).

The client side is EnvACE's own: mlflow-skinny in .venv, credentials from the environment
(MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD), as on the cluster. The pipeline's steps
tracking into one run is checked by tests/pipelines/test_local_run.py's whole-pipeline run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.errors import UserInputError
from envace.train.tracking import MetricsLogger, MlflowTarget, TrackedRun
from tests.helpers import mlflow_server as mlf
from tests.helpers.mlflow_server import USER, Server


def test_a_resumed_run_continues_one_mlflow_run_with_each_step_once(
    tmp_path: Path, mlflow_credentials: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Attempt 1 logs iterations 1-4 and is killed (no close); its last checkpoint was 2. The
    resume (a new logger for the same run, `truncate_after(2)`) redoes 3-6. MLflow holds ONE
    run with steps 1-6 each once: 3 and 4 keep attempt 1's values (MLflow can only append;
    metrics.jsonl holds the redone ones). A fresh start of the same run name is a new run."""
    target = MlflowTarget(mlflow_credentials.uri, "resume")
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
    (run_1,) = mlf.runs(mlflow_credentials, "resume")
    assert run_1["info"]["status"] == "RUNNING"
    with caplog.at_level("WARNING"):
        attempt(2, range(3, 7), 0.5).close()
    assert "MLflow already holds iteration 3 (before the resume); kept" in caplog.text
    (got,) = mlf.runs(mlflow_credentials, "resume")
    assert got["info"]["run_id"] == run_1["info"]["run_id"]
    assert got["info"]["status"] == "FINISHED"
    assert got["info"]["run_name"] == "exp1"
    assert mlf.tags(got)["envace.run"] == "minio://envace/runs/exp1"
    assert mlf.tags(got)["envace.run_key"] == run.key
    assert mlf.params(got) == {"train.lr": "1e-06", "train.iterations": "6", "tensorboard": "false"}
    run_id = got["info"]["run_id"]
    assert mlf.history(mlflow_credentials, run_id, "loss") == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (4, 4.0),
        (5, 5.5),
        (6, 6.5),
    ]
    assert [s for s, _ in mlf.history(mlflow_credentials, run_id, "reward/mean")] == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["loss"] for line in lines] == [1.0, 2.0, 3.5, 4.5, 5.5, 6.5]
    # --overwrite (or a fresh start after a kill before the first checkpoint): a new run
    fresh = TrackedRun(run.name, "2026-12-02T09:00:00Z")
    MetricsLogger(tmp_path, tensorboard=False, run=fresh, mlflow=target).close()
    assert len(mlf.runs(mlflow_credentials, "resume")) == 2


def test_a_setting_changed_at_a_resume_keeps_its_first_param(
    tmp_path: Path, mlflow_credentials: Server, caplog: pytest.LogCaptureFixture
) -> None:
    target = MlflowTarget(mlflow_credentials.uri, "params")
    run = TrackedRun(str(tmp_path), "2026-12-01T10:00:00Z")
    MetricsLogger(
        tmp_path, tensorboard=False, config={"iterations": 2}, run=run, mlflow=target
    ).close()
    with caplog.at_level("WARNING"):
        MetricsLogger(
            tmp_path, tensorboard=False, config={"iterations": 4, "new": 1}, run=run, mlflow=target
        ).close()
    assert "not updated there: iterations" in caplog.text
    (got,) = mlf.runs(mlflow_credentials, "params")
    assert mlf.params(got) == {"iterations": "2", "new": "1"}


def test_credentials_come_from_the_environment(
    tmp_path: Path,
    mlflow_server: Server,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No credentials in the environment: refused at start (before any training), naming the
    variables to set; with them (and the URI from MLFLOW_TRACKING_URI), the run is logged and
    the password appears in no log line, param or tag."""
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.uri)
    from envace.config import load_config

    cfg = load_config(None, ["mlflow_experiment=env"])
    run = TrackedRun(str(tmp_path), "2026-12-01T10:00:00Z")
    with pytest.raises(UserInputError, match=r"401.*MLFLOW_TRACKING_USERNAME"):
        MetricsLogger.from_config(tmp_path, cfg, run)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", mlflow_server.password)
    with caplog.at_level("DEBUG"):
        logger = MetricsLogger.from_config(tmp_path, cfg, run)
        logger.log({"iteration": 1, "loss": 1.0})
        logger.close()
    (got,) = mlf.runs(mlflow_server, "env")
    assert mlf.history(mlflow_server, got["info"]["run_id"], "loss") == [(1, 1.0)]
    assert mlflow_server.password not in caplog.text
    assert mlflow_server.password not in json.dumps(got)
    assert mlf.params(got)["mlflow_tracking_uri"] == "null"  # it came from the environment


@pytest.mark.slow
def test_a_run_that_loses_its_pod_keeps_its_tensorboard_events_and_mlflow_run(
    tmp_path: Path, mlflow_credentials: Server, caplog: pytest.LogCaptureFixture
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
        f"mlflow_tracking_uri={mlflow_credentials.uri}",
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
    (run,) = mlf.runs(mlflow_credentials, "pod")
    assert run["info"]["status"] == "FINISHED"
    assert mlf.tags(run)["envace.run"] == str(store)
    for key in ("time/rollout_s", "rows/caller", "reward/mean"):
        values = [r[key] for r in records]
        assert [e.step for e in events.Scalars(key)] == [1, 2]
        assert [e.value for e in events.Scalars(key)] == pytest.approx(values)  # float32
        assert mlf.history(mlflow_credentials, run["info"]["run_id"], key) == list(
            enumerate(values, 1)
        )
    assert mlf.params(run)["train.save_every"] == "1"
    secret = mlflow_credentials.password.encode()
    for path in [*store.rglob("*"), *(tmp_path / "pod2").rglob("*")]:
        assert not path.is_file() or secret not in path.read_bytes(), path
    assert mlflow_credentials.password not in caplog.text
