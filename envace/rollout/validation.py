"""Schema validity of a tool call against the task's tool list (valid-call rate)."""

from __future__ import annotations

from envace.envs.schema_check import arguments_valid
from envace.policy.types import ToolCall
from envace.tasks.model import Task

__all__ = ["call_is_schema_valid"]


def call_is_schema_valid(task: Task, call: ToolCall) -> bool:
    """True when the task offers the tool and the arguments satisfy its parameter schema, checked
    as the worlds check calls (envace.envs.schema_check: integer literals, local refs only,
    patterns without backtracking)."""
    fn = task.tool_schema(call.name)
    if fn is None:
        return False
    schema = fn.get("parameters") or {"type": "object"}
    return arguments_valid(schema, call.arguments)
