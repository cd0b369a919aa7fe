"""Tool schemas and the checked dispatch (envace.envs.schema_check)."""

from __future__ import annotations

from typing import Any

import pytest

from envace.envs.schema_check import ToolTable, argument_errors, check_state_shape, function_tool
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
