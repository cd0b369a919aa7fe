"""Committed execution of a policy in the real worlds, with optional fidelity probes.

Each held-out task runs once per seed in its executable world (real mode): the caller acts, the
world answers. With `probe_fidelity` the policy is also asked, before each real call executes, to
rehearse that call's result from the same context; comparing the two gives rehearsal fidelity.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from envace.envs.base import Environment
from envace.evaluate.metrics import EvalMetrics, summarize
from envace.rollout.engine import RolloutConfig, RolloutEngine, TurnGrader, TurnHook
from envace.rollout.grading import TaskGrader
from envace.rollout.policies import Policy
from envace.rollout.types import Trajectory
from envace.tasks.model import Task

__all__ = ["EvalResult", "evaluate_policy", "make_task_environment"]


@dataclass(frozen=True)
class EvalResult:
    metrics: EvalMetrics
    trajectories: list[Trajectory]


def make_task_environment(task: Task) -> Environment:
    """A fresh world for `task`, reset to its initial state."""
    from envace.envs.registry import make_environment

    if task.environment is None:
        raise ValueError(f"task {task.id!r} names no environment: it cannot run in the real world")
    env = make_environment(task.environment.name)
    env.reset(task.environment.initial_state)
    return env


def evaluate_policy(
    policy: Policy,
    tasks: Sequence[Task],
    cfg: RolloutConfig,
    *,
    grader: TurnGrader | None = None,
    probe_fidelity: bool = True,
    n: int = 1,
    progress: bool = False,
    before_turn: TurnHook | None = None,
) -> EvalResult:
    """Run `policy` on `tasks` in their real worlds and aggregate the metrics.

    before_turn: runs before each committed turn (test-time rehearsal, `TurnRehearsal`)."""
    runnable = [t for t in tasks if t.environment is not None]
    if len(runnable) < len(tasks):
        missing = [t.id for t in tasks if t.environment is None][:5]
        raise ValueError(f"tasks without an environment cannot be evaluated: {missing}")
    real_cfg = dataclasses.replace(cfg, mode="real", probe_fidelity=probe_fidelity)
    engine = RolloutEngine(
        policy,
        real_cfg,
        grader or TaskGrader(),
        make_env=make_task_environment,
        before_turn=before_turn,
    )
    trajs = engine.run(runnable, n=n, progress=progress, desc="evaluate")
    return EvalResult(summarize(trajs), trajs)
