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
from envace.errors import UserInputError
from envace.evaluate.metrics import EvalMetrics, summarize
from envace.rollout.engine import RolloutConfig, RolloutEngine, TurnGrader, TurnHook
from envace.rollout.grading import TaskGrader
from envace.rollout.policies import Policy
from envace.rollout.types import Trajectory
from envace.tasks.model import Task

__all__ = ["EvalResult", "evaluate_policy", "make_task_environment", "no_environment_message"]


@dataclass(frozen=True)
class EvalResult:
    metrics: EvalMetrics
    trajectories: list[Trajectory]


def no_environment_message(task_ids: Sequence[str]) -> str:
    """Why tasks without an environment are refused: evaluation is committed execution in a
    world, and a task that names none has no world to run in (rules alone cannot answer its
    tool calls). Such tasks serve training in rehearsal mode."""
    from envace.tasks.loader import show_text

    shown = ", ".join(show_text(i, quote=True) for i in task_ids[:5])
    more = f" and {len(task_ids) - 5} more" if len(task_ids) > 5 else ""
    return (
        f"{len(task_ids)} task(s) name no environment ({shown}{more}): evaluation runs every "
        "task in its world; add an environment to them or leave them out "
        "(envace evaluate --skip-invalid leaves them out)"
    )


def make_task_environment(task: Task) -> Environment:
    """A fresh world for `task`, reset to its initial state."""
    from envace.envs.registry import make_environment

    if task.environment is None:
        raise UserInputError(no_environment_message([task.id]))
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
    missing = [t.id for t in tasks if t.environment is None]
    if missing:
        raise UserInputError(no_environment_message(missing))
    real_cfg = dataclasses.replace(cfg, mode="real", probe_fidelity=probe_fidelity)
    engine = RolloutEngine(
        policy,
        real_cfg,
        grader or TaskGrader(),
        make_env=make_task_environment,
        before_turn=before_turn,
    )
    trajs = engine.run(tasks, n=n, progress=progress, desc="evaluate")
    return EvalResult(summarize(trajs), trajs)
