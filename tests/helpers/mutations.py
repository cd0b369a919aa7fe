"""Random JSON values and in-place mutations for the fuzz suites (tests/fuzz): the values aim at
what broke before (wrong JSON types, integers as floats, edge doubles, lone surrogates, newlines
in names, deep nesting, hostile schemas)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

__all__ = ["FUZZ_SETTINGS", "SCHEMAS", "VALUES", "mutate", "parent_of", "paths"]

# Every fuzz suite: 60 examples of at most 3 s each (a few minutes in all on 2 cores).
FUZZ_SETTINGS = settings(
    max_examples=60,
    deadline=3000,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


def _deep(levels: int) -> Any:
    value: Any = "leaf"
    for i in range(levels):
        value = {"a": value} if i % 2 else [value]
    return value


SCHEMAS = st.sampled_from(
    [
        True,
        False,
        {},
        {"$ref": "#"},
        {"$ref": "http://127.0.0.1:9/never.json"},
        {"$ref": "file:///etc/passwd"},
        {"$ref": "#/$defs/missing"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"type": "object", "properties": {"child": {"$ref": "#"}}},
        {"enum": []},
        {"enum": [1, "x", None]},
        {"type": "integer"},
        {"type": ["string", "null"]},
        {"type": "string", "pattern": "^(a+)+$"},
        {"type": "string", "pattern": "(?=a)a"},
        {"type": "string", "pattern": "a{99999999999}"},
        {"type": "string", "pattern": "(" * 40 + ")" * 40},
        {"patternProperties": {"^x": {}}},
        {"type": 3},
        {"properties": {"x": True, "y": False}},
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.sampled_from([430.0, 0.1, -0.0, 1e308, 5e-324, 1e16]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["", "\ud800", "a\udfff", "f\n", "x\u2028y", "\x1b[31m", "a" * 41 + "!"]),
)
VALUES = st.one_of(
    SCALARS,
    SCHEMAS,
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.text(max_size=6), SCALARS, max_size=3),
    st.sampled_from([_deep(70), _deep(30)]),
)


def paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location inside a JSON value (the value itself first)."""
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += paths(item, (*path, i))
    return found


def parent_of(data: Any, path: tuple[Any, ...]) -> Any:
    for key in path[:-1]:
        data = data[key]
    return data


def mutate(draw: st.DrawFn, data: Any, most: int = 3) -> Any:
    """1..`most` random edits of `data` in place (replace, delete, insert a key, duplicate a list
    item); returns it. Values are copies: an edit never reaches the strategy's pool."""
    for _ in range(draw(st.integers(1, most))):
        where = paths(data)[1:]
        if not where:
            return data
        path = draw(st.sampled_from(where))
        parent, last = parent_of(data, path), path[-1]
        action = draw(st.sampled_from(["replace", "delete", "insert", "duplicate"]))
        if action == "replace":
            parent[last] = copy.deepcopy(draw(VALUES))
        elif action == "delete":
            del parent[last]
        elif action == "insert" and isinstance(parent[last], dict):
            key = draw(st.sampled_from(["x", "$ref", "enum", "pattern", "type", "role", "content"]))
            parent[last][key] = copy.deepcopy(draw(VALUES))
        elif action == "duplicate" and isinstance(parent[last], list) and parent[last]:
            parent[last].append(copy.deepcopy(parent[last][0]))
    return data
