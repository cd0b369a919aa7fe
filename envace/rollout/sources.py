"""Who writes the tool results of training rollouts: the policy rehearsing them (the method),
the real worlds executing them (the upper bound), or a frozen external simulator (a baseline).

`rollout.mode` is read once, by `envace.run.tool_results`, into a `ToolResults`; the trainer
and the pipeline's rollout step take that object and never branch on the mode string again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from envace.envs.base import Environment
from envace.rollout.engine import Mode
from envace.rollout.policies import Policy
from envace.tasks.model import Task

__all__ = ["ToolResults"]


@dataclass(frozen=True)
class ToolResults:
    """The tool-result source of a run.

    mode: rehearsal, real or external (`RolloutConfig.mode` of the rollouts).
    simulator: the writer besides the policy: external, the frozen simulator (required);
        rehearsal, the simulator's own trained model (noshare) or None (the policy itself);
        real, the fidelity probe or None (the policy).
    make_env: real only: builds a fresh world for a task.
    """

    mode: Mode = "rehearsal"
    simulator: Policy | None = None
    make_env: Callable[[Task], Environment] | None = None

    def __post_init__(self) -> None:
        if self.mode == "external" and self.simulator is None:
            raise ValueError("external tool results need a simulator (a frozen model or endpoint)")
        if (self.mode == "real") != (self.make_env is not None):
            raise ValueError("make_env is given exactly when the real worlds write tool results")
