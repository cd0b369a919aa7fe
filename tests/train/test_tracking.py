"""Trackers that survive the pod: TensorBoard events in the committed report, config as MLflow
params, and W&B runs keyed by the EnvACE run (in W&B's offline mode: no network)."""

from __future__ import annotations

import json
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envace.config import load_config
from envace.errors import ConfigError
from envace.train.tracking import MetricsLogger, TrackedRun, flat_params, wandb_init_args


def _scalars(tb_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_the_committed_report_holds_tensorboard_events_that_read_back(tmp_path: Path) -> None:
    """`commit_report` puts OUT/tensorboard into the report artifact: fetched back from the
    store (every file checked against the manifest), its events hold the logged scalars."""
    from envace.run import RunPaths, commit_report
    from envace.storage.artifacts import fetch_dir, read_manifest

    out, store = tmp_path / "out", tmp_path / "store"
    logger = MetricsLogger(out, tensorboard=True)
    for it in (1, 2, 3):
        logger.log({"iteration": it, "policy/loss": 0.5 / it, "reward/mean": 0.25 * it})
    logger.close()
    uri = commit_report(RunPaths(out, str(store)))
    assert uri == str(store / "report")
    files = [e.path for e in read_manifest(uri).files]
    assert any(p.startswith("tensorboard/events.out.tfevents.") for p in files), files
    fetch_dir(uri, tmp_path / "fetched")
    got = _scalars(tmp_path / "fetched" / "tensorboard", "policy/loss")
    assert [s for s, _ in got] == [1, 2, 3]
    assert [v for _, v in got] == pytest.approx([0.5, 0.25, 0.5 / 3])  # float32 in the events
    assert [v for _, v in _scalars(tmp_path / "fetched" / "tensorboard", "reward/mean")] == [
        0.25,
        0.5,
        0.75,
    ]


def test_flat_params_are_dotted_keys_with_json_values() -> None:
    cfg = load_config(None, ["train.lr=3e-6", "rollout.vllm={}"])
    params = flat_params(cfg.to_dict())
    assert params["train.lr"] == "3e-06"
    assert params["seed"] == "0"
    assert params["model.path"] == "null"
    assert params["model.preset"] == "tiny-4m"  # a string as it is, not JSON-quoted
    assert params["rollout.grounding"] == "true"
    assert params["rollout.vllm"] == "{}"
    assert params["mlflow_experiment"] == "envace"
    nested = flat_params({"train": {"deepspeed_config": {"zero_optimization": {"stage": 2}}}})
    assert nested == {"train.deepspeed_config.zero_optimization.stage": "2"}
    assert flat_params({"a": {"b=c?": [1, 2]}}) == {"a.b_c_": "[1, 2]"}  # MLflow's key alphabet


def test_an_mlflow_uri_with_credentials_is_refused_without_showing_them() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["mlflow_tracking_uri=https://alice:hunter2@mlflow.example:5000"])
    assert "MLFLOW_TRACKING_USERNAME" in str(err.value)
    assert "hunter2" not in str(err.value) and "alice" not in str(err.value)
    assert load_config(None, ["mlflow_tracking_uri=http://mlflow:5000"]).mlflow_tracking_uri


def test_a_tracked_run_key_is_stable_for_the_run_and_new_for_a_fresh_start() -> None:
    run = TrackedRun("minio://envace/runs/exp1", "2026-12-01T10:00:00Z")
    assert run.key == TrackedRun("minio://envace/runs/exp1", "2026-12-01T10:00:00Z").key
    assert len(run.key) == 20 and int(run.key, 16) >= 0
    assert run.key != TrackedRun("minio://envace/runs/exp1", "2026-12-02T09:00:00Z").key
    assert run.key != TrackedRun("minio://envace/runs/exp2", "2026-12-01T10:00:00Z").key
    assert run.title == "exp1"


# --- W&B, offline ---------------------------------------------------------------------------
def _wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf records of a W&B run file (`run-ID.wandb`): a LevelDB-style log of 32 KiB
    blocks after a 7-byte header, each record a 7-byte header (crc32c, length, type) then data;
    type 1 is a whole record, 2-4 its first, middle and last parts."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    pos, block, parts = 7, 32 * 1024, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            yield record


def _finished_records(folder: Path, timeout_s: float = 60.0) -> list[Any]:
    """The records of the run file in `folder` once W&B's service process has written its last
    (`exit`) record: `finish()` returns before that process has flushed the file."""
    deadline = time.monotonic() + timeout_s
    while True:
        files = list(folder.glob("run-*.wandb"))
        records = list(_wandb_records(files[0])) if files else []
        if records and records[-1].WhichOneof("record_type") == "exit":
            return records
        assert time.monotonic() < deadline, f"{folder}: no complete W&B run file"
        time.sleep(0.1)


