"""A diverged update (nan/inf) stops the run with a clear error before anything non-finite is
sampled from or saved as a committed checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from envace.config import load_config
from envace.errors import TrainingDiverged
from envace.policy.tiny import build_tiny_model, save_checkpoint
from envace.run import run_main
from envace.train.engine import TorchEngine, require_finite_weights
from tests.helpers.micro import MICRO


def test_nan_parameter_is_named(micro_model: Any) -> None:
    require_finite_weights(micro_model, "the model")  # finite: passes
    model = micro_model
    saved = model.model.norm.weight.detach().clone()
    try:
        with torch.no_grad():
            model.model.norm.weight[0] = float("inf")
        with pytest.raises(TrainingDiverged, match=r"parameter model\.norm\.weight of the model"):
            require_finite_weights(model, "the model")
    finally:
        with torch.no_grad():
            model.model.norm.weight.copy_(saved)


def test_overflowed_gradient_is_not_applied(tiny_tokenizer: Any) -> None:
    """A nan gradient: step reports the nan norm and changes no weight."""
    model = build_tiny_model(tiny_tokenizer, "test-micro")
    engine = TorchEngine(model, 1e-3)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    norm = engine.step()
    assert norm != norm  # nan, reported as such; the step is dropped
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
        assert p.grad is None


def test_run_from_nan_weights_stops_before_saving(tmp_path: Path) -> None:
    """A checkpoint with a nan weight: the warm start's first loss is nan -> a clear error, and
    no warm-start checkpoint is written."""
    from envace.policy.hf_backend import load_model_and_tokenizer

    first = tmp_path / "first"  # the micro run's own tokenizer (its gold replays fit the limits)
    run_main(load_config(None, [*MICRO, "train.iterations=0", "warm_start.enabled=false"]), first)
    model, tokenizer = load_model_and_tokenizer(first / "checkpoints" / "init")
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    ckpt = save_checkpoint(model, tokenizer, tmp_path / "nan-ckpt")
    out = tmp_path / "run"
    cfg = load_config(None, [*MICRO, f"model.path={ckpt}", "train.iterations=1"])
    with pytest.raises(TrainingDiverged, match="the warm-start loss at step 1 is nan"):
        run_main(cfg, out)
    assert not (out / "checkpoints" / "warm_start").exists()
