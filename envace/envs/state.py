"""World-state helpers: success rules (nested subset match) and deterministic opaque ids.

A task's success rule is `{"final_state": <subset>}`: the real world's final snapshot must
contain the subset. Dicts match as subsets (extra keys in the state are fine); every other
value, lists included, must be equal. A list is compared whole because list order and
length carry meaning (a directory listing, a transaction history): "the folder holds exactly
these entries" is how a rule says that something was deleted or moved away.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container
from typing import Any

__all__ = ["final_state_matches", "first_mismatch", "next_opaque_id"]


def final_state_matches(expected_subset: Any, state: Any) -> bool:
    """True when `state` contains `expected_subset` (nested dict subset, other values equal)."""
    return first_mismatch(expected_subset, state) is None


def first_mismatch(expected_subset: Any, state: Any, path: str = "$") -> str | None:
    """Where `state` first fails to contain `expected_subset`, as a readable line; None if it does.

    Example: `$.accounts.ACC-7f3a.balance: expected 450, got 500`.
    """
    if isinstance(expected_subset, dict):
        if not isinstance(state, dict):
            return f"{path}: expected an object, got {_short(state)}"
        for key, value in expected_subset.items():
            if key not in state:
                return f"{path}.{key}: missing"
            found = first_mismatch(value, state[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if not _json_equal(expected_subset, state):
        return f"{path}: expected {_short(expected_subset)}, got {_short(state)}"
    return None


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


def next_opaque_id(ids: dict[str, Any], prefix: str, taken: Container[str]) -> str:
    """Draw the next id like `TX-7f3a` from the state's id counter `{"salt", "next"}`.

    The id is a hash of (salt, prefix, counter): it looks random, so an agent cannot guess it
    and must read it from a tool result, yet the same state and call sequence always give the
    same ids. The counter lives in the state, so a snapshot replays exactly.
    """
    while True:
        counter = int(ids["next"])
        ids["next"] = counter + 1
        digest = hashlib.sha256(f"{ids['salt']}:{prefix}:{counter}".encode()).hexdigest()
        candidate = f"{prefix}-{digest[:4]}"
        if candidate not in taken:
            return candidate
