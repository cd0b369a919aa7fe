"""The RL stage of `envace run`: learners, the tool-result source and the rollout policy built
once (`rl_stage`), then the iterations with their checkpoints."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from envace.config import Config
from envace.errors import ConfigError
from envace.evaluate.report import write_trajectories
from envace.policy.chat import ChatRenderer
from envace.rollout.grading import TaskGrader
from envace.rollout.policies import ModelPolicy
from envace.rollout.sources import ToolResults
from envace.run.blocks import push_weights, rollout_policy, tool_results
from envace.run.job import wait_for_all
from envace.run.layout import RunPaths, TaskSplits, commit_from_ranks, copy_tensorboard
from envace.storage.checkpoints import checkpoint_name
from envace.train.adapters import save_hf_checkpoint
from envace.train.distributed import DEFAULT_TIMEOUT_S, dist_info
from envace.train.engine import (
    TrainingEngine,
    load_trainer_state,
    require_finite_weights,
)
from envace.train.learners import (
    TRAINER_STATE,
    Learner,
    build_learners,
    restore_learners,
    role_learners,
    trainer_state,
    trains_simulator,
)
from envace.train.rl import RLTrainer
from envace.train.tracking import MetricsLogger, NullLogger

log = logging.getLogger(__name__)


@dataclass
class RunContext:
    """One run's inputs, read once and passed down: the config, the run's folders and store
    (`paths`), the tasks, the model RL starts from (on resume the checkpoint's, loaded in
    `model.dtype`) and its tokenizer, the checkpoint resumed from, the stage figures so far."""

    cfg: Config
    paths: RunPaths
    splits: TaskSplits
    model: Any
    tokenizer: Any
    resume_from: Path | None = None
    stages: dict[str, Any] = field(default_factory=dict)


@dataclass
class _RLSetup:
    """What `rl_stage` builds for the loop."""

    learners: list[Learner]
    policy: ModelPolicy  # the caller (and, sharing, the simulator)
    sources: ToolResults
    start: int  # iterations already done (a resume)


def rl_stage(
    ctx: RunContext,
    logger: MetricsLogger | NullLogger,
    eval_hook: Callable[[Any], float] | None = None,
) -> tuple[Any, list[dict[str, Any]], TrainingEngine]:
    """RL iterations on `ctx.model`; returns the trained policy model, the per-iteration
    records and the policy's engine. `eval_hook` runs on rank 0 (weights gathered on every
    rank). On resume the simulator, when it has its own model, loads from the same checkpoint."""
    cfg, paths, model, resume_from = ctx.cfg, ctx.paths, ctx.model, ctx.resume_from
    start = 0
    saved_sim = None
    if resume_from is not None and trains_simulator(cfg):
        from envace.policy.hf_backend import load_model_and_tokenizer

        saved_sim, _ = load_model_and_tokenizer(
            resume_from / "simulator", cfg.model.dtype, device=cfg.model.device
        )
    learners = build_learners(cfg, model, saved_sim, cfg.train.iterations)
    sim = next((lr.model for lr in learners if lr.name == "simulator"), None)
    sources = tool_results(
        cfg, ctx.tokenizer, sim, lambda: _rl_start_model(cfg, paths, model, resume_from)
    )
    vllm_dir = None
    if cfg.rollout.backend == "vllm":
        if dist_info().distributed:
            raise ConfigError(
                "rollout.backend: vllm runs with one training process (each rank would need "
                "its own engine and the gathered weights); use rollout.backend: transformers "
                "for multi-process runs"
            )
        vllm_dir = paths.checkpoints / "rollout_start"  # the engine's first weights
        save_hf_checkpoint(model, vllm_dir, ctx.tokenizer)
    if resume_from is not None:
        state = load_trainer_state(resume_from / TRAINER_STATE)
        start = restore_learners(learners, state, resume_from, str(resume_from))
        logger.truncate_after(start)
        log.info("resumed RL from %s at iteration %d", resume_from, start)
    policy = rollout_policy(cfg, model, ctx.tokenizer, vllm_dir)
    try:
        return _rl_loop(ctx, _RLSetup(learners, policy, sources, start), logger, eval_hook)
    finally:
        policy.close()


def _rl_loop(
    ctx: RunContext,
    setup: _RLSetup,
    logger: MetricsLogger | NullLogger,
    eval_hook: Callable[[Any], float] | None,
) -> tuple[Any, list[dict[str, Any]], TrainingEngine]:
    cfg, learners, policy = ctx.cfg, setup.learners, setup.policy
    info = dist_info()
    trainer = RLTrainer(
        cfg,
        ctx.splits.train,
        policy,
        role_learners(learners, ChatRenderer(ctx.tokenizer).pad_id),
        TaskGrader(),
        setup.sources,
    )
    records: list[dict[str, Any]] = []
    from tqdm import tqdm

    t = cfg.train
    bar = tqdm(
        range(setup.start, t.iterations),
        desc="RL",
        unit="it",
        initial=setup.start,
        total=t.iterations,
        disable=not info.is_main,
    )
    for it in bar:
        rec = trainer.iteration(it)
        if t.save_rollouts and ctx.paths.writes:
            name = f"{checkpoint_name(it + 1)}.jsonl"
            write_trajectories(
                trainer.last_trajectories, ctx.paths.out / "rollouts" / name, rows=True
            )
        rec["time/weight_sync_s"] = push_weights(policy, learners[0].engine)
        if eval_hook is not None and t.eval_every and (it + 1) % t.eval_every == 0:
            with trainer.generation_ready():
                if info.is_main:
                    rec["eval/success_rate"] = eval_hook(ctx.model)
            wait_for_all(cfg, "evaluation during RL")
        logger.log(rec)
        records.append(rec)
        bar.set_postfix(
            reward=f"{rec['reward/mean']:.2f}", success=f"{rec['reward/success_rate']:.2f}"
        )
        if (it + 1) % t.save_every == 0 or it + 1 == t.iterations:
            save_rl_checkpoint(
                ctx.paths, it + 1, learners, ctx.tokenizer, cfg.train.deepspeed.collective_timeout_s
            )
    return ctx.model, records, learners[0].engine


def _rl_start_model(cfg: Config, paths: RunPaths, model: Any, resume_from: Path | None) -> Any:
    """The policy as RL started (an external simulator's frozen copy): `model` itself, copied,
    on a fresh start (no update yet); on resume the checkpoint RL started from, as the
    pipeline's stages read it from `rl_start`: the warm start's, else the initial one."""
    if resume_from is None:
        return copy.deepcopy(model)
    from envace.policy.hf_backend import load_model_and_tokenizer

    if not cfg.warm_start.enabled and cfg.model.path is not None:
        return load_model_and_tokenizer(cfg.model.path, cfg.model.dtype, device=cfg.model.device)[0]
    start = paths.checkpoints / ("warm_start" if cfg.warm_start.enabled else "init")
    if not (start / "MANIFEST.json").is_file():  # a new pod: from the store
        from envace.storage.artifacts import fetch_dir

        fetch_dir(paths.store_uri(start), start)
    return load_model_and_tokenizer(start, cfg.model.dtype, device=cfg.model.device)[0]


def save_rl_checkpoint(
    paths: RunPaths,
    it: int,
    learners: Sequence[Learner],
    tokenizer: Any,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> str:
    """checkpoints/rl/iter_N: every learner's weights (and DeepSpeed shards), rank 0's trainer
    state and history, committed. Under torchrun each node's first rank uploads what its node's
    ranks wrote (`commit_from_ranks`), so nodes need no shared disk, only the store."""
    ckpt = paths.checkpoints / "rl" / checkpoint_name(it)
    for lr in learners:
        require_finite_weights(
            lr.model, f"the weights to save as checkpoints/rl/{ckpt.name}/{lr.name}"
        )
    for lr in learners:
        lr.engine.save_model(ckpt / lr.name, tokenizer)
    if paths.writes:  # rank 0: the trainer state and the run's history beside the weights
        import shutil

        torch.save(trainer_state(it, learners), ckpt / TRAINER_STATE)
        for name in ("metrics.jsonl", "stages.json", "config.json"):  # a resume elsewhere
            if (paths.out / name).exists():
                shutil.copyfile(paths.out / name, ckpt / name)
        copy_tensorboard(paths.out, ckpt)
    info = dist_info()
    if not info.distributed:
        return paths.commit(ckpt)
    ckpt.mkdir(parents=True, exist_ok=True)  # a rank may have written nothing
    uploads = info.local_rank == 0
    return commit_from_ranks(ckpt, paths.store_uri(ckpt), timeout_s, uploads=uploads)
