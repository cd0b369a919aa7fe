"""Rollout data: one row per generation, grouped into trajectories.

Shapes are plain Python lists (token ids per row vary in length); the trainer collates them into
padded tensors with explicit masks. Nothing here is inferred from padding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from envace.policy.types import ToolCall
from envace.tasks.model import Task

__all__ = ["CallRecord", "EndReason", "Role", "Row", "Trajectory"]


class Role(StrEnum):
    CALLER = "caller"  # acts: writes tool calls or answers
    SIMULATOR = "simulator"  # rehearses: writes tool results


class EndReason(StrEnum):
    COMPLETED = "completed"  # every user turn answered
    CALLER_FORMAT_ERROR = "caller_format_error"
    SIMULATOR_FORMAT_ERROR = "simulator_format_error"
    STEP_LIMIT = "step_limit"  # too many assistant steps in one user turn
    CALL_LIMIT = "call_limit"  # too many calls in one message
    CONTEXT_LIMIT = "context_limit"  # caller context + max_new_tokens exceeds the budget
    SIM_PROMPT_TOO_LONG = "simulator_prompt_too_long"
    REQUIRED_ITEM_FAILED = "required_item_failed"  # a judge's required item failed
    UNSCORED = "unscored"  # the judge could not grade a turn


@dataclass
class Row:
    """One generation (a training row).

    prompt_ids: (P,) the exact prompt ids; response_ids: (R,) the exact sampled ids;
    logprobs: (R,) sampling log-probabilities. `trainable` is False for rows written by a model
    that is not being trained (an external simulator) and for evaluation probes. `fidelity`: a
    rehearsed tool result's field agreement with the real world's answer to the same calls
    (`envace.reward.fidelity.field_agreement`; 0 for a malformed one), where the task has a world
    and the rollout scores rehearsals; None elsewhere.
    """

    role: Role
    uid: str
    traj_id: str
    turn: int
    step: int
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    trainable: bool
    valid: bool  # non-empty and well-formed
    text: str = ""
    reward: float | None = None
    advantage: float | None = None
    fidelity: float | None = None


@dataclass
class CallRecord:
    """A tool call issued by the caller and the result it got.

    source: where the result came from ("real", "rehearsal", "external").
    schema_valid: the tool exists and the arguments satisfy its parameter schema.
    rehearsed: in real mode with fidelity probing, what the policy predicted (or a parse error).
    """

    turn: int
    call: ToolCall
    result: Any
    source: str
    schema_valid: bool
    rehearsed: Any = None
    rehearsal_error: str | None = None


@dataclass
class Trajectory:
    """One episode of one task."""

    task: Task
    traj_id: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    turn_scores: list[float | None] = field(default_factory=list)
    end_reason: EndReason | None = None
    reward: float | None = None
    success: bool | None = None
    final_state: dict[str, Any] | None = None
    parse_errors: int = 0

    @property
    def uid(self) -> str:
        return self.task.id
