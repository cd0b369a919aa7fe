"""The train step with nodes > 1: a Kubeflow Trainer TrainJob, followed to its end.

Test double: no Kubernetes API server can run on the CI machines, so these tests use the fake API
server of tests/cluster (real HTTP, the real `kubernetes` client) with pod listing and logs added
(conftest.FakeTrainer). The fake plays the Trainer controller: scripted TrainJob statuses, and, in
the success case, the nodes themselves: it runs the TrainJob's own command line
(`envace pipeline train-step ...` with the ConfigMap's config) in-process against the S3 test
server, so the checkpoint the step returns is one the job really committed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_testlib import condition
from pipelines_testlib import FakeTrainer

from envace import stages
from envace.config import Config, load_config
from envace.errors import ConfigError, UserInputError
from envace.policy.hf_backend import load_model_and_tokenizer
from envace.rollout.io import write_rows
from envace.rollout.types import Role, Row
from envace.storage.artifacts import commit_dir, fetch_dir, verify
from tests.helpers.ranks import run_ranks, torchrun

RUNNING = {"jobsStatus": [{"name": "node", "active": 2, "ready": 2}]}
COMPLETE = {
    "conditions": [condition("Complete", "TrainJob is completed")],
    "jobsStatus": [{"name": "node", "succeeded": 2}],
}
FAILED = {
    "conditions": [condition("Failed", "jobset failed: node-0 exited with code 1")],
    "jobsStatus": [{"name": "node", "failed": 1}],
}


@pytest.fixture
def inputs(s3_store: str, micro: list[str], tmp_path: Path) -> tuple[Config, str, str, str]:
    """(config, checkpoint, rows, out) in the S3 store: a prepared model and rows it sampled."""
    cfg = load_config(None, [*micro, "warm_start.enabled=false", "train.engine=deepspeed"])
    prepared = stages.prepare(cfg, s3_store)
    local = tmp_path / "init"
    fetch_dir(prepared.checkpoint_uri, local)
    _model, tokenizer = load_model_and_tokenizer(local)
    ids = tokenizer("Hello there")["input_ids"]
    rows = [
        Row(Role.CALLER, "t", f"t#{i}", 0, 0, [1, 2, 3], ids, [0.0] * len(ids), "stop", True,
            True, "Hello there", 1.0, adv)
        for i, adv in enumerate((1.0, -0.5))  # identical rows: +1 / -1 would cancel out
    ]  # fmt: skip
    layout = stages.RunLayout(s3_store, "run-7")
    scratch = tmp_path / "rows"
    write_rows(rows, scratch)
    (scratch / stages.ROLLOUT_META).write_text(json.dumps({"checkpoint": prepared.checkpoint_uri}))
    commit_dir(scratch, layout.rollout(0))
    return cfg, prepared.checkpoint_uri, layout.rollout(0), layout.checkpoint(0)


def _launch(fake: FakeTrainer) -> stages.TrainJobLaunch:
    return stages.TrainJobLaunch(
        nodes=2,
        gpus_per_node=8,
        image="registry.example.com/envace-gpu:0.1.0",
        kubeconfig=str(fake.api.kubeconfig),
        poll_interval_s=0.01,
        timeout_s=900,  # the nodes (2 real ranks) run in the background: generous on a busy host
    )


def _run_nodes(tmp_path: Path) -> Any:
    """The stand-in for the job's pods: the TrainJob's command, as torchrun with 2 real
    DeepSpeed ranks on this machine, with its ConfigMap mounted."""

    def start(trainjob: dict[str, Any], configmap: dict[str, Any]) -> None:
        trainer = trainjob["spec"]["trainer"]
        assert trainer["command"][:3] == ["torchrun", "--no-python", "envace"]
        config = tmp_path / "job-config.yaml"
        config.write_text(configmap["data"]["config.yaml"])
        args = [str(config) if a == "/etc/envace-job/config.yaml" else a for a in trainer["args"]]
        proc = run_ranks(torchrun(*trainer["command"][1:], *args), timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert "DeepSpeed engine: ZeRO-2, 2 rank(s)" in proc.stderr

    return start


def test_multi_node_train_runs_as_a_trainjob_and_returns_its_checkpoint(
    fake_trainer: FakeTrainer, inputs: tuple[Config, str, str, str], tmp_path: Path
) -> None:
    cfg, checkpoint, rows, out = inputs
    fake_trainer.cluster.statuses = [RUNNING, RUNNING, COMPLETE]
    fake_trainer.on_start = _run_nodes(tmp_path)
    name = stages.train_step_job_name(out)
    fake_trainer.logs[name] = "step 1: loss=0.12\ncommitted\n"
    lines: list[str] = []
    trained = stages.train(
        cfg,
        checkpoint,
        rows,
        out,
        total_iterations=3,
        launch=_launch(fake_trainer),
        emit=lines.append,
    )
    assert not fake_trainer.errors
    assert trained.uri == out
    assert trained.metrics["policy/rows"] == 2.0 and trained.metrics["policy/grad_norm"] > 0
    assert "trainer_state.pt" in {e.path for e in verify(out, deep=True).files}
    job = fake_trainer.cluster.trainjobs[name]
    assert job["metadata"]["namespace"] == "team-a"
    trainer = job["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 8
    assert trainer["image"] == "registry.example.com/envace-gpu:0.1.0"
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    assert trainer["command"] == list(stages.TRAIN_STEP_COMMAND)
    assert trainer["args"] == [
        "--config",
        "/etc/envace-job/config.yaml",
        *stages.train_step_args(checkpoint, rows, out, 3),
    ]
    configmap = fake_trainer.cluster.configmaps[f"{name}-config"]
    assert yaml.safe_load(configmap["data"]["config.yaml"]) == cfg.to_dict()
    assert configmap["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    # Pending while the nodes run (in the background), then the scripted statuses
    states = [line for line in lines if not line.endswith(": Pending")]
    assert states[0].startswith(f"team-a/{name}: Running")
    assert any("Complete" in line for line in lines)
    assert "step 1: loss=0.12" in lines and lines[-1] == "committed"


def test_a_failed_trainjob_fails_the_step_with_its_status_and_logs(
    fake_trainer: FakeTrainer, inputs: tuple[Config, str, str, str]
) -> None:
    cfg, checkpoint, rows, out = inputs
    fake_trainer.cluster.statuses = [RUNNING, FAILED]
    name = stages.train_step_job_name(out)
    fake_trainer.logs[name] = "Traceback (most recent call last):\ntorch.OutOfMemoryError: CUDA\n"
    lines: list[str] = []
    with pytest.raises(stages.StageError) as err:
        stages.train(cfg, checkpoint, rows, out, launch=_launch(fake_trainer), emit=lines.append)
    message = str(err.value)
    assert f"TrainJob team-a/{name} failed: jobset failed: node-0 exited with code 1" in message
    assert f"envace cluster status {name}" in message
    assert "torch.OutOfMemoryError: CUDA" in lines
    assert any(line.startswith(f"--- {name}-node-0-0-x") for line in lines)


def test_a_retried_step_follows_the_trainjob_it_created_before(
    fake_trainer: FakeTrainer, inputs: tuple[Config, str, str, str], tmp_path: Path
) -> None:
    cfg, checkpoint, rows, out = inputs
    fake_trainer.cluster.statuses = [COMPLETE]
    fake_trainer.on_start = _run_nodes(tmp_path)
    stages.train(cfg, checkpoint, rows, out, launch=_launch(fake_trainer), emit=lambda _: None)
    posts = len(fake_trainer.cluster.calls("POST", "trainjobs"))
    lines: list[str] = []
    again = stages.train(
        cfg, checkpoint, rows, out, launch=_launch(fake_trainer), emit=lines.append
    )
    assert again.uri == out
    assert len(fake_trainer.cluster.calls("POST", "trainjobs")) == posts + 1  # a 409, then follow
    assert len(fake_trainer.cluster.trainjobs) == 1
    assert "exists already" in lines[0]


def test_a_local_store_cannot_serve_a_trainjob(
    fake_trainer: FakeTrainer, micro_cfg: Config, tmp_path: Path
) -> None:
    micro_cfg.train.engine = "deepspeed"
    with pytest.raises(UserInputError, match="minio:// or s3://"):
        stages.train(micro_cfg, "ckpt", "rows", str(tmp_path / "out"), launch=_launch(fake_trainer))
    assert not fake_trainer.cluster.requests


def test_job_names_are_stable_per_output_and_valid_labels() -> None:
    a = stages.train_step_job_name("minio://envace/runs/r1/checkpoints/rl/iter_000001")
    assert a == stages.train_step_job_name("minio://envace/runs/r1/checkpoints/rl/iter_000001")
    assert a != stages.train_step_job_name("minio://envace/runs/r1/checkpoints/rl/iter_000002")
    assert a.startswith("envace-step-") and len(a) <= 40


def test_a_multi_node_train_step_needs_the_deepspeed_engine(
    inputs: tuple[Config, str, str, str], fake_trainer: Any
) -> None:
    """Refused before anything is created: the torch engine trains one process."""
    _cfg, checkpoint, rows, out = inputs
    torch_cfg = load_config(None, ["train.engine=torch"])
    with pytest.raises(ConfigError, match=r"set train\.engine: deepspeed"):
        stages.train(torch_cfg, checkpoint, rows, out, launch=_launch(fake_trainer))
    assert not fake_trainer.cluster.requests
