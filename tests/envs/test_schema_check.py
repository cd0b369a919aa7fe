"""Tool schemas and the checked dispatch (envace.envs.schema_check)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.envs import schema_check
from envace.envs.schema_check import (
    MAX_SCHEMA_DEPTH,
    ToolTable,
    argument_errors,
    arguments_valid,
    check_state_shape,
    function_tool,
    parameters_problem,
    pattern_problem,
    pattern_search,
)
from envace.errors import UserInputError

ADD = function_tool(
    "add",
    "Add two whole numbers.",
    {"a": {"type": "integer"}, "b": {"type": "integer", "minimum": 0}},
)


def _add(args: dict[str, Any]) -> dict[str, Any]:
    args["a"] = "changed"  # handlers get a private copy: the caller must not see this
    return {"ok": True}


def test_function_tool_has_openai_shape_and_closed_parameters() -> None:
    assert ADD["type"] == "function"
    params = ADD["function"]["parameters"]
    assert params["required"] == ["a", "b"]
    assert params["additionalProperties"] is False
    optional = function_tool("f", "d", {"x": {"type": "string"}}, required=[])
    assert optional["function"]["parameters"]["required"] == []


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"a": 1, "b": 2}, []),
        ({"a": 1.0, "b": 2}, ["$.a: 1.0 is not of type 'integer'"]),  # no silent floats
        ({"a": True, "b": 2}, ["$.a: True is not of type 'integer'"]),
        ({"a": 1}, ["$: 'b' is a required property"]),
        ({"a": 1, "b": -1}, ["$.b: -1 is less than the minimum of 0"]),
        (
            {"a": 1, "b": 2, "c": 3},
            ["$: Additional properties are not allowed ('c' was unexpected)"],
        ),
        ([1, 2], ["$: [1, 2] is not of type 'object'"]),
    ],
)
def test_argument_errors(arguments: Any, expected: list[str]) -> None:
    assert argument_errors(ADD["function"]["parameters"], arguments) == expected


def test_table_dispatches_valid_calls_on_a_copy() -> None:
    table = ToolTable("calc", [ADD], {"add": _add})
    args = {"a": 1, "b": 2}
    assert table.call("add", args) == {"ok": True}
    assert args == {"a": 1, "b": 2}


def test_table_rejects_unknown_tools_and_bad_arguments_without_running() -> None:
    ran: list[dict[str, Any]] = []
    table = ToolTable("calc", [ADD], {"add": lambda a: ran.append(a) or {"ok": True}})
    unknown = table.call("sub", {"a": 1})
    assert unknown["error"]["code"] == "UNKNOWN_TOOL"
    assert "available: add" in unknown["error"]["message"]
    assert table.call(None, {})["error"]["code"] == "UNKNOWN_TOOL"
    bad = table.call("add", {"a": "1", "b": 2})
    assert bad["error"]["code"] == "INVALID_ARGUMENTS"
    assert bad["error"]["details"]["errors"] == ["$.a: '1' is not of type 'integer'"]
    assert ran == []


def test_table_schemas_are_copies() -> None:
    table = ToolTable("calc", [ADD], {"add": _add})
    table.schemas()[0]["function"]["name"] = "mutated"
    assert table.schemas()[0]["function"]["name"] == "add"


def test_table_refuses_schemas_without_handlers() -> None:
    with pytest.raises(ValueError, match="differ"):
        ToolTable("calc", [ADD], {})


def test_check_state_shape_names_the_world_and_the_field() -> None:
    schema = {"type": "object", "required": ["items"], "properties": {"items": {"type": "object"}}}
    check_state_shape("shop", schema, {"items": {}})
    with pytest.raises(UserInputError, match=r"shop initial_state is malformed: \$.items: 3"):
        check_state_shape("shop", schema, {"items": 3})


def test_error_lines_do_not_echo_huge_values() -> None:
    """The message quotes the bad value; a model can send megabytes, and the line becomes the
    tool result in its context: it is cut at 200 characters, saying how long it was."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    (line,) = argument_errors(schema, {"n": "x" * 1_000_000})
    assert line.startswith("$.n: 'xxx") and line.endswith(" chars)")
    assert len(line) < 260
    (short,) = argument_errors(schema, {"n": "5"})
    assert short == "$.n: '5' is not of type 'integer'"


# ---------------------------------------------------------------------------------------------
# Patterns without backtracking (issue #20)

PATTERNS = [
    r"^[A-Za-z_][A-Za-z0-9_.\-]{0,12}$",
    r"(a|bc)*\d+\b",
    r"\bab\B",
    r"^$",
    r"",
    r"a{2,3}b?",
    r"[^\w\s-]+",
    r"(ab|a)*c",
    r"^(/|(/[A-Za-z0-9_-][A-Za-z0-9_.-]*)+)$",
    r"\Aa.b\Z",
    r"(?:a|)+b",
    r"[a-c]{3,}?d",
    r"\s\S\d\D\W",
]


