"""RL with world rehearsal: rollout -> rewards -> role-wise GRPO advantages -> PPO update.

One iteration (the reference's "step"):
1. take `batch_tasks` tasks (a seeded permutation per epoch, so the data cursor is just the
   iteration number) and roll each out `n` times — tool results rehearsed by the policy, executed
   in the real worlds, or written by an external simulator, by `rollout.mode`;
2. every row of a trajectory gets the trajectory's reward (minus the empty-response penalty);
   unscored trajectories (a failed judge) are masked, never scored 0; `algo.simulator_reward`
   may score simulator rows by their rehearsal fidelity instead, and `algo.mask_sim_errors`
   masks the caller rows of episodes a malformed rehearsal ended (`row_score`);
3. advantages per (task uid, role) group;
4. `ppo_epochs` passes of PPO-clip over the trainable rows, each cut into `ppo_mini_batches`
   mini-batches of whole tasks (verl's ppo_mini_batch_size, as a count), each mini-batch in
   micro-batches whose losses add up to its whole loss, then one optimizer step per mini-batch
   (reference: one pass of one mini-batch, fully on-policy);
   with `algo.env_loss_coef` > 0 each pass also adds ECHO's auxiliary loss: that coefficient x
   the cross-entropy of the observation tokens between a caller's packed generations (a token
   mean over the whole batch, `_plan`'s `env_weights`).
In "share" mode both roles' rows update one model; in "noshare" each role has its own model.

A trajectory's caller rows are packed into one sequence (`pack_prefix_rows`): the caller's
context is token-in / token-out, so each caller prompt is the previous prompt + response + the
tool results and the next generation prompt, and the shared prefix (system prompt, tool
schemas: most of the tokens) runs through the model once instead of once per step. The loss is
computed per generation (`MicroBatch.generations`), so the update is exactly the unpacked one:
each generation keeps its advantage and is one sequence of the sequence mean, and every count
below ("rows") counts generations. Simulator rows each have their own prompt: never packed.

Several ranks (torchrun, DeepSpeed engine) are data parallel: each rank rolls out its
round-robin share of the iteration's tasks (all `n` rollouts of a task on one rank), the
trajectories are gathered so that every rank computes the same rewards, advantages and metrics,
and the trainable rows are split round-robin again for the update. Every rank then runs the same
number of micro-batches (a rank with fewer rows repeats one at weight 0: ZeRO's per-micro-batch
collectives need equal counts), and each micro-batch loss is weighted by world size x its share
of the *global* rows (generations) or tokens, so DeepSpeed's gradient average is exactly the
one-process gradient over all rows. Under ZeRO-3 the rollout runs with the weights gathered on
every rank (`DeepSpeedEngine.generation_context`).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from envace.algo.advantages import apply_empty_penalty, compute_advantages
from envace.algo.losses import LossConfig, policy_loss
from envace.config import Config
from envace.errors import ConfigError, require_finite
from envace.rollout.engine import RolloutConfig, RolloutEngine, TurnGrader
from envace.rollout.grading import ShownWorldGrader
from envace.rollout.policies import Policy
from envace.rollout.sources import ToolResults
from envace.rollout.types import EndReason, Role, Row, Trajectory
from envace.tasks.model import Task
from envace.train.batch import (
    MicroBatch,
    TrainRow,
    logprob_gap,
    make_micro_batches,
    mini_batches,
    pack_trajectories,
)
from envace.train.distributed import (
    all_reduce_max,
    all_reduce_mean,
    all_reduce_sum,
    dist_info,
    gather_objects,
    partition,
)
from envace.train.engine import TrainingEngine, require_finite_weights

__all__ = [
    "RLTrainer",
    "ended_by_simulator",
    "generation_ready",
    "iteration_seed",
    "row_score",
    "sample_tasks",
]

log = logging.getLogger(__name__)

_MAX_STATS = ("ratio_max",)  # per-token maxima: reduced by max over micro-batches and ranks
# Token means of a micro-batch: weighted by its share of the global tokens, so they are the
# token means of the whole batch, however it is cut into micro-batches (or packed).
_TOKEN_STATS = ("clip_frac", "dual_clip_frac", "approx_kl", "ratio_mean")


@contextlib.contextmanager
def generation_ready(engines: Iterable[TrainingEngine]) -> Iterator[None]:
    """The engines' weights ready for generation on every rank (gathered under ZeRO-3)."""
    with contextlib.ExitStack() as stack:
        for engine in engines:
            stack.enter_context(engine.generation_context())
        yield


def iteration_seed(seed: int, iteration: int) -> int:
    return (seed * 1_000_003 + iteration * 7_919) % (2**31)


