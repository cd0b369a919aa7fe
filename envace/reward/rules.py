"""Rule-based grading of a turn: expected calls, extra calls, and the facts of the answer.

Arguments are compared canonically, as JSON values: dict key order does not matter, an int equals
a float of the same value (50 == 50.0), booleans are not numbers (True != 1), and strings must
match exactly (no case folding or trimming: a wrong date string is a wrong call).

The turn score (`turn_score_rules`) is on one scale of units: each expected call and each
expected answer fact is worth one unit; the score is (units earned - penalties) / units,
clipped to [0, 1]. An expected call counts once however often it is issued. Penalties, so that
spraying calls or repeating them does not pay:
- an issued call that matched no expected call and may change the world (not one of the
  world's read-only tools, or any call when the world is unknown) costs 1 unit: as much as a
  right call earns, since an unrequested transfer or delete undoes what a right call did;
- an exact repeat of a read-only call already issued in the turn costs 0.5 unit (it wastes a
  step; a first, harmless look-up costs nothing).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from envace.policy.types import ToolCall
from envace.tasks.model import ExpectedCall, Turn

__all__ = [
    "REPEAT_PENALTY",
    "UNEXPECTED_WRITE_PENALTY",
    "CallMatch",
    "canonical",
    "fact_in_answer",
    "match_expected_calls",
    "missing_facts",
    "turn_answers",
    "turn_score_rules",
]

UNEXPECTED_WRITE_PENALTY = 1.0  # an unrequested call that may change the world
REPEAT_PENALTY = 0.5  # an exact repeat of a read-only call in the same turn

Canonical = tuple[Any, ...]


def canonical(value: Any) -> Canonical:
    """A hashable form of a JSON value; two values are JSON-equal iff their forms are equal.

    Numbers become exact fractions, so 50 and 50.0 meet while 0.1 and 0.1000001 do not, and
    large integers never lose precision to float rounding.
    """
    if value is None:
        return ("null",)
    if isinstance(value, bool):  # before int: bool is an int subclass in Python
        return ("bool", value)
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            return ("float", repr(value))
        return ("number", Fraction(value))
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, dict):
        items = sorted((str(k), canonical(v)) for k, v in value.items())
        return ("object", tuple(items))
    if isinstance(value, list | tuple):
        return ("array", tuple(canonical(v) for v in value))
    raise TypeError(f"not a JSON value: {value!r} ({type(value).__name__})")


def _call_key(name: str, arguments: dict[str, Any]) -> Canonical:
    return (name, canonical(arguments))


@dataclass(frozen=True)
class CallMatch:
    """How the issued calls of a turn line up with the expected ones.

    matched: expected calls that were issued (each issued call satisfies at most one).
    missing: expected calls that were not matched, in expected order.
    unexpected: issued calls that matched nothing, in issue order.
    """

    matched: int
    missing: tuple[ExpectedCall, ...]
    unexpected: tuple[ToolCall, ...]


def _match_unordered(
    expected: Sequence[ExpectedCall], issued: Sequence[ToolCall]
) -> tuple[list[bool], list[bool]]:
    """Multiset matching. Keys are exact canonical forms, so greedy pairing is optimal."""
    exp_keys = [_call_key(e.name, e.arguments) for e in expected]
    exp_used = [False] * len(expected)
    iss_used = [False] * len(issued)
    for j, call in enumerate(issued):
        key = _call_key(call.name, call.arguments)
        for i, exp_key in enumerate(exp_keys):
            if not exp_used[i] and exp_key == key:
                exp_used[i] = iss_used[j] = True
                break
    return exp_used, iss_used


def _match_ordered(
    expected: Sequence[ExpectedCall], issued: Sequence[ToolCall]
) -> tuple[list[bool], list[bool]]:
    """Longest common subsequence: the most expected calls found in issued in the right order.

    LCS rather than a greedy scan, so one missing early call does not void the later ones.
    """
    exp_keys = [_call_key(e.name, e.arguments) for e in expected]
    iss_keys = [_call_key(c.name, c.arguments) for c in issued]
    n, m = len(exp_keys), len(iss_keys)
    # best[i][j]: LCS length of exp_keys[i:] and iss_keys[j:]
    best = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            if exp_keys[i] == iss_keys[j]:
                best[i][j] = best[i + 1][j + 1] + 1
            else:
                best[i][j] = max(best[i + 1][j], best[i][j + 1])
    exp_used, iss_used = [False] * n, [False] * m
    i = j = 0
    while i < n and j < m:
        if exp_keys[i] == iss_keys[j]:
            exp_used[i] = iss_used[j] = True
            i, j = i + 1, j + 1
        elif best[i + 1][j] >= best[i][j + 1]:
            i += 1
        else:
            j += 1
    return exp_used, iss_used


def match_expected_calls(
    expected: Sequence[ExpectedCall], issued: Sequence[ToolCall], ordered: bool
) -> CallMatch:
    """Match the calls a caller issued in a turn against the turn's expected calls.

    Unordered: multiset matching (a call expected twice must be issued twice).
    Ordered: the expected calls must appear in `issued` as a subsequence, in order; other calls
    may sit in between. The match is a longest common subsequence.
    """
    exp_used, iss_used = (_match_ordered if ordered else _match_unordered)(expected, issued)
    return CallMatch(
        matched=sum(exp_used),
        missing=tuple(e for e, used in zip(expected, exp_used, strict=True) if not used),
        unexpected=tuple(c for c, used in zip(issued, iss_used, strict=True) if not used),
    )


def fact_in_answer(fact: str, answer: str) -> bool:
    """Whether `answer` states `fact` as a whole token: "450" is in "you have 450 dollars." but
    not in "1450" or "450.5"; case and spelling must match (a fact is a value a tool gave)."""
    pattern = r"(?<![0-9A-Za-z])" + re.escape(fact) + r"(?![0-9A-Za-z]|\.[0-9])"
    return bool(fact) and re.search(pattern, answer) is not None


def missing_facts(turn: Turn, answer: str) -> list[str]:
    """The turn's expected answer facts that `answer` does not state."""
    return [f for f in turn.answer_facts if not fact_in_answer(f, answer)]


