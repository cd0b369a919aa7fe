"""The task data model (the public data contract, see docs/task_format.md).

A task is a multi-turn tool-use episode: tool schemas, user turns replayed in order, and one or
more ways to grade it (expected calls per turn, a checklist for an LLM judge, a final-state rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "ChecklistItem",
    "EnvironmentSpec",
    "ExpectedCall",
    "Task",
    "Turn",
]

FocusOn = Literal["assistant.tool_calls", "assistant.content", "tool.content"]


@dataclass(frozen=True)
class ChecklistItem:
    """One item an LLM judge checks at every assistant step of a turn."""

    id: str
    question: str
    focus_on: FocusOn
    pass_condition: str
    weight: float
    failure_examples: tuple[str, ...] = ()
    required_for_next_turn: bool = False


@dataclass(frozen=True)
class ExpectedCall:
    """A tool call the caller must issue during a turn (graded by rules)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class Turn:
    """One replayed user message and how the assistant's reaction to it is graded."""

    user: str
    checklist: tuple[ChecklistItem, ...] = ()
    expected_calls: tuple[ExpectedCall, ...] = ()
    ordered: bool = False
    # Facts the turn's final answer must state (the balance the user asked for, a file's text):
    # what the real tool results gave. Graded in the answer text (envace.reward.rules).
    answer_facts: tuple[str, ...] = ()


@dataclass(frozen=True)
class EnvironmentSpec:
    """Names an executable environment (see envace.envs) and the state it starts from."""

    name: str
    initial_state: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    """A validated task. `tools` are OpenAI function-tool schemas."""

    id: str
    tools: tuple[dict[str, Any], ...]
    turns: tuple[Turn, ...]
    system: str | None = None
    environment: EnvironmentSpec | None = None
    success: dict[str, Any] | None = None
    reference: tuple[dict[str, Any], ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def tool_names(self) -> list[str]:
        return [str(t["function"]["name"]) for t in self.tools]

    def tool_schema(self, name: str) -> dict[str, Any] | None:
        """The `function` object of tool `name`, or None when the task has no such tool."""
        for t in self.tools:
            if t["function"]["name"] == name:
                fn: dict[str, Any] = t["function"]
                return fn
        return None