def sample_tasks(tasks: Sequence[Task], batch: int, seed: int, iteration: int) -> list[Task]:
    """Tasks of `iteration`: consecutive slices of per-epoch seeded permutations."""
    out: list[Task] = []
    cursor = iteration * batch
    while len(out) < batch:
        epoch, offset = divmod(cursor, len(tasks))
        perm = list(range(len(tasks)))
        random.Random(seed * 31 + epoch).shuffle(perm)
        take = min(batch - len(out), len(tasks) - offset)
        out += [tasks[i] for i in perm[offset : offset + take]]
        cursor += take
    return out


@dataclass
class RoleLearner:
    """A model being trained and the roles whose rows it learns from."""

    engine: TrainingEngine
    roles: frozenset[str]
    pad_id: int


class RLTrainer:
    """Runs RL iterations. `learners` has one entry (share) or two (noshare: caller, simulator)."""

    def __init__(
        self,
        cfg: Config,
        tasks: Sequence[Task],
        policy: Policy,
        learners: Sequence[RoleLearner],
        grader: TurnGrader,
        sources: ToolResults | None = None,
        *,
        ref_model: Any = None,
    ) -> None:
        """`sources`: who writes the tool results (`envace.run.tool_results`); default: the
        policy rehearses them under `rollout.mode: rehearsal`; under another mode a trainer
        without them only updates (a pipeline's train step). `ref_model`: the frozen
        KL reference (kl_coef > 0); default: a copy of the first learner's model as it is now.
        A pipeline's train step, which rebuilds the trainer every round, passes the RL-start
        model instead. `tasks` may be empty for a trainer that only updates (`update`);
        `collect` needs them."""
        if sources is None and cfg.rollout.mode == "rehearsal":
            sources = ToolResults()
        if sources is not None and sources.mode != cfg.rollout.mode:
            raise ValueError(
                f"tool results from {sources.mode!r} but rollout.mode is {cfg.rollout.mode!r}"
            )
        self.cfg = cfg
        self.tasks = list(tasks)
        self.learners = list(learners)
        self.dist = dist_info()
        if self.dist.distributed:
            for learner in self.learners:
                if not learner.engine.data_parallel:
                    raise ConfigError(
                        f"train.engine: {type(learner.engine).__name__} trains one process, but "
                        f"this is rank {self.dist.rank} of WORLD_SIZE={self.dist.world_size}; "
                        "set train.engine: deepspeed for multi-process training"
                    )
        self.rollout_cfg = RolloutConfig.from_config(cfg)
        self.engine: RolloutEngine | None = None  # None: this trainer only updates
        self.last_trajectories: list[Trajectory] = []  # the last `collect`'s, every rank's
        if cfg.algo.rehearsal_grading == "shown_world":  # the config refuses it in real mode
            grader = ShownWorldGrader(grader)
        if sources is not None:
            self.engine = RolloutEngine(
                policy, self.rollout_cfg, grader, sources.simulator, sources.make_env
            )
        a = cfg.algo
        self.loss_cfg = LossConfig(
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip,
            loss_agg_mode=a.loss_agg_mode,
            kl_coef=a.kl_coef,
            kl_kind=a.kl_kind,
        )
        self.ref_model: Any = None
        if a.kl_coef > 0 and (ref_model is not None or self.learners):
            import copy

            if ref_model is None and self.learners[0].engine.partitioned:
                raise ConfigError(
                    "algo.kl_coef > 0 needs a frozen reference copy of the policy, which a "
                    "ZeRO-3-partitioned model cannot give; use zero_optimization.stage 2 or "
                    "algo.kl_coef: 0"
                )
            ref = (
                ref_model if ref_model is not None else copy.deepcopy(self.learners[0].engine.model)
            )
            self.ref_model = ref.eval()
            for p in self.ref_model.parameters():
                p.requires_grad_(False)

    # --- one iteration ------------------------------------------------------------------------
    def iteration(self, it: int) -> dict[str, Any]:
        """Rollout + advantages + update, in one process."""
        rows, metrics = self.collect(it)
        t1 = time.perf_counter()
        update = self.update(rows)
        return {**metrics, **update, "time/update_s": time.perf_counter() - t1}

    def collect(self, it: int) -> tuple[list[Row], dict[str, Any]]:
        """The rollout half of an iteration: rows with rewards and advantages, and metrics.

        Split from `update` so a pipeline can run rollout and training in separate steps with
        the rows stored in between (see `envace.rollout.io`)."""
        cfg = self.cfg
        if not self.tasks:
            raise ValueError("RL needs at least one training task")
        if self.engine is None:
            raise ValueError(
                f"rollout.mode {cfg.rollout.mode!r}: collecting rollouts needs the tool-result "
                "source (RLTrainer(..., sources=envace.run.tool_results(...)))"
            )
        rank, world = self.dist.rank, self.dist.world_size
        torch.manual_seed((iteration_seed(cfg.train.seed, it) + rank) % 2**31)
        batch = sample_tasks(self.tasks, cfg.rollout.batch_tasks, cfg.train.seed, it)
        mine = partition(batch, rank, world)
        t0 = time.perf_counter()
        with self.generation_ready():
            local = self.engine.run(mine, n=cfg.rollout.n) if mine else []
        if not cfg.rollout.keep_decode_cache:  # decode caches: the update needs the memory
            for policy in (self.engine.policy, self.engine.simulator):
                policy.release()
        t_rollout = time.perf_counter() - t0
        trajs = [t for part in gather_objects(local) for t in part]
        rows, adv_metrics = self._advantages(trajs)
        self.last_trajectories = trajs  # scored: `train.save_rollouts` writes them
        return rows, {
            "iteration": it + 1,
            **_rollout_metrics(trajs),
            **adv_metrics,
            "time/rollout_s": t_rollout,
            "throughput/generated_tokens": sum(len(r.response_ids) for t in trajs for r in t.rows),
        }

    def generation_ready(self) -> contextlib.AbstractContextManager[None]:
        """Every learner's weights ready for generation (gathered under ZeRO-3)."""
        return generation_ready(learner.engine for learner in self.learners)

    def _advantages(self, trajs: Sequence[Trajectory]) -> tuple[list[Row], dict[str, float]]:
        a = self.cfg.algo
        rows = [r for t in trajs for r in t.rows]
        reward_of = {t.traj_id: t.reward for t in trajs}
        masked = {t.traj_id for t in trajs if a.mask_sim_errors and ended_by_simulator(t)}
        scores = apply_empty_penalty(
            [
                row_score(
                    r,
                    reward_of[r.traj_id],
                    a.simulator_reward,
                    mask_caller=r.traj_id in masked,
                )
                for r in rows
            ],
            [r.valid for r in rows],
            a.empty_penalty,
        )
        res = compute_advantages(
            scores,
            [r.uid for r in rows],
            [str(r.role) for r in rows],
            [r.traj_id for r in rows],
            baseline=a.baseline,
            normalize_std=a.normalize_std,
            singleton=a.singleton,
        )
        for r, s, adv in zip(rows, scores, res.advantages, strict=True):
            r.reward, r.advantage = s, adv
        metrics = res.metrics()
        if a.mask_sim_errors:
            metrics["reward/caller_masked_episodes"] = float(len(masked))
        return rows, metrics

    def _allowed(self, row: Row) -> bool:
        roles = self.cfg.algo.train_roles
        return row.trainable and row.advantage is not None and (roles in ("both", str(row.role)))

    def update(self, rows: Sequence[Row]) -> dict[str, float]:
        """The training half: PPO on the trainable rows, per learner."""
        out: dict[str, float] = {}
        for learner in self.learners:
            mine = [r for r in rows if self._allowed(r) and str(r.role) in learner.roles]
            name = "policy" if len(self.learners) == 1 else "/".join(sorted(learner.roles))
            stats = self._ppo(learner, mine)
            out.update({f"{name}/{k}": v for k, v in stats.items()})
        return out

    def _ppo(self, learner: RoleLearner, rows: Sequence[Row]) -> dict[str, float]:
        """PPO on `rows` (the same global rows on every rank; each rank trains its share): each
        of `ppo_epochs` passes takes one optimizer step per mini-batch of tasks
        (`mini_batches`), as verl's ppo_mini_batch_size."""
        if not rows:
            return {"rows": 0.0}
        t = self.cfg.train
        plans = [
            self._plan(learner, pack_trajectories(part))
            for part in mini_batches(rows, t.ppo_mini_batches)
        ]
        # Old log-probs (of the weights that generated the rows): with one pass of one
        # mini-batch they are the pass's own, since no optimizer step comes before its last
        # micro-batch, so no extra forward over the batch (as TRL with num_iterations=1);
        # otherwise they are needed before the first step.
        on_policy = t.ppo_epochs == 1 and len(plans) == 1
        with torch.no_grad():
            refs = [[self._ref_logprobs(mb) for mb in p.mbs] for p in plans]
            olds: list[list[torch.Tensor]] = (
                [[]]
                if on_policy
                else [[learner.engine.logprobs(mb).detach() for mb in p.mbs] for p in plans]
            )
        stats = {k: sum(p.stats[k] for p in plans) for k in plans[0].stats}
        roles = "+".join(sorted(learner.roles))
        for epoch in range(t.ppo_epochs):
            sums: dict[str, float] = {}
            maxima: dict[str, float] = {}
            norms = []
            for plan, ref, old in zip(plans, refs, olds, strict=True):
                self._accumulate(learner, plan, ref, old, sums, maxima)
                norms.append(learner.engine.step())
                require_finite_weights(learner.engine.model, f"the {roles} model after its update")
            # The last pass's means: each mini-batch's weights sum to world size over the ranks,
            # so the mean over ranks and mini-batches is the mean of the mini-batch means.
            stats.update({k: all_reduce_mean(v) / len(plans) for k, v in sorted(sums.items())})
            stats.update({k: all_reduce_max(maxima.get(k, 0.0)) for k in _MAX_STATS})
            stats["grad_norm"] = sum(norms) / len(norms)
            if epoch == 0:
                stats["rollout_logprob_diff"] = logprob_gap(
                    [mb for p in plans for mb in p.mbs[: p.real]],
                    [lp for p, old in zip(plans, olds, strict=True) for lp in old[: p.real]],
                )
        stats["optimizer_steps"] = float(t.ppo_epochs * len(plans))
        return stats

    def _accumulate(
        self,
        learner: RoleLearner,
        plan: _Plan,
        ref: Sequence[torch.Tensor | None],
        old: list[torch.Tensor],
        sums: dict[str, float],
        maxima: dict[str, float],
    ) -> None:
        """Forward and backward every micro-batch of `plan` (gradients add up to the plan's
        whole-batch loss), adding its stats into `sums` and `maxima`. An empty `old` is filled
        with the pass's own detached log-probs (the on-policy case of `_ppo`)."""
        t = self.cfg.train
        fill = not old
        for i, (mb, w, tw, ew, ref_lp) in enumerate(
            zip(plan.mbs, plan.weights, plan.token_weights, plan.env_weights, ref, strict=True)
        ):
            logp = learner.engine.logprobs(mb)
            if fill:
                old.append(logp.detach())
            loss, s = self._loss(mb, logp, old[i], ref_lp)
            loss = loss * w
            if mb.env_mask is not None:  # ECHO: the observations' token-mean cross-entropy
                env_ce = -(logp * mb.env_mask).sum() / max(mb.num_env_tokens, 1)
                loss = loss + self.cfg.algo.env_loss_coef * env_ce * ew
                sums["env_ce"] = sums.get("env_ce", 0.0) + float(env_ce.detach()) * ew
            require_finite(
                float(loss.detach()),
                f"the RL loss of {'+'.join(sorted(learner.roles))}",
                f"Lower train.lr (now {t.lr:g}) or train.grad_clip (now {t.grad_clip:g}).",
            )
            learner.engine.backward(loss)
            for k, v in s.items():
                if k in _MAX_STATS:
                    if w > 0:
                        maxima[k] = max(maxima.get(k, float("-inf")), float(v))
                elif k != "tokens":  # the batch's token count is already in stats
                    sums[k] = sums.get(k, 0.0) + float(v) * (tw if k in _TOKEN_STATS else w)

    def _plan(self, learner: RoleLearner, train_rows: Sequence[TrainRow]) -> _Plan:
        """This rank's micro-batches of `train_rows` (all ranks' rows), their weights in the
        loss, in the token-mean stats and in ECHO's observation loss, and the batch's counts."""
        generations = sum(len(r.spans) for r in train_rows)
        rank, world = self.dist.rank, self.dist.world_size
        # Length-sorted before the round-robin split, so every rank gets a similar token load.
        ordered = sorted(train_rows, key=lambda r: r.length)
        device = next(learner.engine.model.parameters()).device
        t = self.cfg.train
        mbs = [
            mb.to(device)
            for mb in make_micro_batches(
                partition(ordered, rank, world),
                t.micro_batch_rows,
                learner.pad_id,
                t.micro_batch_tokens,
                env=self.cfg.algo.env_loss_coef > 0,
                temperature=self.cfg.rollout.temperature or 1.0,  # greedy rollouts: T 1
            )
        ]
        total_tokens = all_reduce_sum(sum(mb.num_tokens for mb in mbs))
        env_tokens = all_reduce_sum(sum(mb.num_env_tokens for mb in mbs))
        env_weights = [world * mb.num_env_tokens / max(env_tokens, 1.0) for mb in mbs]
        # Weight of each micro-batch: world x its share of the global batch (DeepSpeed averages
        # the ranks' gradients); filler micro-batches (equal counts for ZeRO) weigh 0.
        token_weights = [world * mb.num_tokens / max(total_tokens, 1.0) for mb in mbs]
        weights = (
            [world * mb.num_generations / generations for mb in mbs]
            if self.cfg.algo.loss_agg_mode == "seq-mean-token-mean"
            else list(token_weights)
        )
        filler = mbs[0] if mbs else make_micro_batches(ordered[:1], 1, learner.pad_id)[0].to(device)
        missing = int(all_reduce_max(len(mbs))) - len(mbs)
        stats = {
            **({"env_tokens": float(env_tokens)} if self.cfg.algo.env_loss_coef > 0 else {}),
            "rows": float(generations),
            "tokens": float(total_tokens),
            "sequences": float(len(train_rows)),
            # Tokens of one forward pass over the batch (all ranks, padding aside): what
            # packing saves.
            "update_tokens": all_reduce_sum(sum(int(mb.attention_mask.sum()) for mb in mbs)),
        }
        return _Plan(
            [*mbs, *[filler] * missing],
            weights + [0.0] * missing,
            token_weights + [0.0] * missing,
            env_weights + [0.0] * missing,
            len(mbs),
            stats,
        )

    def _loss(
        self,
        mb: MicroBatch,
        logp: torch.Tensor,
        old: torch.Tensor,
        ref: torch.Tensor | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's policy loss, per generation: (B, T) log-probs -> (G, L) spans."""
        g = mb.generations
        return policy_loss(
            g.gather(logp),
            g.gather(old),
            g.advantages,
            g.mask,
            self.loss_cfg,
            ref_logprobs=None if ref is None else g.gather(ref),
        )

    def _ref_logprobs(self, mb: MicroBatch) -> torch.Tensor | None:
        if self.ref_model is None:
            return None
        from envace.train.batch import token_logprobs

        return token_logprobs(self.ref_model, mb).detach()


@dataclass
class _Plan:
    """One rank's share of an update: micro-batches (fillers last), the weight of each in the
    loss, in the token-mean stats and in ECHO's observation loss (its share of the batch's
    observation tokens), how many are real (not fillers), and the batch's counts."""

    mbs: list[MicroBatch]
    weights: list[float]
    token_weights: list[float]
    env_weights: list[float]
    real: int
    stats: dict[str, float]


def ended_by_simulator(traj: Trajectory) -> bool:
    """Whether a malformed tool result (not the caller) ended the episode."""
    return traj.end_reason is EndReason.SIMULATOR_FORMAT_ERROR


def row_score(
    row: Row, task_reward: float | None, simulator_reward: str, *, mask_caller: bool = False
) -> float | None:
    """A row's score before the empty penalty: its trajectory's reward, except a simulator
    row with a measured fidelity under `algo.simulator_reward` fidelity (the fidelity) or mixed
    (the mean of the two; unscored when the trajectory is), and a caller row under
    `mask_caller` (its episode was ended by the simulator, `algo.mask_sim_errors`): unscored."""
    if row.role is Role.CALLER:
        return None if mask_caller else task_reward
    if row.fidelity is None or simulator_reward == "task":
        return task_reward
    if simulator_reward == "fidelity":
        return row.fidelity
    return None if task_reward is None else (task_reward + row.fidelity) / 2


def _rollout_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    scored = [t for t in trajs if t.reward is not None]
    rows = [r for t in trajs for r in t.rows]
    sim_rows = [r for r in rows if r.role is Role.SIMULATOR]
    out: dict[str, float] = {
        "reward/mean": sum(t.reward or 0.0 for t in scored) / max(1, len(scored)),
        "reward/success_rate": sum(1.0 for t in scored if t.success) / max(1, len(scored)),
        "reward/unscored": float(len(trajs) - len(scored)),
        "rows/caller": float(sum(1 for r in rows if r.role is Role.CALLER)),
        "rows/simulator": float(len(sim_rows)),
        "rollout/sim_format_error_rate": sum(1.0 for r in sim_rows if not r.valid)
        / max(1, len(sim_rows)),
        "rollout/calls_per_episode": sum(len(t.calls) for t in trajs) / max(1, len(trajs)),
    }
    scored_sims = [r.fidelity for r in sim_rows if r.fidelity is not None]
    if scored_sims:  # rehearsals of tasks with a world, against that world's answers
        out["rollout/sim_field_fidelity"] = sum(scored_sims) / len(scored_sims)
    for t in trajs:
        key = f"end/{t.end_reason}"
        out[key] = out.get(key, 0.0) + 1.0
    return out
