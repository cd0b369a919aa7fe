"""One PPO pass needs no separate old-log-prob forward: it lands on the same weights."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from envace.config import load_config
from envace.policy.chat import ChatRenderer
from envace.rollout.grading import TaskGrader
from envace.run import RunPaths, init_model, load_splits, model_policy, prepare_tasks
from envace.train.learners import make_engine
from envace.train.rl import RLTrainer, RoleLearner
from tests.helpers.micro import MICRO


def _trainer(cfg: Any, model: Any, tok: Any, tasks: Any) -> tuple[RLTrainer, Any]:
    engine = make_engine(cfg, model, cfg.train.iterations)
    learner = RoleLearner(engine, frozenset({"caller", "simulator"}), ChatRenderer(tok).pad_id)
    return RLTrainer(cfg, tasks, model_policy(model, tok, cfg), [learner], TaskGrader()), engine


def _signed_rows(cfg: Any, tmp_path: Path) -> tuple[Any, Any, Any, list[Any]]:
    """A random micro model, its tokenizer and tasks, and one rollout's rows with alternating
    advantages (a random model earns no reward: this gives the rows a signal)."""
    paths = RunPaths(tmp_path, str(tmp_path))
    prepare_tasks(cfg, paths)
    splits = load_splits(paths.tasks)
    model, tok = init_model(cfg, splits, tmp_path / "init")
    trainer, _ = _trainer(cfg, copy.deepcopy(model), tok, splits.train)
    rows, _ = trainer.collect(0)
    for i, r in enumerate(rows):
        r.advantage = 1.0 if i % 2 else -1.0
    return model, tok, splits, rows


def _record_first_step(engine: Any) -> dict[str, torch.Tensor]:
    """A dict that the engine's first optimizer step fills with the weights it leaves."""
    after_first: dict[str, torch.Tensor] = {}
    step = engine.step

    def snapshot() -> float:
        norm = step()
        if not after_first:
            after_first.update({k: v.clone() for k, v in engine.model.state_dict().items()})
        return norm

    engine.step = snapshot
    return after_first


def test_one_pass_uses_its_own_forward_as_the_old_logprobs(tmp_path: Path) -> None:
    """ppo_epochs=1 runs one forward per micro-batch (the old log-probs are that forward's,
    detached: no step comes before the pass ends) and ends on exactly the weights that the
    first pass of a 2-pass update reaches, which computes the old log-probs first."""
    cfg1 = load_config(None, [*MICRO, "train.micro_batch_rows=2"])
    cfg2 = load_config(None, [*MICRO, "train.micro_batch_rows=2", "train.ppo_epochs=2"])
    model, tok, splits, rows = _signed_rows(cfg1, tmp_path)
    one, engine1 = _trainer(cfg1, copy.deepcopy(model), tok, splits.train)
    assert sum(1 for r in rows if r.trainable) >= 4

    calls = {"n": 0}
    forward = engine1.logprobs

    def counting(mb: Any) -> Any:
        calls["n"] += 1
        return forward(mb)

    engine1.logprobs = counting  # type: ignore[method-assign]
    stats = one.update(rows)
    micro_batches = -(-int(stats["policy/sequences"]) // 2)  # packed caller rows: 1 sequence
    assert calls["n"] == micro_batches  # no second pass over the batch
    assert stats["policy/rollout_logprob_diff"] < 1e-5  # sampled by these very weights

    two, engine2 = _trainer(cfg2, copy.deepcopy(model), tok, splits.train)
    after_first = _record_first_step(engine2)
    two.update(rows)
    got = engine1.model.state_dict()
    assert any(not torch.equal(got[k], model.state_dict()[k]) for k in got)  # it trained
    for k, v in after_first.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=1e-6)


def test_a_token_budget_splits_the_micro_batches_not_the_update(tmp_path: Path) -> None:
    """`train.micro_batch_tokens` caps each forward/backward's padded tokens: more, smaller
    micro-batches, each weighted by its share of the batch, and the same weights after the
    update as with rows-only micro-batches."""
    cfg_rows = load_config(None, [*MICRO, "train.micro_batch_rows=8"])
    cfg_tokens = load_config(
        None, [*MICRO, "train.micro_batch_rows=8", "train.micro_batch_tokens=64"]
    )
    model, tok, splits, rows = _signed_rows(cfg_rows, tmp_path)
    results = []
    for cfg in (cfg_rows, cfg_tokens):
        trainer, engine = _trainer(cfg, copy.deepcopy(model), tok, splits.train)
        shapes: list[tuple[int, int]] = []
        forward = engine.logprobs

        def recording(mb: Any, forward: Any = forward, shapes: Any = shapes) -> Any:
            shapes.append(tuple(mb.input_ids.shape))
            return forward(mb)

        engine.logprobs = recording  # type: ignore[method-assign]
        stats = trainer.update(rows)
        results.append((shapes, stats["policy/loss"], engine.model.state_dict()))
    (by_rows_shapes, loss_rows, by_rows), (by_tokens_shapes, loss_tokens, by_tokens) = results
    assert len(by_tokens_shapes) > len(by_rows_shapes)
    assert all(b * t <= 64 or b == 1 for b, t in by_tokens_shapes)  # the budget, or one row
    assert any(b * t > 64 for b, t in by_rows_shapes)  # without it, more padded tokens at once
    assert loss_tokens == pytest.approx(loss_rows, abs=1e-6)
    for k, v in by_rows.items():
        torch.testing.assert_close(by_tokens[k], v, rtol=0, atol=1e-4)  # Adam: rounding


def test_the_update_scores_rows_at_the_temperature_they_were_sampled_at(tmp_path: Path) -> None:
    """Rows sampled at `rollout.temperature` 0.7 are scored by the update at 0.7 (logits / T,
    as verl's actor): its log-probs equal those the rollout recorded, where an update at
    temperature 1 (what it did before) is far from them."""
    cool = load_config(None, [*MICRO, "train.micro_batch_rows=2", "rollout.temperature=0.7"])
    warm = load_config(None, [*MICRO, "train.micro_batch_rows=2"])
    model, tok, splits, rows = _signed_rows(cool, tmp_path)
    assert rows and all(r.trainable for r in rows if r.advantage is not None)
    at_07, _ = _trainer(cool, copy.deepcopy(model), tok, splits.train)
    at_1, _ = _trainer(warm, copy.deepcopy(model), tok, splits.train)
    same = at_07.update(rows)["policy/rollout_logprob_diff"]
    other = at_1.update(rows)["policy/rollout_logprob_diff"]
    assert same < 1e-5, same
    assert other > 100 * max(same, 1e-6), (same, other)
