"""Tool schemas and the checked dispatch every world shares.

A world validates each call against the tool's JSON schema before running it, so handlers only
ever see well-typed arguments; a bad call is answered with an `INVALID_ARGUMENTS` result (as a
real API answers 400) and an unknown tool with `UNKNOWN_TOOL`. Nothing is ever evaluated.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError

from envace.envs.base import tool_error
from envace.errors import UserInputError

__all__ = [
    "ToolHandler",
    "ToolTable",
    "argument_errors",
    "check_state_shape",
    "function_tool",
]

ToolHandler = Callable[[dict[str, Any]], dict[str, Any]]


def _is_strict_integer(_checker: object, instance: object) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


# JSON Schema counts 5.0 as an integer; accepting it would turn whole-dollar balances and stock
# counts into floats and break exact state equality, so "integer" means a JSON integer literal.
_TYPE_CHECKER = Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_strict_integer)
_StrictValidator = jsonschema.validators.extend(Draft202012Validator, type_checker=_TYPE_CHECKER)


@functools.lru_cache(maxsize=256)
def _cached_validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return _StrictValidator(schema)


def _validator_for(schema: Mapping[str, Any]) -> Any:
    """A checked validator for `schema`; checking a schema costs far more than using it, and
    every episode builds a fresh world from the same few schemas, so validators are shared."""
    return _cached_validator(json.dumps(schema, sort_keys=True))


def function_tool(
    name: str,
    description: str,
    properties: Mapping[str, dict[str, Any]],
    required: Sequence[str] | None = None,
) -> dict[str, Any]:
    """An OpenAI function-tool schema; every property is required unless `required` says so."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": copy.deepcopy(dict(properties)),
                "required": list(properties if required is None else required),
                "additionalProperties": False,
            },
        },
    }


# A message quotes the offending value; a model can send megabytes, and the message goes back
# into its context as the tool result.
_MAX_MESSAGE_CHARS = 200


def _error_line(error: ValidationError) -> str:
    message = error.message
    if len(message) > _MAX_MESSAGE_CHARS:
        message = f"{message[:_MAX_MESSAGE_CHARS]}... ({len(message)} chars)"
    return f"{error.json_path}: {message}"


def argument_errors(parameters: Mapping[str, Any], arguments: Any) -> list[str]:
    """Every way `arguments` breaks the `parameters` schema, one short line each, sorted."""
    return sorted(_error_line(e) for e in _validator_for(parameters).iter_errors(arguments))


def check_state_shape(world: str, schema: Mapping[str, Any], state: Any) -> None:
    """Raise UserInputError when an initial state does not have the world's state shape."""
    errors = argument_errors(schema, state)
    if errors:
        shown = "; ".join(errors[:5])
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        raise UserInputError(
            f"{world} initial_state is malformed: {shown}{more}; "
            f"fix the task's environment.initial_state (see docs/worlds.md)"
        )


class ToolTable:
    """The tools of one world: their schemas, their handlers, and the checked dispatch."""

    def __init__(
        self,
        world: str,
        tools: Sequence[dict[str, Any]],
        handlers: Mapping[str, ToolHandler],
    ) -> None:
        names = [str(tool["function"]["name"]) for tool in tools]
        if sorted(names) != sorted(handlers):
            raise ValueError(
                f"{world}: tool schemas {names} and handlers {sorted(handlers)} differ"
            )
        self._world = world
        self._tools = copy.deepcopy(list(tools))
        self._handlers = dict(handlers)
        self._validators = {
            str(tool["function"]["name"]): _validator_for(tool["function"]["parameters"])
            for tool in tools
        }

    def schemas(self) -> list[dict[str, Any]]:
        """Deep copies of the OpenAI function-tool schemas."""
        return copy.deepcopy(self._tools)

    def call(self, name: Any, arguments: Any) -> dict[str, Any]:
        """Check the tool name and the arguments, then run the handler on a private copy."""
        if not isinstance(name, str) or name not in self._handlers:
            known = ", ".join(sorted(self._handlers))
            return tool_error(
                "UNKNOWN_TOOL", f"{self._world} has no tool {name!r}; available: {known}"
            )
        validator = self._validators[name]
        errors = sorted(_error_line(e) for e in validator.iter_errors(arguments))
        if errors:
            return tool_error(
                "INVALID_ARGUMENTS", f"arguments of {name} break its schema", errors=errors
            )
        return self._handlers[name](copy.deepcopy(arguments))
