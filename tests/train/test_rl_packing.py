"""Packed RL rows: a trajectory's caller turns as one sequence give exactly the unpacked update.

The reference is the same trainer with packing turned off (`pack_prefix_rows` replaced by the
identity), on the same rollout rows, so every row is its own sequence as before packing. Two PPO
passes with a large plain-SGD step make the second pass clip (and dual-clip) and, with
kl_coef > 0, move the policy off its reference; each pass's gradients are compared.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
import torch

from envace.config import load_config
from envace.policy.chat import ChatRenderer
from envace.rollout.grading import TaskGrader
from envace.rollout.types import Role, Row
from envace.run import RunPaths, init_model, load_splits, model_policy, prepare_tasks
from envace.train import batch
from envace.train.batch import MicroBatch, pack_trajectories
from envace.train.engine import TorchEngine
from envace.train.rl import RLTrainer, RoleLearner
from tests.helpers.micro import MICRO

SETS = [
    *MICRO,
    "rollout.batch_tasks=2",
    "train.micro_batch_rows=2",  # several micro-batches, cut differently packed and unpacked
    "train.ppo_epochs=2",
    "algo.clip_low=0.05",
    "algo.clip_high=0.05",
    "algo.dual_clip=1.2",
]
ADVANTAGES = [1.0, -0.5, 0.25, -1.0, 0.75, -2.0]  # cycled: a trajectory's spans differ


class RecordingSGD(TorchEngine):
    """The torch engine taking plain SGD steps and recording each step's gradients and each
    forward's real tokens (SGD, not Adam: Adam's first step is ~lr * sign(grad), which turns
    rounding in near-zero gradients into visible weight changes)."""

    def __init__(self, model: Any, lr: float) -> None:
        super().__init__(model, lr)
        self.sgd_lr = lr
        self.grads: list[dict[str, torch.Tensor]] = []
        self.forward_tokens = 0

    def logprobs(self, mb: MicroBatch) -> torch.Tensor:
        self.forward_tokens += int(mb.attention_mask.sum())
        return super().logprobs(mb)

    def step(self) -> float:
        grads = {n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None}
        self.grads.append(grads)
        with torch.no_grad():
            for p in self.model.parameters():
                if p.grad is not None:
                    p -= self.sgd_lr * p.grad
        self.model.zero_grad(set_to_none=True)
        return float(torch.stack([g.norm() for g in grads.values()]).norm())


@pytest.fixture(scope="module")
def rollout(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, Any, list[Row]]:
    """A random micro model, its tokenizer and tasks, and one rollout's trainable rows with
    fixed advantages, plus two simulator rows (a random model calls no tool): one whose prompt
    extends a caller row's prompt + response, which must still not be packed with it."""
    tmp = tmp_path_factory.mktemp("packing")
    cfg = load_config(None, SETS)
    paths = RunPaths(tmp, str(tmp))
    prepare_tasks(cfg, paths)
    splits = load_splits(paths.tasks)
    model, tok = init_model(cfg, splits, tmp / "init")
    trainer = _trainer(cfg, tok, RecordingSGD(copy.deepcopy(model), 0.0))
    trainer.tasks = list(splits.train)
    rows = [r for r in trainer.collect(0)[0] if r.trainable]
    first = rows[0]
    for k, prompt in enumerate((first.prompt_ids + first.response_ids + [7, 8], [5, 6, 7])):
        sim = copy.copy(first)
        sim.role, sim.prompt_ids, sim.response_ids = Role.SIMULATOR, prompt, [9, 10 + k, 11]
        sim.logprobs = [-1.0, -2.0, -3.0]
        rows.insert(1, sim)
    for i, r in enumerate(rows):
        r.advantage = ADVANTAGES[i % len(ADVANTAGES)]
    return model, tok, splits, rows


def _trainer(cfg: Any, tok: Any, engine: RecordingSGD) -> RLTrainer:
    learner = RoleLearner(engine, frozenset({"caller", "simulator"}), ChatRenderer(tok).pad_id)
    return RLTrainer(cfg, [], model_policy(engine.model, tok, cfg), [learner], TaskGrader())


def _update(cfg: Any, rollout: Any, lr: float) -> tuple[dict[str, float], RecordingSGD]:
    model, tok, _, rows = rollout
    engine = RecordingSGD(copy.deepcopy(model), lr)
    stats = _trainer(cfg, tok, engine).update(rows)
    return stats, engine


