"""World-state helpers: success rules and deterministic opaque ids.

A task's success rule is `{"final_state": <state>, "match": "whole" | "subset", "free": [...]}`.

- `whole` (what `envace tasks generate` writes): the real world's final snapshot must equal the
  expected final state everywhere — every key present on both sides, nothing extra — except
  the paths listed in `free` (each a list of keys, e.g. `["ids", "next"]`), which are ignored
  on both sides. A harmful call anywhere in the world (deleting another file, paying another
  customer) therefore fails the task, the tau-bench way.
- `subset` (the default when `match` is absent, i.e. task files written before whole-state
  rules): the snapshot must contain the given state. Dicts match as subsets (extra keys in
  the state are fine); every other value, lists included, must be equal. A list is compared
  whole because list order and length carry meaning (a directory listing, a transaction
  history).
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Sized
from typing import Any

from envace.errors import UserInputError

__all__ = [
    "ID_SPACE",
    "MAX_ID_DRAWS",
    "final_state_matches",
    "first_difference",
    "first_mismatch",
    "id_room_problem",
    "next_opaque_id",
    "success_mismatch",
]


def final_state_matches(expected_subset: Any, state: Any) -> bool:
    """True when `state` contains `expected_subset` (nested dict subset, other values equal)."""
    return first_mismatch(expected_subset, state) is None


def first_mismatch(expected_subset: Any, state: Any, path: str = "$") -> str | None:
    """Where `state` first fails to contain `expected_subset`, as a readable line; None if it does.

    Example: `$.accounts.ACC-7f3a.balance: expected 450, got 500`.
    """
    return _first_gap(expected_subset, state, path, whole=False)


def first_difference(expected: Any, state: Any, path: str = "$") -> str | None:
    """Where `state` first differs from `expected` as a whole (same keys everywhere, equal
    values), as a readable line; None when they are equal.

    Example: `$.files./docs/b.txt: not expected (got 'secret')` for a file that should not be.
    """
    return _first_gap(expected, state, path, whole=True)


def _first_gap(expected: Any, state: Any, path: str, whole: bool) -> str | None:
    """The one walk behind both rules: objects key by key (`whole`: no extra keys either, and
    equal-length lists element by element, for a precise line); anything else JSON-equal."""
    if isinstance(expected, dict):
        if not isinstance(state, dict):
            return f"{path}: expected an object, got {_short(state)}"
        for key, value in expected.items():
            if key not in state:
                return f"{path}.{key}: missing"
            found = _first_gap(value, state[key], f"{path}.{key}", whole)
            if found is not None:
                return found
        extra = [key for key in state if key not in expected] if whole else []
        return f"{path}.{extra[0]}: not expected (got {_short(state[extra[0]])})" if extra else None
    lists = isinstance(expected, list) and isinstance(state, list)
    if whole and lists and len(expected) == len(state):
        for i, (a, b) in enumerate(zip(expected, state, strict=True)):
            found = _first_gap(a, b, f"{path}[{i}]", whole)
            if found is not None:
                return found
        return None
    if not _json_equal(expected, state):
        return f"{path}: expected {_short(expected)}, got {_short(state)}"
    return None


def success_mismatch(rule: dict[str, Any], state: Any) -> str | None:
    """Where the final `state` fails a task's success rule (see the module docstring), as a
    readable line; None when the rule holds."""
    expected = rule["final_state"]
    if rule.get("match", "subset") == "subset":
        return first_mismatch(expected, state)
    free = [tuple(str(k) for k in p) for p in rule.get("free", ())]
    return first_difference(_without(expected, free), _without(state, free))


def _without(value: Any, paths: list[tuple[str, ...]]) -> Any:
    """A copy of `value` with each path (a key sequence through objects) removed if present."""
    if not paths or not isinstance(value, dict):
        return value
    heads = {p[0] for p in paths if len(p) == 1}
    deeper: dict[str, list[tuple[str, ...]]] = {}
    for p in paths:
        if len(p) > 1:
            deeper.setdefault(p[0], []).append(p[1:])
    return {k: _without(v, deeper.get(k, [])) for k, v in value.items() if k not in heads}


def _json_equal(a: Any, b: Any) -> bool:
    """Equality in JSON terms: `true` is not `1` (Python says it is), `1` equals `1.0`."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and bool(a == b)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# An opaque id is PREFIX-xxxx: 4 hex digits, 65,536 ids per prefix. A world refuses an initial
# state that already holds more than half of them (`id_room_problem`), so a draw finds a free id
# within a few tries; MAX_ID_DRAWS bounds the search whatever the state holds.
ID_SPACE = 16**4
MAX_ID_DRAWS = 1024


def id_room_problem(what: str, taken: Sized) -> str | None:
    """Why a state's collection `what` leaves too little room for new opaque ids, or None."""
    most = ID_SPACE // 2
    if len(taken) <= most:
        return None
    return f"{what}: {len(taken)} entries leave no room for new ids (at most {most})"


def next_opaque_id(ids: dict[str, Any], prefix: str, taken: Container[str]) -> str:
    """Draw the next id like `TX-7f3a` from the state's id counter `{"salt", "next"}`.

    The id is a hash of (salt, prefix, counter): it looks random, so an agent cannot guess it
    and must read it from a tool result, yet the same state and call sequence always give the
    same ids. The counter lives in the state, so a snapshot replays exactly. After MAX_ID_DRAWS
    taken ids in a row it raises UserInputError: the state leaves no room (never a loop).
    """
    for _ in range(MAX_ID_DRAWS):
        counter = int(ids["next"])
        ids["next"] = counter + 1
        digest = hashlib.sha256(f"{ids['salt']}:{prefix}:{counter}".encode()).hexdigest()
        candidate = f"{prefix}-{digest[:4]}"
        if candidate not in taken:
            return candidate
    raise UserInputError(
        f"no free {prefix} id after {MAX_ID_DRAWS} draws: the world's state holds too many "
        f"{prefix} ids; give the task an initial_state with fewer entries"
    )