@settings(max_examples=150, deadline=None)
@given(
    pattern=st.sampled_from(PATTERNS),
    text=st.text(alphabet="abcd_1 -/.\n\u0663é", max_size=10),
)
def test_patterns_answer_as_python_re_would(pattern: str, text: str) -> None:
    """The same yes/no as re.search, with `$` read as the end of the text (\\Z)."""
    expected = re.search(pattern.replace("$", r"\Z"), text) is not None
    assert pattern_search(pattern, text) is expected


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        (r"^(a+)+$", "a" * 40 + "!"),  # exponential for a backtracking engine
        (r"(a|a)*b", "a" * 50_000),
        (r"\d+x", "1" * 50_000),  # quadratic for one
        (r"a*a*b", "a" * 50_000),  # cubic
    ],
)
def test_catastrophic_patterns_cost_linear_time(pattern: str, text: str) -> None:
    started = time.monotonic()
    assert pattern_search(pattern, text) is False
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(a)\1", "backreferences"),
        (r"(?=a)", "lookahead/lookbehind"),
        (r"(?<!a)b", "lookahead/lookbehind"),
        (r"(?>a)", "atomic groups"),
        (r"a++", "possessive repeats"),
        (r"(?i)a", "inline flags"),
        (r"(?s:.)", "inline flags"),
        ("(" * 33 + ")" * 33, "groups nest more than 32 deep"),
        (r"(a{100}){100}", "more than 1000 states"),
        (r"a{99999999999}", "the repetition number is too large"),
    ],
)
def test_patterns_that_need_backtracking_or_are_too_big_are_refused(
    pattern: str, reason: str
) -> None:
    problem = pattern_problem(pattern)
    assert problem is not None and reason in problem
    assert pattern_problem(r"^[0-9]{4}$") is None


def test_a_match_too_costly_fails_with_a_reason_instead_of_running_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(schema_check, "MAX_MATCH_STEPS", 50)
    schema_check._automaton.cache_clear()
    schema = {"type": "string", "pattern": "(a|b)*a(a|b){8}$"}
    (line,) = argument_errors(schema, "ab" * 40)
    assert "cannot be checked against" in line and "more than 50 steps" in line


def test_dollar_is_the_end_of_the_text() -> None:
    schema = {"type": "string", "pattern": "^[0-9]{4}$"}
    assert argument_errors(schema, "1234") == []
    assert argument_errors(schema, "1234\n") == ["$: '1234\\n' does not match '^[0-9]{4}$'"]


# ---------------------------------------------------------------------------------------------
# Vetting parameter schemas (issue #20)


@pytest.mark.parametrize(
    ("schema", "path", "reason"),
    [
        (
            {"properties": {"a": {"$ref": "https://example.com/a.json"}}},
            ("properties", "a", "$ref"),
            "points outside the schema",
        ),
        (
            {"properties": {"a": {"$ref": "file:///etc/passwd"}}},
            ("properties", "a", "$ref"),
            "never fetched",
        ),
        (
            {"properties": {"a": {"$ref": "other.json#/x"}}},
            ("properties", "a", "$ref"),
            "points outside",
        ),
        ({"$ref": "#"}, ("$ref",), "recursive schema"),
        ({"properties": {"child": {"$ref": "#"}}}, ("properties", "child", "$ref"), "recursive"),
        (
            {
                "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                "$ref": "#/$defs/a",
            },
            ("$defs", "b", "$ref"),
            "recursive",
        ),
        ({"$ref": "#/$defs/x"}, ("$ref",), "points at nothing"),
        ({"$defs": {"x": 3}, "$ref": "#/$defs/x"}, ("$defs", "x"), ""),  # not even a schema
        ({"patternProperties": {"^a": {}}}, ("patternProperties",), "patternProperties"),
        (
            {"properties": {"a": {"$dynamicRef": "#x"}}},
            ("properties", "a", "$dynamicRef"),
            "not supported",
        ),
        (
            {"properties": {"a": {"$id": "http://x/", "type": "string"}}},
            ("properties", "a", "$id"),
            "only allowed at the top",
        ),
        ({"properties": {"a": {"pattern": "(?=x)"}}}, ("properties", "a", "pattern"), "lookahead"),
        (
            {"properties": {"a": {"pattern": "("}}},
            ("properties", "a", "pattern"),
            "is not a 'regex'",
        ),
    ],
)
def test_parameter_schemas_that_cannot_be_checked_are_refused(
    schema: dict[str, Any], path: tuple[Any, ...], reason: str
) -> None:
    problem = parameters_problem(schema)
    assert problem is not None and problem.path == path and reason in problem.message


def test_a_long_chain_of_refs_is_refused_without_recursing() -> None:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(5000)}
    defs["d5000"] = {"type": "string"}
    problem = parameters_problem({"$defs": defs, "$ref": "#/$defs/d0"})
    assert problem is not None and f"more than {MAX_SCHEMA_DEPTH} deep" in problem.message


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"x": True, "y": False, "z": {"enum": []}}},
        {"$defs": {"id": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/id"}}},
        {"properties": {"a": {"$ref": "#/properties/b"}, "b": {"type": "integer"}}},
        {"$id": "https://example.com/p.json", "properties": {"name": {"pattern": "^(a+)+$"}}},
    ],
)
def test_usable_parameter_schemas_pass(schema: dict[str, Any]) -> None:
    assert parameters_problem(schema) is None


def test_an_unvetted_remote_ref_is_never_fetched(monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.request

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("a $ref was fetched")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    schema = {"properties": {"a": {"$ref": "http://127.0.0.1:9/x.json"}}}
    assert arguments_valid(schema, {"a": 1}) is False
    assert arguments_valid({"properties": {"n": {"type": "integer"}}}, {"n": 430.0}) is False