@pytest.mark.parametrize("kl_coef", [0.0, 0.5])
@pytest.mark.parametrize("agg", ["seq-mean-token-mean", "token-mean"])
def test_packed_caller_rows_give_the_unpacked_loss_gradients_and_stats(
    rollout: Any, agg: str, kl_coef: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(None, [*SETS, f"algo.loss_agg_mode={agg}", f"algo.kl_coef={kl_coef}"])
    rows = rollout[3]
    lr = 10.0  # a big step: the second pass clips, dual-clips and leaves the reference
    packed, packed_engine = _update(cfg, rollout, lr)
    with monkeypatch.context() as m:
        m.setattr(batch, "pack_prefix_rows", list)
        plain, plain_engine = _update(cfg, rollout, lr)

    p = {k.removeprefix("policy/"): v for k, v in packed.items()}
    u = {k.removeprefix("policy/"): v for k, v in plain.items()}
    assert p["rows"] == u["rows"] == len(rows)  # generations, however packed
    assert u["sequences"] == len(rows) > p["sequences"]
    assert p["update_tokens"] < u["update_tokens"]
    # Each pass's forward (plus the old-log-prob forward) runs on exactly these tokens.
    assert packed_engine.forward_tokens == 3 * p["update_tokens"]
    assert p["clip_frac"] > 0 and p["dual_clip_frac"] > 0  # the clip terms are exercised
    assert (p["kl"] > 1e-6) if kl_coef else ("kl" not in p)
    assert p.keys() == u.keys()
    for key in p.keys() - {"sequences", "update_tokens"}:
        assert p[key] == pytest.approx(u[key], rel=1e-4, abs=1e-6), key
    assert len(packed_engine.grads) == len(plain_engine.grads) == 2
    for step, (got, want) in enumerate(zip(packed_engine.grads, plain_engine.grads, strict=True)):
        assert got.keys() == want.keys()
        for name, grad in want.items():
            # summation order differs (one packed sequence vs rows, and with the thread count):
            # compare to the gradient's own scale, so near-zero entries do not decide
            scale = float(grad.abs().max())
            torch.testing.assert_close(
                got[name], grad, rtol=1e-4, atol=1e-4 * scale + 1e-12, msg=(step, name)
            )


def test_each_trajectorys_caller_rows_pack_and_simulator_rows_stay_alone(rollout: Any) -> None:
    rows = rollout[3]
    packed = pack_trajectories(rows)
    callers = [r for r in rows if r.role is Role.CALLER]
    trajectories = {r.traj_id for r in callers}
    assert len(callers) > len(trajectories)  # some trajectory has several caller turns
    caller_rows = [t for t in packed if t.role == "caller"]
    assert len(caller_rows) == len(trajectories)  # token-in / token-out: each packs whole
    assert sum(len(t.spans) for t in caller_rows) == len(callers)
    assert sorted(float(a or 0) for t in caller_rows for a in t.span_advantages) == sorted(
        float(r.advantage or 0) for r in callers
    )
    sims = [t for t in packed if t.role == "simulator"]
    assert len(sims) == 2 and all(not t.extra_spans for t in sims)


def test_packed_caller_rows_mark_the_observations_between_their_generations(rollout: Any) -> None:
    """`env_spans` tile the gaps of a packed row: generations and observations alternate and
    together cover everything after the first prompt."""
    packed = [t for t in pack_trajectories(rollout[3]) if t.role == "caller"]
    assert any(t.env_spans for t in packed)
    for t in packed:
        spans, env = t.spans, t.env_spans or []
        assert len(env) == len(spans) - 1
        pieces = sorted([*spans, *env])
        assert pieces[0][0] == spans[0][0] and pieces[-1][1] == t.length
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
        assert all(e > s for s, e in env)  # tool results / user turns and turn markers


@pytest.mark.parametrize("micro_batch_rows", [1, 16])
def test_echo_loss_is_the_observations_token_mean_cross_entropy(
    rollout: Any, micro_batch_rows: int
) -> None:
    """With every advantage 0 the policy loss has no gradient, so the update's gradient is
    ECHO's term alone: lambda x the token-mean cross-entropy of the observation tokens of the
    packed caller rows, computed here by hand with a plain forward per sequence — the same
    however the batch is cut into micro-batches."""
    model, tok, _, rows = rollout
    zero = [copy.copy(r) for r in rows]
    for r in zero:
        r.advantage = 0.0
    coef = 0.5
    cfg = load_config(
        None,
        [*SETS, f"train.micro_batch_rows={micro_batch_rows}", f"algo.env_loss_coef={coef}"],
    )
    engine = RecordingSGD(copy.deepcopy(model), 0.0)
    stats = _trainer(cfg, tok, engine).update(zero)

    ref = copy.deepcopy(model).float()
    total, count = torch.zeros(()), 0
    for t in pack_trajectories(zero):
        seq = torch.tensor([t.prompt_ids + t.response_ids])
        logp = ref(input_ids=seq).logits.float().log_softmax(-1)[0]
        for s, e in t.env_spans or []:
            pos = torch.arange(s, e)
            total = total - logp[pos - 1, seq[0, pos]].sum()
            count += e - s
    ce = total / count
    (coef * ce).backward()
    assert stats["policy/env_tokens"] == count > 0
    assert stats["policy/env_ce"] == pytest.approx(float(ce.detach()), rel=1e-4)
    got = engine.grads[0]
    for name, p in ref.named_parameters():
        if p.grad is None or name not in got:
            continue
        scale = float(p.grad.abs().max())
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-4 * scale + 1e-12)
    assert any(float(g.abs().max()) > 0 for g in got.values())


def test_echo_loss_off_scores_no_observation() -> None:
    """`algo.env_loss_coef: 0` (the default) collates no observation mask: the update's forward
    computes the responses' log-probs only, as before ECHO existed."""
    from envace.train.batch import TrainRow, make_micro_batches, pack_prefix_rows

    a = TrainRow([1, 2, 3], [4, 5], 1.0)
    b = TrainRow([1, 2, 3, 4, 5, 6, 7], [8], -1.0)
    (row,) = pack_prefix_rows([a, b])
    assert row.env_spans == [(5, 7)]
    (off,) = make_micro_batches([row], 4, 0)
    (on,) = make_micro_batches([row], 4, 0, env=True)
    assert off.env_mask is None and off.num_env_tokens == 0
    assert torch.equal(off.target_mask, off.response_mask)
    assert on.env_mask is not None and on.env_mask[0].tolist() == [0, 0, 0, 0, 0, 1, 1, 0]
    assert on.target_mask[0].tolist() == [0, 0, 0, 1, 1, 1, 1, 1]
