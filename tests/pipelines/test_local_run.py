"""The whole pipeline under KFP's local runner (every component a subprocess of this Python), with
the S3 test server as the store: every artifact committed with a verifying manifest, and the
evaluation's metrics and report out as KFP outputs. MLflow tracking is on, as a Secret turns it on
on the cluster: one real tracking server (tests/helpers/mlflow_server.py) gets every step's
metrics in one run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace import stages
from envace.cli import main
from envace.config import load_config
from envace.storage.artifacts import open_store, verify
from envace.storage.manifest import MANIFEST_NAME
from tests.helpers import mlflow_server as mlf
from tests.helpers.mlflow_server import Server


def _committed(store_uri: str) -> set[str]:
    """Folders (relative to the store root) that hold a manifest."""
    store, prefix = open_store(store_uri)
    return {
        o.key[len(prefix) + 1 : -len(MANIFEST_NAME) - 1]
        for o in store.list(prefix)
        if o.key.endswith("/" + MANIFEST_NAME)
    }


@pytest.mark.slow
def test_run_local_runs_every_step_against_the_s3_store(
    s3_store: str,
    micro: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mlflow_credentials: Server,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = tmp_path / "kfp"
    sets = [*micro, "mlflow_experiment=pipeline"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_credentials.uri)
    argv = ["pipeline", "run-local", "--store", s3_store, "--rounds", "1"]
    argv += ["--pipeline-root", str(root), *[a for kv in sets for a in ("--set", kv)]]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    committed = _committed(s3_store)
    (digest,) = {c.split("/")[1] for c in committed if c.startswith("prepared/")}
    (run_id,) = {c.split("/")[0] for c in committed if not c.startswith("prepared/")}
    assert committed == {
        f"prepared/{digest}/tasks",
        f"prepared/{digest}/init",
        f"{run_id}/checkpoints/warm_start",
        f"{run_id}/rollouts/iter_000001",
        f"{run_id}/checkpoints/rl/iter_000001",
        f"{run_id}/evaluation",
    }
    for folder in committed:
        manifest = verify(f"{s3_store}/{folder}", deep=True)
        assert manifest.files, folder
    # KFP's own outputs: the evaluate step's Metrics and Markdown report
    (evaluate,) = root.glob("envace-*/evaluate/executor_output.json")
    artifacts = json.loads(evaluate.read_text())["artifacts"]
    metrics = artifacts["metrics"]["artifacts"][0]["metadata"]
    assert metrics["n_tasks"] == 2.0 and 0.0 <= metrics["success_rate"] <= 1.0
    report = Path(artifacts["report"]["artifacts"][0]["uri"]).read_text()
    assert report.startswith("# EnvACE evaluation") and f"{run_id}/checkpoints/rl" in report
    (train,) = root.glob("envace-*/train/executor_output.json")
    train_metrics = json.loads(train.read_text())["artifacts"]["metrics"]["artifacts"][0]
    assert "policy/loss" in train_metrics["metadata"]
    # typed artifacts point at the committed folders (the UI's lineage, by reference)
    trained = json.loads(train.read_text())["artifacts"]["trained"]["artifacts"][0]
    checkpoint = f"{s3_store}/{run_id}/checkpoints/rl/iter_000001"
    assert trained["metadata"] == {"store_uri": checkpoint}
    assert json.loads(Path(trained["uri"]).read_text()) == {"store_uri": checkpoint}
    results = artifacts["results"]["artifacts"][0]["metadata"]["store_uri"]
    assert results == f"{s3_store}/{run_id}/evaluation"
    (prepare,) = root.glob("envace-*/prepare/executor_output.json")
    tasks = json.loads(prepare.read_text())["artifacts"]["tasks"]["artifacts"][0]["metadata"]
    assert tasks == {"store_uri": f"{s3_store}/prepared/{digest}/tasks"}
    assert "success_rate" in printed
    assert f"final checkpoint: {s3_store}/{run_id}/checkpoints/rl/iter_000001" in printed
    # MLflow: the rollout, train and evaluate steps, each its own process, log into ONE run keyed
    # by the pipeline run's store folder, at the RL iteration
    (run,) = mlf.runs(mlflow_credentials, "pipeline")
    run_uri = f"{s3_store}/{run_id}"
    assert mlf.tags(run)["envace.run"] == run_uri and run["info"]["status"] == "FINISHED"
    mlflow_run = run["info"]["run_id"]
    assert [s for s, _ in mlf.history(mlflow_credentials, mlflow_run, "reward/mean")] == [1]
    assert [s for s, _ in mlf.history(mlflow_credentials, mlflow_run, "policy/loss")] == [1]
    success = metrics["success_rate"]
    logged = mlf.history(mlflow_credentials, mlflow_run, "eval/success_rate")
    assert logged == [(1, success)]
    assert mlf.params(run)["model.preset"] == "test-micro"
    # a retry of the evaluate step sends its values again: MLflow keeps one per step
    cfg = load_config(None, sets)
    assert stages.track_metrics(cfg, run_uri, 1, {"eval/success_rate": success + 0.5})
    assert mlf.history(mlflow_credentials, mlflow_run, "eval/success_rate") == logged
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert not stages.track_metrics(cfg, run_uri, 1, {"eval/success_rate": 0.0})  # none on


def test_run_local_fails_at_once_when_the_store_is_unreachable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before any step starts: one line naming the endpoint and the variable to fix,
    not a failed `prepare` whose reason is buried in its log."""
    import os
    import socket

    for name in list(os.environ):
        if name.startswith(("ENVACE_S3_", "AWS_")):
            monkeypatch.delenv(name)
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.setenv("ENVACE_S3_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("ENVACE_S3_ACCESS_KEY", "pipeline-test-access")
    monkeypatch.setenv("ENVACE_S3_SECRET_KEY", "pipeline-test-SECRET-0123456789")
    root = tmp_path / "kfp"
    argv = ["pipeline", "run-local", "--store", "minio://bkt/runs", "--rounds", "0"]
    assert main([*argv, "--pipeline-root", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"on endpoint http://127.0.0.1:{port}" in err and "ENVACE_S3_ENDPOINT" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not list(root.glob("envace-*"))  # no step ran