def turn_answers(messages: Sequence[dict[str, Any]]) -> list[str]:
    """Per user turn of a conversation, the text of its last assistant message without tool
    calls ("" when the turn has none): the answer the user got."""
    answers: list[str] = []
    for m in messages:
        if m.get("role") == "user":
            answers.append("")
        elif answers and m.get("role") == "assistant" and not m.get("tool_calls"):
            answers[-1] = str(m.get("content") or "")
    return answers


def turn_score_rules(
    turn: Turn,
    issued: Sequence[ToolCall],
    answer: str = "",
    read_only: frozenset[str] | None = None,
) -> float:
    """Score in [0, 1] of one turn from the calls issued during it and its final answer (see
    the module docstring for the units and the penalties).

    read_only: the world's tools that never change its state; None (an unknown world): every
    unexpected call may change something. A turn with neither expected calls nor facts asks
    for a direct answer: 1.0 when the caller made no call, else 0.0.
    """
    units = len(turn.expected_calls) + len(turn.answer_facts)
    if units == 0:
        return 1.0 if not issued else 0.0
    match = _match_ordered if turn.ordered else _match_unordered
    exp_used, iss_used = match(turn.expected_calls, issued)
    earned = sum(exp_used) + len(turn.answer_facts) - len(missing_facts(turn, answer))
    return max(0.0, min(1.0, (earned - _penalty(issued, iss_used, read_only)) / units))


def _penalty(
    issued: Sequence[ToolCall], matched: Sequence[bool], read_only: frozenset[str] | None
) -> float:
    """What the calls that matched no expected call cost (see the module docstring)."""
    penalty = 0.0
    seen: set[Canonical] = set()
    for call, used in zip(issued, matched, strict=True):
        key = _call_key(call.name, call.arguments)
        if not used:
            if read_only is None or call.name not in read_only:
                penalty += UNEXPECTED_WRITE_PENALTY
            elif key in seen:
                penalty += REPEAT_PENALTY
        seen.add(key)
    return penalty
