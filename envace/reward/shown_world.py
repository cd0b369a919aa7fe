"""Grading a rehearsed turn against the world the rehearsal showed the caller.

The rule grader (`envace.reward.rules`) holds a turn's expected calls and answer facts with the
values the *real* world gave the gold calls: account and order ids, balances. In a rehearsed
episode the caller sees imagined results instead; a caller that uses the imagined account id it
was shown, or reports the imagined balance, is graded wrong for doing exactly what it should do
in a real world. `bench/reward_bias.py` measures how often that decides a turn.

The translation here undoes it without a world: where the episode made a call the task's logged
conversation also made (same tool, same arguments; the simulator's grounding), the logged real
result and the rehearsed one are aligned leaf by leaf (same JSON path, both strings or numbers,
values differ): that real value *was shown as* the rehearsed one. The turn's expected argument
values and answer facts are translated through that table before the rules grade it. Values the
user or the system prompt stated are never translated (the caller knew them without the
rehearsal). Nothing else changes: a caller that ignores what it was shown, or makes calls nobody
expected, scores as before. Evaluation (real mode) never uses it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from envace.policy.prompts import grounding_from_reference
from envace.reward.fidelity import canonical_json
from envace.reward.rules import fact_in_answer
from envace.tasks.model import ExpectedCall, Task, Turn

__all__ = [
    "ValueKey",
    "aligned_values",
    "logged_results",
    "parse_result",
    "shown_world_table",
    "translate_turn",
    "value_key",
]

ValueKey = tuple[str, str]  # a value's type-aware, hashable key (`value_key`)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, scalar) of every leaf of a JSON value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    else:
        yield path, value


def value_key(value: Any) -> ValueKey:
    """A hashable key: 1 and 1.0 are one number (as the rules compare), True is not 1."""
    if isinstance(value, bool) or value is None:
        return ("const", json.dumps(value))
    if isinstance(value, (int, float)):
        return ("num", repr(float(value)))
    return ("str", str(value))


def _carried(value: Any) -> bool:
    """A string or a number: what a call carries on (not a flag, a null or a container)."""
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def aligned_values(real: Any, rehearsed: Any, said: str = "") -> dict[ValueKey, Any]:
    """Real value -> the rehearsed value at the same JSON path, where both are strings or
    numbers and differ. Values `said` states as a whole token (what the user and the system
    prompt told the caller) are left out."""
    imagined = dict(_leaves(rehearsed))
    out: dict[ValueKey, Any] = {}
    for path, value in _leaves(real):
        other = imagined.get(path)
        if not (_carried(value) and _carried(other)) or fact_in_answer(str(value), said):
            continue
        if value_key(value) != value_key(other):
            out.setdefault(value_key(value), other)
    return out


def _translate(value: Any, table: Mapping[ValueKey, Any]) -> Any:
    if isinstance(value, dict):
        return {k: _translate(v, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_translate(v, table) for v in value]
    if not _carried(value):
        return value
    return table.get(value_key(value), value)


def translate_turn(turn: Turn, table: Mapping[ValueKey, Any]) -> Turn:
    """`turn` with its expected calls' argument values and answer facts as the rehearsal showed
    them (values the table maps; everything else as it was)."""
    if not table:
        return turn
    calls = tuple(
        ExpectedCall(c.name, _translate(dict(c.arguments), table)) for c in turn.expected_calls
    )
    facts = tuple(str(table.get(value_key(f), f)) for f in turn.answer_facts)
    return Turn(turn.user, turn.checklist, calls, turn.ordered, facts)


def parse_result(text: str) -> Any:
    """A tool message's content as JSON (the text itself when it is not JSON)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def logged_results(task: Task) -> dict[tuple[str, str], Any]:
    """The real results the task's logged conversation holds, by (tool, canonical arguments)."""
    out: dict[tuple[str, str], Any] = {}
    for ex in grounding_from_reference(task.reference):
        out.setdefault((ex.name, canonical_json(ex.arguments)), parse_result(ex.result))
    return out


def shown_world_table(task: Task, messages: Sequence[dict[str, Any]]) -> dict[ValueKey, Any]:
    """Real value -> shown value, from the calls of `messages` (an episode so far) that the
    task's logged conversation also made."""
    logged = logged_results(task)
    if not logged:
        return {}
    said = "\n".join(
        str(m.get("content") or "") for m in messages if m.get("role") in ("system", "user")
    )
    table: dict[ValueKey, Any] = {}
    for ex in grounding_from_reference(messages):
        real = logged.get((ex.name, canonical_json(ex.arguments)))
        if real is None:
            continue
        for k, v in aligned_values(real, parse_result(ex.result), said).items():
            table.setdefault(k, v)
    return table
