"""Schema validity of a tool call against the task's tool list (valid-call rate)."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

import jsonschema

from envace.policy.types import ToolCall
from envace.tasks.model import Task

__all__ = ["call_is_schema_valid"]


@lru_cache(maxsize=4096)
def _validator(schema_json: str) -> Any:
    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def call_is_schema_valid(task: Task, call: ToolCall) -> bool:
    """True when the task offers the tool and the arguments satisfy its parameter schema."""
    fn = task.tool_schema(call.name)
    if fn is None:
        return False
    schema = fn.get("parameters") or {"type": "object"}
    validator = _validator(json.dumps(schema, sort_keys=True))
    return bool(validator.is_valid(call.arguments))
