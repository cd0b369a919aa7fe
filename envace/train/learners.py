"""The models an RL run trains, their optimizers, and the trainer state that resumes them.

One implementation for both orchestrations: `envace run` (envace.run) and the pipeline's
train step (envace.stages) build their engines, learners and trainer states here, so a setting
such as `model.gradient_checkpointing` means the same on both paths.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from envace.config import Config
from envace.errors import ConfigError
from envace.train.adapters import Trainable
from envace.train.engine import TorchEngine, TrainingEngine
from envace.train.rl import RoleLearner

__all__ = [
    "TRAINER_STATE",
    "Learner",
    "build_learners",
    "make_engine",
    "restore_learners",
    "rl_torch_engine",
    "role_learners",
    "trainer_state",
    "trains_simulator",
]

TRAINER_STATE = "trainer_state.pt"  # iteration, optimizer states, RNG states


@dataclass(frozen=True)
class Learner:
    """One trained model: `name` is its checkpoint subfolder (`policy` or `simulator`)."""

    name: str
    model: Any
    engine: TrainingEngine


def trains_simulator(cfg: Config) -> bool:
    """noshare + rehearsal: the simulator role has a model of its own, trained beside the
    policy (one model plays both roles otherwise)."""
    return cfg.algo.sharing == "noshare" and cfg.rollout.mode == "rehearsal"


def rl_torch_engine(cfg: Config, model: Any, total_steps: int) -> TorchEngine:
    """The RL optimizer on one process: train.lr and its schedule over `total_steps` optimizer
    steps, training what train.trainable says."""
    t = cfg.train
    return TorchEngine(
        model,
        t.lr,
        t.weight_decay,
        t.grad_clip,
        t.lr_schedule,
        t.warmup_iterations * t.steps_per_iteration,  # in optimizer steps, as total_steps
        total_steps,
        trainable=Trainable.from_config(cfg),
        master_weights=t.master_weights,
    )


def make_engine(cfg: Config, model: Any, horizon: int) -> TrainingEngine:
    """The training engine `train.engine` names, its lr schedule spanning `horizon` iterations
    (times `train.steps_per_iteration` optimizer steps). `model.gradient_checkpointing` applies
    to both engines."""
    total = max(1, horizon * cfg.train.steps_per_iteration)
    if cfg.train.engine == "deepspeed":
        try:
            import deepspeed  # noqa: F401

            from envace.train.deepspeed_engine import DeepSpeedEngine, DeepSpeedOptions
        except ImportError as exc:
            raise ConfigError(
                "train.engine: 'deepspeed' needs the deepspeed package "
                "(pip install 'envace[deepspeed]'; the GPU image has it)"
            ) from exc
        opts = DeepSpeedOptions.from_config(cfg)
        return DeepSpeedEngine(model, dataclasses.replace(opts, total_steps=total))
    if cfg.train.engine != "torch":
        raise ConfigError(f"train.engine: {cfg.train.engine!r} is not torch or deepspeed")
    if cfg.model.gradient_checkpointing:
        from envace.train.deepspeed_engine import enable_activation_checkpointing

        enable_activation_checkpointing(model)
    return rl_torch_engine(cfg, model, total)


def build_learners(cfg: Config, policy: Any, simulator: Any | None, horizon: int) -> list[Learner]:
    """The policy's learner, and the simulator's when it trains (`trains_simulator`): its saved
    model, or a copy of the policy at the start."""
    models = [("policy", policy)]
    if trains_simulator(cfg):
        import copy

        models.append(("simulator", simulator if simulator is not None else copy.deepcopy(policy)))
    return [Learner(name, model, make_engine(cfg, model, horizon)) for name, model in models]


def role_learners(learners: Sequence[Learner], pad_id: int) -> list[RoleLearner]:
    """Which rows each engine trains on: one model plays both roles, or one model per role."""
    if len(learners) == 1:
        return [RoleLearner(learners[0].engine, frozenset({"caller", "simulator"}), pad_id)]
    by_name = {lr.name: lr.engine for lr in learners}
    return [
        RoleLearner(by_name["policy"], frozenset({"caller"}), pad_id),
        RoleLearner(by_name["simulator"], frozenset({"simulator"}), pad_id),
    ]


def trainer_state(iteration: int, learners: Sequence[Learner]) -> dict[str, Any]:
    """What `trainer_state.pt` holds: the iteration reached, every engine's optimizer and
    scheduler state, and the RNG states (a resumed run samples what an unbroken one would)."""
    return {
        "iteration": iteration,
        "engines": {lr.name: lr.engine.state_dict() for lr in learners},
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
    }


def restore_learners(
    learners: Sequence[Learner], state: dict[str, Any], folder: Path, where: str
) -> int:
    """Optimizer states from a checkpoint's `state` (DeepSpeed's, sharded, beside the weights in
    `folder/NAME/deepspeed`) and the RNG states; returns the iteration reached. A checkpoint
    written by the other train.engine is refused: its optimizer state would not fit."""
    for lr in learners:
        has_ds_state = (folder / lr.name / "deepspeed").is_dir()
        if lr.engine.shards_optimizer_state != has_ds_state:
            raise ConfigError(
                f"{where}: its optimizer state was written by another train.engine than this "
                "run's; keep train.engine the same for every round of a run"
            )
        if lr.engine.shards_optimizer_state:
            lr.engine.load_sharded_state(folder / lr.name)  # collective: every rank its shard
        lr.engine.load_state_dict(state["engines"][lr.name])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    return int(state["iteration"])
