"""The trained models, engines and trainer state: one implementation for `envace run` and the
pipeline's train step (the settings that used to drift between the two are checked here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from envace.config import load_config
from envace.errors import ConfigError
from envace.train import learners as learners_mod
from envace.train.engine import TorchEngine
from envace.train.learners import (
    Learner,
    build_learners,
    make_engine,
    restore_learners,
    role_learners,
    trainer_state,
)
from tests.helpers.micro import MICRO


@pytest.fixture()
def new_model(tiny_tokenizer: Any) -> Any:
    from envace.policy.tiny import build_tiny_model

    return lambda: build_tiny_model(tiny_tokenizer, "test-micro", seed=0)


def test_gradient_checkpointing_applies_to_the_torch_engine(new_model: Any) -> None:
    cfg = load_config(None, [*MICRO, "model.gradient_checkpointing=true"])
    model = new_model()
    engine = make_engine(cfg, model, cfg.train.iterations)
    assert isinstance(engine, TorchEngine) and model.is_activation_checkpointing
    plain = new_model()
    make_engine(load_config(None, MICRO), plain, 1)
    assert not plain.is_activation_checkpointing


def test_both_orchestrations_build_their_learners_here() -> None:
    """`envace run` and the pipeline's train step share one engine factory, learner set and
    trainer state (by construction: neither module defines its own)."""
    import envace.run.loop as run
    import envace.stages.steps as stages

    for module in (run, stages):
        assert module.build_learners is learners_mod.build_learners
        assert module.trainer_state is learners_mod.trainer_state
        assert module.restore_learners is learners_mod.restore_learners
        for old in ("_engine", "_make_engine", "_learners", "_simulator", "_restore_engine"):
            assert not hasattr(module, old), (module.__name__, old)


def test_noshare_trains_a_simulator_of_its_own(new_model: Any) -> None:
    cfg = load_config(None, [*MICRO, "algo.sharing=noshare"])
    policy = new_model()
    found = build_learners(cfg, policy, None, 2)
    assert [lr.name for lr in found] == ["policy", "simulator"]
    assert found[1].model is not policy
    roles = role_learners(found, pad_id=0)
    assert [sorted(r.roles) for r in roles] == [["caller"], ["simulator"]]
    shared = build_learners(load_config(None, MICRO), policy, None, 2)
    assert [lr.name for lr in shared] == ["policy"]
    assert sorted(role_learners(shared, 0)[0].roles) == ["caller", "simulator"]


def test_trainer_state_round_trips_and_a_foreign_engine_is_refused(
    tmp_path: Path, new_model: Any
) -> None:
    cfg = load_config(None, MICRO)
    first = build_learners(cfg, new_model(), None, 2)
    state = trainer_state(7, first)
    expected = torch.rand(3)  # what an unbroken run draws next
    torch.rand(5)
    again = build_learners(cfg, new_model(), None, 2)
    assert restore_learners(again, state, tmp_path, "ckpt") == 7
    assert torch.equal(torch.rand(3), expected)
    (tmp_path / "policy" / "deepspeed").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"another train\.engine"):
        restore_learners(again, state, tmp_path, "ckpt")


@pytest.mark.slow
def test_resume_keeps_model_dtype(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh and a resumed run both train in `model.dtype` (the resume used to load the
    policy in float32 first; the tiny presets ignored the setting)."""
    from envace import run
    from envace.run import main

    seen: list[torch.dtype] = []
    real = run.rl_stage

    def spy(ctx: run.RunContext, *args: Any, **kw: Any) -> Any:
        seen.append(next(ctx.model.parameters()).dtype)
        return real(ctx, *args, **kw)

    monkeypatch.setattr(main, "rl_stage", spy)  # where run_main looks it up
    out = tmp_path / "run"
    over = [*MICRO, "model.dtype=bfloat16", "train.save_every=1", "warm_start.enabled=false"]
    run.run_main(load_config(None, [*over, "train.iterations=1"]), out)
    summary = run.run_main(load_config(None, [*over, "train.iterations=2"]), out, resume=True)
    assert summary["resumed_from"].endswith("iter_000001")
    assert seen == [torch.bfloat16, torch.bfloat16]
    lines = (out / "metrics.jsonl").read_text().splitlines()
    iterations = [json.loads(x)["iteration"] for x in lines]
    assert iterations == [1, 2]


@pytest.mark.slow
def test_a_resumed_external_run_keeps_the_rl_start_as_its_simulator(tmp_path: Path) -> None:
    """rollout.mode external without an endpoint or model: the frozen simulator is the policy
    as RL started (the warm start), in a fresh and in a resumed run alike, as the pipeline's
    rollout step reads it (`rl_start`). The resume used to freeze the resumed checkpoint's
    policy, one that had trained already."""
    from safetensors.torch import load_file

    from envace import run
    from envace.run import loop

    frozen: list[dict[str, torch.Tensor]] = []
    real = run.tool_results

    def spy(*args: Any) -> Any:
        sources = real(*args)
        weights = sources.simulator.backend.model.state_dict()
        frozen.append({k: v.detach().clone() for k, v in weights.items()})
        return sources

    out = tmp_path / "run"
    over = [*MICRO, "rollout.mode=external", "train.save_every=1"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loop, "tool_results", spy)  # where rl_stage looks it up
        run.run_main(load_config(None, [*over, "train.iterations=1"]), out)
        summary = run.run_main(load_config(None, [*over, "train.iterations=2"]), out, resume=True)
    assert summary["resumed_from"].endswith("iter_000001")
    ws = load_file(str(out / "checkpoints" / "warm_start" / "model.safetensors"))
    trained = load_file(
        str(out / "checkpoints" / "rl" / "iter_000001" / "policy" / "model.safetensors")
    )
    assert any(not torch.equal(ws[k], trained[k]) for k in ws)  # RL moved the policy
    assert len(frozen) == 2
    for weights in frozen:
        for key, tensor in ws.items():
            assert torch.equal(weights[key], tensor), key


def test_learner_is_a_named_triple(new_model: Any) -> None:
    model = new_model()
    engine = make_engine(load_config(None, MICRO), model, 1)
    lr = Learner("policy", model, engine)
    assert (lr.name, lr.model, lr.engine) == ("policy", model, engine)


def test_a_warm_start_of_zero_epochs_trains_nothing(tmp_path: Path) -> None:
    from envace.run import run_main

    cfg = load_config(None, [*MICRO, "warm_start.epochs=0", "train.iterations=0"])
    summary = run_main(cfg, tmp_path / "run")
    stages = json.loads((tmp_path / "run" / "stages.json").read_text())
    assert stages["warm_start_training"]["steps"] == 0
    # the warm-started policy is the initial one: the same held-out figures
    assert summary["stages"]["warm_start"] == summary["stages"]["untrained"]