def _wandb_attempts(out: Path) -> list[dict[str, Any]]:
    """Per offline run folder, oldest first: its run id, project, name, config and history."""
    attempts = []
    for folder in sorted((out / "wandb").glob("offline-run-*")):
        got: dict[str, Any] = {"folder": folder.name, "history": []}
        for record in _finished_records(folder):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                got["id"], got["project"] = record.run.run_id, record.run.project
                got["name"] = record.run.display_name
                got["config"] = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.run.config.update
                }
            elif kind == "history":
                items = {
                    i.key or "/".join(i.nested_key): json.loads(i.value_json)
                    for i in record.history.item
                }
                got["history"].append((items["_step"], items.get("loss")))
        attempts.append(got)
    return attempts


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))


@pytest.mark.usefixtures("wandb_offline")
def test_a_restarted_run_logs_to_the_same_wandb_run(tmp_path: Path) -> None:
    """Two attempts of one run (a kill after iteration 3, a resume from checkpoint 2) write
    two offline run files with the same run id, so `wandb sync` (or an online run, with
    resume="allow") continues one W&B run; a fresh start of the same run name gets a new id.
    Offline, W&B does not know the earlier attempt's steps: the resumed file holds 3-4 again
    (online, a resumed run starts at its next step, and the logger skips the iterations below
    it: that path needs a W&B server and is not exercised here)."""
    out = tmp_path / "out"
    run = TrackedRun("minio://envace/runs/exp1", "2026-12-01T10:00:00Z")
    config = {"train": {"lr": 1e-6}}
    assert wandb_init_args("proj", run, config, out) == {
        "project": "proj",
        "id": run.key,
        "name": "exp1",
        "resume": "allow",
        "config": config,
        "dir": str(out),
    }

    def attempt(resume_at: int | None, steps: range) -> None:
        time.sleep(1.0)  # W&B names an offline run's folder by its start second and its id
        logger = MetricsLogger(out, tensorboard=False, wandb_project="proj", config=config, run=run)
        if resume_at is not None:
            logger.truncate_after(resume_at)
        for it in steps:
            logger.log({"iteration": it, "loss": float(it)})
        logger.close()

    attempt(None, range(1, 4))
    attempt(2, range(3, 5))
    first, second = _wandb_attempts(out)
    for got in (first, second):
        assert (got["id"], got["project"], got["name"]) == (run.key, "proj", "exp1")
        assert got["folder"].endswith(run.key)
        assert got["config"]["train"] == {"lr": 1e-6}
    assert first["history"] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert second["history"] == [(3, 3.0), (4, 4.0)]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [1, 2, 3, 4]
    fresh = TrackedRun(run.name, "2026-12-02T09:00:00Z")
    MetricsLogger(out, tensorboard=False, wandb_project="proj", run=fresh).close()
    assert sorted(a["id"] for a in _wandb_attempts(out)) == sorted([run.key, run.key, fresh.key])
    assert fresh.key != run.key


def test_a_mounted_tracking_secret_sets_the_clients_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A pipeline step's tracking Secret (one file per key, as Kubernetes mounts it): the files
    named as tracking variables become those variables, a variable already set wins, other
    keys are named in a warning, no value reaches the log; no folder (the optional Secret does
    not exist): nothing."""
    from envace.train.tracking import TRACKING_SECRET_VARS, export_tracking_secrets

    for name in TRACKING_SECRET_VARS:
        monkeypatch.delenv(name, raising=False)
    secret = tmp_path / "tracking"
    secret.mkdir()
    (secret / "MLFLOW_TRACKING_USERNAME").write_text("alice\n")
    (secret / "MLFLOW_TRACKING_PASSWORD").write_text("s3cret-pass")
    (secret / "WANDB_API_KEY").write_text("from-the-secret")
    (secret / "AWS_SECRET_ACCESS_KEY").write_text("not-ours")
    (secret / "..data").mkdir()  # the symlinked folder Kubernetes adds to a mounted Secret
    monkeypatch.setenv("WANDB_API_KEY", "set-by-the-pod")
    with caplog.at_level("INFO"):
        exported = export_tracking_secrets(secret)
    assert exported == ["MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_USERNAME"]
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "alice"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "s3cret-pass"
    assert os.environ["WANDB_API_KEY"] == "set-by-the-pod"
    assert "ignored keys AWS_SECRET_ACCESS_KEY" in caplog.text
    assert not {"s3cret-pass", "alice", "not-ours"} & set(caplog.text.split())
    assert "s3cret-pass" not in caplog.text
    assert export_tracking_secrets(tmp_path / "absent") == []
    (secret / "MLFLOW_TRACKING_TOKEN").write_text("   ")
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    with pytest.raises(ConfigError, match="MLFLOW_TRACKING_TOKEN: the file is empty"):
        export_tracking_secrets(secret)
