"""envace.stages: the stage functions the pipeline components call, on a local store.

The central check: two pipeline train steps, each rebuilding the trainer from the checkpoint the
step before committed, give bit-identical weights and the same metrics as two PPO updates in one
process (optimizer state, lr schedule and weights survive the store).
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from envace import stages
from envace.config import Config, load_config
from envace.errors import ConfigError, UserInputError
from envace.policy.chat import ChatRenderer
from envace.policy.hf_backend import load_model_and_tokenizer
from envace.rollout.grading import TaskGrader
from envace.rollout.io import write_rows
from envace.rollout.types import Role, Row
from envace.run import model_policy
from envace.storage.artifacts import commit_dir, verify
from envace.train.engine import TorchEngine
from envace.train.rl import RLTrainer, RoleLearner


def test_layout_names_every_artifact_of_a_run() -> None:
    layout = stages.RunLayout("minio://envace/runs", "3f2a")
    assert layout.run_uri == "minio://envace/runs/3f2a"
    assert layout.warm_start == "minio://envace/runs/3f2a/checkpoints/warm_start"
    assert layout.rollout(0) == "minio://envace/runs/3f2a/rollouts/iter_000001"
    assert layout.checkpoint(1) == "minio://envace/runs/3f2a/checkpoints/rl/iter_000002"
    assert layout.evaluation == "minio://envace/runs/3f2a/evaluation"
    for bad in ("", "a/b", ".."):
        with pytest.raises(UserInputError, match="one non-empty path segment"):
            stages.RunLayout("minio://envace/runs", bad)


def test_config_travels_as_a_struct_of_its_changes(micro_cfg: Config) -> None:
    struct = stages.config_struct(micro_cfg)
    assert struct["model"]["preset"] == "test-micro" and "seed" not in struct  # only changes
    assert json.loads(json.dumps(struct)) == struct  # a JSON object, as KFP passes it
    assert stages.pipeline_config(struct).to_dict() == micro_cfg.to_dict()
    assert stages.config_struct(load_config(None)) == {}
    # KFP structs carry every number as a double: integral floats read back as ints
    floats = {"rollout": {"n": 8.0}, "train": {"iterations": 3.0}}
    cfg = stages.pipeline_config(floats)
    assert (cfg.rollout.n, cfg.train.iterations) == (8, 3) and isinstance(cfg.rollout.n, int)
    with pytest.raises(ConfigError, match=r"rollout\.n: expected int, got 8\.5"):
        stages.pipeline_config({"rollout": {"n": 8.5}})
    with pytest.raises(ConfigError, match=r"algo\.dual_clip: null cannot be a value"):
        stages.config_struct(load_config(None, ["algo.dual_clip=null"]))
    # text (YAML or JSON) still reads, as an older spec's STRING parameter passed it
    assert stages.pipeline_config("train:\n  lr: 2.0e-5\n").train.lr == 2e-5
    assert stages.pipeline_config("").to_dict() == load_config(None).to_dict()
    with pytest.raises(ConfigError, match=r"train\.lr"):
        stages.pipeline_config('{"train": {"lr": -1}}')
    with pytest.raises(ConfigError, match="mapping"):
        stages.pipeline_config("[1, 2]")
    with pytest.raises(ConfigError, match="`config`: not valid YAML"):
        stages.pipeline_config("train: [")


def test_config_digest_follows_every_value(micro_cfg: Config) -> None:
    other = load_config(None, ["model.preset=test-micro"])
    assert stages.config_digest(micro_cfg) == stages.config_digest(copy.deepcopy(micro_cfg))
    assert stages.config_digest(micro_cfg) != stages.config_digest(other)
    assert len(stages.config_digest(micro_cfg)) == 16


def test_setup_points_the_store_client_at_the_endpoint(
    micro_cfg: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ENVACE_S3_ENDPOINT", raising=False)
    cfg = stages.setup(stages.config_struct(micro_cfg), "http://envace-minio:9000")
    assert cfg.to_dict() == micro_cfg.to_dict()
    assert os.environ["ENVACE_S3_ENDPOINT"] == "http://envace-minio:9000"


def test_artifacts_point_at_store_folders(tmp_path: Path) -> None:
    from kfp.dsl import Dataset, Model

    model = Model(name="trained", uri=str(tmp_path / "kfp" / "trained"))
    assert stages.point_artifact(model, "minio://envace/runs/r/checkpoints/rl/iter_000001")
    assert model.metadata == {"store_uri": "minio://envace/runs/r/checkpoints/rl/iter_000001"}
    assert json.loads(Path(model.path).read_text()) == model.metadata  # the pointer file
    # a step downstream reads the metadata, or the pointer file where metadata was lost
    assert stages.artifact_uri(model) == model.metadata["store_uri"]
    bare = Model(name="trained", uri=model.uri)
    assert stages.artifact_uri(bare) == model.metadata["store_uri"]
    foreign = Dataset(name="rows", uri=str(tmp_path / "elsewhere"))
    with pytest.raises(stages.StageError, match=r"'rows' .* not written by an EnvACE step"):
        stages.artifact_uri(foreign)


def test_kfp_metrics_get_the_finite_numbers(tmp_path: Path) -> None:
    from kfp.dsl import Metrics

    artifact = Metrics(name="metrics", uri=str(tmp_path / "m"))
    values = {"a": 1, "b": 0.5, "none": None, "flag": True, "nan": float("nan"), "s": "x"}
    assert stages.log_kfp_metrics(artifact, values) == {"a": 1.0, "b": 0.5}
    assert artifact.metadata == {"a": 1.0, "b": 0.5}


@pytest.fixture(scope="module")
def prepared(
    tmp_path_factory: pytest.TempPathFactory, micro: list[str]
) -> tuple[Config, str, stages.Prepared]:
    store = str(tmp_path_factory.mktemp("store"))
    cfg = load_config(None, [*micro, "warm_start.enabled=false", "train.iterations=2"])
    return cfg, store, stages.prepare(cfg, store)


def test_prepare_commits_tasks_and_initial_model_and_reuses_them(
    prepared: tuple[Config, str, stages.Prepared],
) -> None:
    cfg, store, first = prepared
    root = stages.prepared_uri(store, cfg)
    assert first == stages.Prepared(f"{root}/tasks", f"{root}/init")
    names = {e.path for e in verify(first.tasks_uri, deep=True).files}
    assert names == {"train.jsonl", "test.jsonl", "gold_train.jsonl"}
    assert "model.safetensors" in {e.path for e in verify(first.checkpoint_uri, deep=True).files}
    manifest = Path(first.checkpoint_uri) / "MANIFEST.json"
    before = manifest.stat().st_mtime_ns
    assert stages.prepare(cfg, store) == first
    assert manifest.stat().st_mtime_ns == before  # reused, not re-committed


def test_prepare_keeps_a_configured_model_path(tmp_path: Path, micro: list[str]) -> None:
    cfg = load_config(None, [*micro, "model.path=Qwen/Qwen3-8B"])
    result = stages.prepare(cfg, str(tmp_path))
    assert result.checkpoint_uri == "Qwen/Qwen3-8B"
    verify(result.tasks_uri)


def test_warm_start_disabled_passes_the_checkpoint_through(
    prepared: tuple[Config, str, stages.Prepared],
) -> None:
    cfg, store, p = prepared
    out = stages.RunLayout(store, "ws").warm_start
    assert stages.warm_start(cfg, p.checkpoint_uri, p.tasks_uri, out) == p.checkpoint_uri
    assert not Path(out).exists()


def _rows(tokenizer: Any) -> list[Row]:
    """Rows with non-zero advantages, so each update moves the weights and the Adam moments."""
    renderer = ChatRenderer(tokenizer)
    out = []
    for i, (prompt, response) in enumerate(
        [("Move 50 to ACC-2", "<tool_call>"), ("balance?", "It is 120."), ("hi", "Hello")]
    ):
        role = Role.CALLER if i % 2 == 0 else Role.SIMULATOR
        ids = renderer.encode(response)
        out.append(
            Row(
                role, f"t{i}", f"t{i}#0", 0, 0, renderer.encode(prompt), ids,
                [0.0] * len(ids), "stop", True, True, response, 1.0, [1.0, -0.5, 0.25][i],
            )
        )  # fmt: skip
    return out


def _store_rows(rows: list[Row], checkpoint_uri: str, uri: str, scratch: Path) -> str:
    """Rows committed as the rollout step would (rows + rollout.json naming their policy)."""
    write_rows(rows, scratch)
    (scratch / stages.ROLLOUT_META).write_text(json.dumps({"checkpoint": checkpoint_uri}))
    commit_dir(scratch, uri)
    return uri


def _in_process_updates(cfg: Config, init: str, rows: list[Row], n: int) -> tuple[Any, list[Any]]:
    model, tokenizer = load_model_and_tokenizer(init)
    t = cfg.train
    engine = TorchEngine(model, t.lr, t.weight_decay, t.grad_clip, t.lr_schedule, 0, n)
    learner = RoleLearner(
        engine, frozenset({"caller", "simulator"}), ChatRenderer(tokenizer).pad_id
    )
    trainer = RLTrainer(cfg, [], model_policy(model, tokenizer, cfg), [learner], TaskGrader())
    return model, [trainer.update(rows) for _ in range(n)]


@pytest.mark.slow
def test_train_steps_through_the_store_equal_updates_in_one_process(
    prepared: tuple[Config, str, stages.Prepared], tmp_path: Path, micro: list[str]
) -> None:
    _cfg, store, p = prepared
    cfg = load_config(None, [*micro, "train.lr_schedule=cosine", "train.lr=1e-2"])
    layout = stages.RunLayout(store, "invariance")
    _model, tokenizer = load_model_and_tokenizer(p.checkpoint_uri)
    rows = _rows(tokenizer)
    checkpoint, results = p.checkpoint_uri, []
    for it in range(2):
        rows_uri = _store_rows(rows, checkpoint, layout.rollout(it), tmp_path / f"rows{it}")
        trained = stages.train(cfg, checkpoint, rows_uri, layout.checkpoint(it), total_iterations=2)
        results.append(trained.metrics)
        checkpoint = trained.uri
    expected_model, expected = _in_process_updates(cfg, p.checkpoint_uri, rows, 2)
    assert results == expected
    assert results[0]["policy/grad_norm"] > 0 and results[0] != results[1]
    stored, _ = load_model_and_tokenizer(Path(checkpoint) / "policy")
    for (name, want), got in zip(
        expected_model.state_dict().items(), stored.state_dict().values(), strict=True
    ):
        assert torch.equal(want, got), name
    state = torch.load(Path(checkpoint) / "trainer_state.pt", weights_only=False)
    assert state["iteration"] == 2 and state["engines"]["policy"]["steps"] == 2
    meta = json.loads((Path(checkpoint) / stages.CHECKPOINT_META).read_text())
    assert meta == {
        "iteration": 2,
        "rl_start": p.checkpoint_uri,
        "checkpoint": layout.checkpoint(0),
        "rows": layout.rollout(1),
        "config_digest": stages.config_digest(cfg),
        "total_iterations": 2,
    }


def test_train_refuses_rows_another_policy_sampled(
    prepared: tuple[Config, str, stages.Prepared], tmp_path: Path
) -> None:
    cfg, store, p = prepared
    layout = stages.RunLayout(store, "wiring")
    _model, tokenizer = load_model_and_tokenizer(p.checkpoint_uri)
    rows_uri = _store_rows(_rows(tokenizer), "/elsewhere/ckpt", layout.rollout(0), tmp_path)
    with pytest.raises(stages.StageError, match="PPO must update the policy that sampled"):
        stages.train(cfg, p.checkpoint_uri, rows_uri, layout.checkpoint(0))


def test_rollout_refuses_a_checkpoint_of_another_round(
    prepared: tuple[Config, str, stages.Prepared],
) -> None:
    cfg, store, p = prepared
    with pytest.raises(stages.StageError, match="trained for 0 iteration"):
        stages.rollout(cfg, p.checkpoint_uri, p.tasks_uri, 3, f"{store}/r/rollouts/x")


def test_rollout_writes_rows_with_advantages_and_metrics(
    prepared: tuple[Config, str, stages.Prepared],
) -> None:
    from envace.rollout.io import read_rows

    cfg, store, p = prepared
    out = stages.RunLayout(store, "ro").rollout(0)
    result = stages.rollout(cfg, p.checkpoint_uri, p.tasks_uri, 0, out)
    assert result.uri == out
    verify(out, deep=True)
    rows = read_rows(Path(out))
    assert len(rows) == result.metrics["rows/caller"] + result.metrics["rows/simulator"] > 0
    assert all(r.advantage is not None for r in rows)
    meta = json.loads((Path(out) / stages.ROLLOUT_META).read_text())
    assert meta["checkpoint"] == p.checkpoint_uri and meta["iteration"] == 0
    assert meta["metrics"]["iteration"] == 1
    assert not (Path(out) / stages.EPISODES).exists()  # train.save_rollouts: off by default
    # on: the round's episodes committed beside the rows, one per trajectory the rows came from
    kept = stages.RunLayout(store, "ro-kept").rollout(0)
    keep = copy.deepcopy(cfg)  # the fixture's config is shared
    keep.train.save_rollouts = True
    stages.rollout(keep, p.checkpoint_uri, p.tasks_uri, 0, kept)
    verify(kept, deep=True)  # in the manifest
    lines = (Path(kept) / stages.EPISODES).read_text().splitlines()
    episodes = [json.loads(x) for x in lines]
    assert len(episodes) == cfg.rollout.n * cfg.rollout.batch_tasks
    assert {e["traj_id"] for e in episodes} == {r.traj_id for r in read_rows(Path(kept))}
    assert all(e["rows"] and "advantage" in e["rows"][0] for e in episodes)


@pytest.mark.parametrize("mode", ["real", "external"])
def test_a_round_runs_in_every_rollout_mode(
    prepared: tuple[Config, str, stages.Prepared], micro: list[str], mode: str
) -> None:
    """Rollout then train through the store with the real worlds or a frozen simulator writing
    the tool results. The train step builds its trainer for updates only; it used to build a
    rollout engine too, which refused both modes (no world factory, no simulator)."""
    from envace.rollout.io import read_rows

    _, store, p = prepared
    cfg = load_config(
        None, [*micro, "warm_start.enabled=false", "train.iterations=2", f"rollout.mode={mode}"]
    )
    layout = stages.RunLayout(store, f"mode-{mode}")
    result = stages.rollout(cfg, p.checkpoint_uri, p.tasks_uri, 0, layout.rollout(0))
    rows = read_rows(Path(result.uri))
    assert rows and result.metrics["rows/caller"] > 0
    if mode == "real":  # the worlds wrote every tool result: nothing for the simulator to learn
        assert result.metrics["rows/simulator"] == 0 and all(r.role == Role.CALLER for r in rows)
    trained = stages.train(cfg, p.checkpoint_uri, result.uri, layout.checkpoint(0))
    assert trained.uri == layout.checkpoint(0)
    verify(trained.uri, deep=True)
    assert trained.metrics["policy/rows"] <= result.metrics["rows/caller"]


@pytest.mark.slow
def test_a_round_cannot_switch_train_engine(
    prepared: tuple[Config, str, stages.Prepared], tmp_path: Path, micro: list[str]
) -> None:
    """Round 1 with the DeepSpeed engine (one process, `envace pipeline train-step` as a
    subprocess: DeepSpeed's process group stays out of this test process) leaves its sharded
    optimizer state; a torch-engine round 2 from it is refused, naming the fix."""
    import subprocess
    import sys

    pytest.importorskip("deepspeed")
    _cfg, store, p = prepared
    cfg = load_config(None, [*micro, "train.engine=deepspeed"])
    layout = stages.RunLayout(store, "engine")
    _model, tokenizer = load_model_and_tokenizer(p.checkpoint_uri)
    rows_uri = _store_rows(_rows(tokenizer), p.checkpoint_uri, layout.rollout(0), tmp_path / "r0")
    (tmp_path / "config.yaml").write_text(stages.config_text(cfg))
    cmd = [sys.executable, "-m", "envace", "pipeline", "train-step"]
    cmd += ["--config", str(tmp_path / "config.yaml")]
    cmd += stages.train_step_args(p.checkpoint_uri, rows_uri, layout.checkpoint(0), 2)
    env = {**os.environ, "DS_BUILD_OPS": "0", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (Path(layout.checkpoint(0)) / "policy" / "deepspeed" / "state").is_dir()
    rows1 = _store_rows(_rows(tokenizer), layout.checkpoint(0), layout.rollout(1), tmp_path / "r1")
    torch_cfg = load_config(None, micro)
    with pytest.raises(ConfigError, match=r"keep train\.engine the same for every round"):
        stages.train(torch_cfg, layout.checkpoint(0), rows1, layout.checkpoint(1))


def test_torch_engine_refuses_a_multi_process_world(
    prepared: tuple[Config, str, stages.Prepared], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, store, p = prepared
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="WORLD_SIZE=4"):
        stages.train(cfg, p.checkpoint_uri, f"{store}/none", f"{store}/out")


@pytest.mark.slow
def test_evaluate_commits_metrics_report_and_trajectories(
    prepared: tuple[Config, str, stages.Prepared],
) -> None:
    cfg, store, p = prepared
    out = stages.RunLayout(store, "ev").evaluation
    result = stages.evaluate(cfg, p.checkpoint_uri, p.tasks_uri, out)
    assert {e.path for e in verify(out, deep=True).files} == {
        "metrics.json",
        "report.md",
        "trajectories.jsonl",
    }
    stored = json.loads((Path(out) / "metrics.json").read_text())
    assert stored["n_tasks"] == result.metrics["n_tasks"] == 2
    assert 0.0 <= stored["success_rate"] <= 1.0
    assert stored["checkpoint"] == p.checkpoint_uri
    assert result.report == (Path(out) / "report.md").read_text()
    assert result.report.startswith("# EnvACE evaluation")
    assert "| success_rate |" in result.report and p.checkpoint_uri in result.report
    assert len((Path(out) / "trajectories.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["parallel:2", "sequential:2"])
def test_evaluate_with_test_time_rehearsal_reports_the_gain_and_the_mode(
    prepared: tuple[Config, str, stages.Prepared], spec: str
) -> None:
    from kfp.dsl import Metrics

    cfg, store, p = prepared
    plain = stages.evaluate(cfg, p.checkpoint_uri, p.tasks_uri, f"{store}/plain-{spec[0]}")
    assert not any(k.startswith("rehearsal/") for k in plain.metrics)
    assert "Test-time rehearsal: none" in plain.report
    out = stages.RunLayout(store, f"ev-{spec.replace(':', '-')}").evaluation
    result = stages.evaluate(cfg, p.checkpoint_uri, p.tasks_uri, out, rehearsal=spec)
    # The committed execution without notes is the same as without the parameter.
    assert {k: v for k, v in result.metrics.items() if not k.startswith("rehearsal/")} == (
        plain.metrics
    )
    mode = spec.split(":")[0]
    m = result.metrics
    assert (m["rehearsal/mode"], m["rehearsal/n"], m["rehearsal/n_tasks"]) == (mode, 2, 2)
    assert m["rehearsal/success_without"] == m["success_rate"]
    assert 0.0 <= m["rehearsal/success_with"] <= 1.0
    assert m["rehearsal/gain"] == pytest.approx(
        m["rehearsal/success_with"] - m["rehearsal/success_without"]
    )
    # the tiny model generates tokens in its imagined attempts (and in its notes)
    assert m["rehearsal/extra_tokens"] > 0 and m["rehearsal/extra_generations"] > 0
    assert m["rehearsal/extra_tokens_per_task"] == m["rehearsal/extra_tokens"] / 2
    stored = json.loads((Path(out) / "metrics.json").read_text())
    assert stored["rehearsal/success_with"] == m["rehearsal/success_with"]
    assert {e.path for e in verify(out, deep=True).files} == {
        "metrics.json",
        "report.md",
        "trajectories.jsonl",
        "rehearsal/metrics.json",
        "rehearsal/trajectories.jsonl",
        "rehearsal/memories.jsonl",
    }
    with_notes = json.loads((Path(out) / "rehearsal" / "metrics.json").read_text())
    assert with_notes["n_tasks"] == 2 and with_notes["config"]["mode"] == mode
    lines = (Path(out) / "rehearsal" / "memories.jsonl").read_text().splitlines()
    memories = [json.loads(x) for x in lines]
    # one condensation (parallel) or two (sequential) before every committed turn reached,
    # each after its own imagined attempts
    per_turn = 1 if mode == "parallel" else 2
    assert len(memories) == 2
    for r in memories:
        turns, rest = divmod(len(r["notes_per_step"]), per_turn)
        assert turns >= 1 and rest == 0 and len(r["attempts"]) == 2 * turns
    # The report names the mode and gives the figures.
    assert result.report == (Path(out) / "report.md").read_text()
    assert f"## Test-time rehearsal: {spec}" in result.report
    assert f"Rehearsal {spec}, notes of at most 96 tokens." in result.report
    assert "| rehearsal/success_with |" in result.report
    assert "| rehearsal/extra_tokens |" in result.report
    # The KFP Metrics artifact gets the numeric rehearsal figures (not the mode's name).
    artifact = Metrics(name="metrics", uri=str(Path(out) / "kfp-metrics"))
    logged = stages.log_kfp_metrics(artifact, result.metrics)
    assert logged["rehearsal/extra_tokens"] == m["rehearsal/extra_tokens"]
    assert "rehearsal/success_with" in logged and "rehearsal/mode" not in logged


@pytest.mark.parametrize("spec", ["parallel", "parallel:0", "parallel:x", "best-of:3", "4"])
def test_evaluate_refuses_a_bad_rehearsal_spec_before_loading_anything(
    tmp_path: Path, micro_cfg: Config, spec: str
) -> None:
    out = tmp_path / "evaluation"
    # Neither the checkpoint nor the tasks exist: the spec is checked first, so its error shows.
    with pytest.raises(UserInputError) as caught:
        stages.evaluate(
            micro_cfg,
            str(tmp_path / "no-ckpt"),
            str(tmp_path / "no-tasks"),
            str(out),
            rehearsal=spec,
        )
    message = str(caught.value)
    assert message.startswith(f"rehearsal {spec!r}")
    assert "`eval_rehearsal`" in message
    assert "parallel:N or sequential:N" in message and "empty for no test-time rehearsal" in message
    assert not out.exists()


@pytest.mark.parametrize("spec", [None, "", "  "])
def test_an_empty_rehearsal_spec_means_none(spec: str | None) -> None:
    assert stages.evaluation_rehearsal(spec) is None
    rcfg = stages.evaluation_rehearsal(" sequential:3 ")
    assert rcfg is not None and (rcfg.mode, rcfg.n, rcfg.memory_tokens) == ("sequential", 3, 96)


@pytest.mark.slow
def test_evaluate_component_passes_its_rehearsal_parameter_to_the_stage(
    prepared: tuple[Config, str, stages.Prepared],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kfp.dsl import Artifact, Dataset, Markdown, Metrics, Model

    from pipelines.components.evaluate import evaluate as component

    cfg, store, p = prepared
    monkeypatch.setenv("ENVACE_S3_ENDPOINT", "unset")  # the component sets it; restored after
    model = Model(name="model", uri=str(tmp_path / "model"))
    tasks = Dataset(name="tasks", uri=str(tmp_path / "tasks"))
    stages.point_artifact(model, p.checkpoint_uri)
    stages.point_artifact(tasks, p.tasks_uri)
    metrics = Metrics(name="metrics", uri=str(tmp_path / "metrics"))
    report = Markdown(name="report", uri=str(tmp_path / "report.md"))
    results = Artifact(name="results", uri=str(tmp_path / "results"))
    component.python_func(
        config=stages.config_struct(cfg),
        store=store,
        store_endpoint="http://store.invalid:9000",
        run_id="component",
        model=model,
        tasks=tasks,
        metrics=metrics,
        report=report,
        results=results,
        rehearsal="parallel:1",
    )
    uri = stages.artifact_uri(results)
    assert uri == stages.RunLayout(store, "component").evaluation
    assert "rehearsal/extra_tokens" in metrics.metadata and "success_rate" in metrics.metadata
    text = (tmp_path / "report.md").read_text()
    assert "## Test-time rehearsal: parallel:1" in text
    assert text == (Path(uri) / "report.md").read_text()
