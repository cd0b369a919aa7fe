"""Rule-based grading of tool calls: for tasks whose expected calls are known exactly.

Arguments are compared canonically, as JSON values: dict key order does not matter, an int equals
a float of the same value (50 == 50.0), booleans are not numbers (True != 1), and strings must
match exactly (no case folding or trimming: a wrong date string is a wrong call).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from envace.policy.types import ToolCall
from envace.tasks.model import ExpectedCall, Turn

__all__ = ["CallMatch", "canonical", "match_expected_calls", "turn_score_rules"]

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


def turn_score_rules(turn: Turn, issued: Sequence[ToolCall]) -> float:
    """Score in [0, 1] of one turn from the calls issued during it.

    With expected calls: the fraction of them that were matched. Unexpected extra calls cost
    nothing (a harmless look-up must not be punished; a harmful one shows up in the final-state
    rule). Without expected calls the turn asks for a direct answer: 1.0 when the caller made no
    call, else 0.0.
    """
    if not turn.expected_calls:
        return 1.0 if not issued else 0.0
    match = match_expected_calls(turn.expected_calls, issued, turn.ordered)
    return match.matched / len(turn.expected_calls)
