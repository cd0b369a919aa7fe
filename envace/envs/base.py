"""The environment interface: a real, executable tool world (the ground truth).

Environments are used for evaluation (committed execution), for the "real" training mode (the
upper-bound baseline) and to measure rehearsal fidelity. They never see model output as code:
tool arguments arrive as parsed JSON values and are validated against the tool's JSON schema.

Result convention: a tool call returns a JSON object. A failed call returns
`{"error": {"code": "...", "message": "..."}}` (see `tool_error`); the episode goes on, as a
real API would answer.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["Environment", "is_error_result", "tool_error"]


def tool_error(code: str, message: str, **details: Any) -> dict[str, Any]:
    """The result a tool returns when a call fails (bad arguments, wrong order, missing entity)."""
    err: dict[str, Any] = {"code": code, "message": message}
    if details:
        err["details"] = details
    return {"error": err}


def is_error_result(result: Any) -> bool:
    """True when a tool result (real or rehearsed) reports a failed call."""
    return isinstance(result, dict) and ("error" in result or "error_tool_call" in result)


@runtime_checkable
class Environment(Protocol):
    """A stateful tool world. One instance serves one episode; `reset` starts it afresh."""

    name: str

    def tools(self) -> list[dict[str, Any]]:
        """OpenAI function-tool schemas of every tool this world offers."""
        ...

    def reset(self, initial_state: dict[str, Any]) -> None:
        """Load `initial_state` (a JSON object), dropping everything from a previous episode."""
        ...

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """Execute one tool call. Never raises on bad calls: returns a `tool_error` result."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """A deep copy of the full world state, JSON-serialisable (for success rules and replay)."""
        ...
