"""`train.master_weights`: the torch engine's float32 master copies of bf16 trainable weights, on
the 2-layer test-micro model cast to bfloat16. The gradients are set by hand (fixed bf16
tensors), so the engine's optimizer is compared step for step with a float32 AdamW on the same
values: with masters the bf16 model holds the float32 run's weights rounded, without them small
steps are lost. Also the resume (the exact masters come back) and its error."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from envace.errors import ConfigError
from envace.train.engine import TorchEngine

LR = 1e-5  # half a bf16 ulp of any weight above ~0.0026: most of the micro model's weights


@pytest.fixture
def bf16_model(micro_model: Any) -> Any:
    return copy.deepcopy(micro_model).to(torch.bfloat16)


def _grads(model: Any, step: int) -> list[torch.Tensor]:
    """Fixed bf16 gradients for `step`, one per trainable parameter (same sign every step)."""
    g = torch.Generator().manual_seed(step)
    return [
        (torch.rand(p.shape, generator=g) + 0.5).to(torch.bfloat16)
        for p in model.parameters()
        if p.requires_grad
    ]


def _engine_steps(engine: TorchEngine, steps: range) -> None:
    trained = [p for p in engine.model.parameters() if p.requires_grad]
    for s in steps:
        for p, g in zip(trained, _grads(engine.model, s), strict=True):
            p.grad = g.clone()
        engine.step()


def _reference(model: Any, steps: int) -> list[torch.Tensor]:
    """float32 AdamW (the engine's settings) from the bf16 weights, on the same gradients."""
    params = [p.detach().float().requires_grad_() for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR,
        betas=(0.9, 0.999),
    )
    for s in range(steps):
        for p, g in zip(params, _grads(model, s), strict=True):
            p.grad = g.float()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return [p.detach() for p in params]


def _changed(model: Any, before: list[torch.Tensor]) -> float:
    now = [p.detach() for p in model.parameters() if p.requires_grad]
    moved = sum(int((a != b).sum()) for a, b in zip(now, before, strict=True))
    return moved / sum(int(b.numel()) for b in before)


def test_masters_give_the_float32_run_rounded(bf16_model: Any) -> None:
    before = [p.detach().clone() for p in bf16_model.parameters()]
    expected = _reference(bf16_model, 20)
    engine = TorchEngine(bf16_model, LR)
    assert len(engine.masters) == len(before)
    assert all(m.dtype == torch.float32 for _, m in engine.masters)
    _engine_steps(engine, range(20))
    for (p, m), ref in zip(engine.masters, expected, strict=True):
        assert p.dtype == torch.bfloat16
        torch.testing.assert_close(m, ref, rtol=0, atol=0)
        assert torch.equal(p, ref.to(torch.bfloat16))
    # 20 steps of ~1e-5 move nearly every weight once accumulated in float32
    assert _changed(bf16_model, before) > 0.9


def test_without_masters_small_steps_are_lost(bf16_model: Any) -> None:
    """The failure mode the masters fix: each step is rounded away on its own."""
    before = [p.detach().clone() for p in bf16_model.parameters()]
    engine = TorchEngine(bf16_model, LR, master_weights=False)
    assert engine.masters == []
    _engine_steps(engine, range(20))
    assert _changed(bf16_model, before) < 0.5


def test_float32_model_has_no_masters(micro_model: Any) -> None:
    model = copy.deepcopy(micro_model)
    engine = TorchEngine(model, LR)
    assert engine.masters == []
    optimized = {id(p) for g in engine.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for p in model.parameters()}


def test_resume_restores_the_exact_masters(bf16_model: Any) -> None:
    """A resumed run loads the rounded bf16 weights; the saved masters put the exact values back
    and the next steps match the uninterrupted run bit for bit."""
    resumed_model = copy.deepcopy(bf16_model)
    engine = TorchEngine(bf16_model, LR)
    _engine_steps(engine, range(10))
    state = copy.deepcopy(engine.state_dict())
    saved_weights = {k: v.clone() for k, v in bf16_model.state_dict().items()}
    assert len(state["master_weights"]) == len(engine.masters)
    _engine_steps(engine, range(10, 15))

    resumed_model.load_state_dict(saved_weights)
    resumed = TorchEngine(resumed_model, LR)
    resumed.load_state_dict(state)
    for (_, m), saved in zip(resumed.masters, state["master_weights"], strict=True):
        assert torch.equal(m, saved)
    _engine_steps(resumed, range(10, 15))
    for a, b in zip(resumed_model.parameters(), bf16_model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_resume_with_other_master_weights_setting_is_refused(bf16_model: Any) -> None:
    state = TorchEngine(copy.deepcopy(bf16_model), LR).state_dict()
    plain = TorchEngine(bf16_model, LR, master_weights=False)
    with pytest.raises(ConfigError, match=r"train\.master_weights: the checkpoint holds \d+"):
        plain.load_state_dict(state)
