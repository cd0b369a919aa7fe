"""`train.ppo_mini_batches`: each PPO pass cut into mini-batches of whole tasks, one optimizer
step each (verl's ppo_mini_batch_size), and the lr schedule counting those steps."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from envace.config import load_config
from envace.errors import ConfigError
from envace.rollout.types import Role, Row
from envace.train.batch import mini_batches
from envace.train.learners import make_engine
from tests.helpers.micro import MICRO
from tests.train.test_ppo_pass import _record_first_step, _signed_rows, _trainer


def _row(uid: str, role: Role, traj: str) -> Row:
    return Row(role, uid, traj, 0, 0, [1, 2], [3], [-0.5], "stop", True, True)


def test_mini_batches_keep_each_task_whole_and_in_order() -> None:
    rows = [
        _row(uid, role, f"{uid}-{n}")
        for uid in ("a", "b", "c", "d", "e")
        for n in range(2)
        for role in (Role.CALLER, Role.SIMULATOR)
    ]
    parts = mini_batches(rows, 2)
    assert [sorted({r.uid for r in p}) for p in parts] == [["a", "b"], ["c", "d", "e"]]
    assert [r for p in parts for r in p] == rows  # nothing lost, nothing repeated
    assert len(mini_batches(rows, 9)) == 5  # never more mini-batches than tasks
    assert mini_batches(rows, 1) == [rows]


def test_each_mini_batch_takes_its_own_step(tmp_path: Path) -> None:
    """Two mini-batches: two optimizer steps, and the first lands on exactly the weights that a
    one-step update of the first mini-batch's rows alone reaches (each step is its own
    mini-batch's mean loss; old log-probs come from the weights before any step)."""
    over = [*MICRO, "train.micro_batch_rows=2"]
    cfg1 = load_config(None, over)
    cfg2 = load_config(None, [*over, "train.ppo_mini_batches=2"])
    model, tok, splits, rows = _signed_rows(cfg1, tmp_path)
    first = mini_batches([r for r in rows if r.trainable], 2)[0]
    assert {r.uid for r in first} != {r.uid for r in rows if r.trainable}

    plain, engine1 = _trainer(cfg1, copy.deepcopy(model), tok, splits.train)
    plain.update(first)
    split, engine2 = _trainer(cfg2, copy.deepcopy(model), tok, splits.train)
    after_first = _record_first_step(engine2)
    stats = split.update(rows)
    assert stats["policy/optimizer_steps"] == 2.0
    assert stats["policy/rollout_logprob_diff"] < 1e-5  # old log-probs: the sampling weights
    got = engine1.model.state_dict()
    assert any(not torch.equal(got[k], model.state_dict()[k]) for k in got)  # it trained
    for k, v in after_first.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=1e-6)
    moved = engine2.model.state_dict()
    assert any(not torch.equal(moved[k], after_first[k]) for k in moved)  # the second step


def test_the_lr_schedule_spans_every_optimizer_step() -> None:
    """3 iterations x 2 passes x 2 mini-batches = 12 steps: a linear schedule reaches 0 at the
    12th step, not before (a schedule over passes alone would end at the 6th)."""
    cfg = load_config(
        None,
        [
            *MICRO,
            "train.iterations=3",
            "train.ppo_epochs=2",
            "train.ppo_mini_batches=2",
            "train.lr_schedule=linear",
            "train.lr=0.1",
        ],
    )
    assert cfg.train.steps_per_iteration == 4
    model = torch.nn.Linear(2, 1)
    engine = make_engine(cfg, model, cfg.train.iterations)
    lrs = []
    for _ in range(12):
        model(torch.ones(1, 2)).sum().backward()
        engine.step()
        lrs.append(engine.lr)
    assert lrs[5] > 0.0 and lrs[10] > 0.0
    assert lrs[11] == pytest.approx(0.0)


def test_more_mini_batches_than_tasks_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"train\.ppo_mini_batches.*rollout\.batch_tasks = 2"):
        load_config(None, [*MICRO, "train.ppo_mini_batches=3"])
