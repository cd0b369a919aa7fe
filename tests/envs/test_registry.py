"""The registry and the contract every world shares."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema
import pytest

from envace.envs import Environment, environment_names, is_error_result, make_environment
from envace.errors import UserInputError


def test_names_and_lookup() -> None:
    assert environment_names() == ["bank", "files", "inventory"]
    for name in environment_names():
        world = make_environment(name)
        assert world.name == name
        assert isinstance(world, Environment)
        assert make_environment(name) is not world  # one instance per episode


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UserInputError, match=r"unknown environment 'shop'.*bank, files, inventory"):
        make_environment("shop")


def _task_schema() -> dict[str, Any]:
    text = resources.files("envace.tasks").joinpath("schema/task.schema.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


@pytest.mark.parametrize("name", ["bank", "files", "inventory"])
def test_every_world_honours_the_contract(name: str) -> None:
    world = make_environment(name)
    tools = world.tools()
    tool_schema = _task_schema()["properties"]["tools"]
    jsonschema.validate(tools, tool_schema)
    for tool in tools:
        jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])
        assert tool["function"]["parameters"]["additionalProperties"] is False
        assert tool["function"]["description"]
    empty = world.snapshot()
    json.dumps(empty)
    unknown = world.call("no_such_tool", {})
    assert is_error_result(unknown) and unknown["error"]["code"] == "UNKNOWN_TOOL"
    first = tools[0]["function"]["name"]
    bad = world.call(first, {"unexpected": 1})
    assert bad["error"]["code"] == "INVALID_ARGUMENTS"
    assert world.snapshot() == empty
    tools[0]["function"]["name"] = "mutated"
    assert world.tools()[0]["function"]["name"] == first
