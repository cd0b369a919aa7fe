"""What is wrong with a task, and where: the error type of every task-file problem, the text
rendering of paths and values in its messages, and JSON-schema errors translated into them (one
describer per schema keyword)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envace.errors import UserInputError

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

__all__ = [
    "SHOWN_TEXT_LIMIT",
    "TaskFormatError",
    "TaskProblem",
    "format_path",
    "json_type_name",
    "one_line",
    "problem_from_schema_error",
    "short_value",
    "show_text",
]

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
SHOWN_TEXT_LIMIT = 80
_JSON_TYPES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    dict: "object",
    type(None): "null",
}


class TaskFormatError(UserInputError):
    """A task (or a whole task file) that cannot be used, located as precisely as the data allows.

    `line` is None when the file itself cannot be read (or for imported records, which carry
    `record`, their 0-based position); `task_id` is None when the id is missing or unreadable;
    `field` is the path inside the task (`turns[1].checklist[0].weight`), empty for the whole line.
    """

    def __init__(
        self,
        file: str,
        line: int | None,
        task_id: str | None,
        field: str,
        message: str,
        record: int | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.task_id = task_id
        self.field = field
        self.message = message
        self.record = record
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        if self.record is not None:
            where += f" record {self.record}"
        if self.task_id is not None:
            where += f" (id={show_text(self.task_id)})"
        field_part = f"{self.field}: " if self.field else ""
        return f"{where}: {field_part}{self.message}"

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self) -> tuple[Any, ...]:
        # Keeps the error intact across processes (the default would drop the keyword fields).
        args = (self.file, self.line, self.task_id, self.field, self.message, self.record)
        return (type(self), args)


@dataclass(frozen=True)
class TaskProblem:
    """The first thing wrong with a task object: where (field path) and what (message)."""

    field: str
    message: str


# ---------------------------------------------------------------------------------------------
# Paths and messages


def format_path(parts: Iterable[str | int], base: str = "") -> str:
    """Render a JSON path as `turns[1].checklist[0].weight` (keys that need it are quoted)."""
    out = base
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{short_value(part, SHOWN_TEXT_LIMIT)}]"
    return out


def json_type_name(value: Any) -> str:
    """The JSON name of a Python value's type (`object`, `array`, `integer`, ...)."""
    return _JSON_TYPES.get(type(value), type(value).__name__)


def show_text(text: str, *, quote: bool = False, limit: int = SHOWN_TEXT_LIMIT) -> str:
    """A user string (a task id, a tool name) as an error message may show it.

    Escaped like `ascii()`, so a newline or a terminal control code in it cannot fake extra
    lines or colours, and cut to `limit` characters with an ellipsis, so a huge value cannot
    flood the terminal. `quote` keeps the quotes of `ascii()`, as `!r` would.
    """
    literal = ascii(text)
    mark, body = literal[0], literal[1:-1]
    if len(body) > limit:
        body = body[:limit] + "…"
    return f"{mark}{body}{mark}" if quote else body


def short_value(value: Any, limit: int = 60) -> str:
    """A value as JSON, cut short so one error stays one readable line."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def one_line(text: str, limit: int = 300) -> str:
    """A message that quotes user data as one line: whitespace collapsed, cut to `limit`, and
    other control characters (terminal escape codes) escaped."""
    text = " ".join(text.split())
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


# ---------------------------------------------------------------------------------------------
# JSON schema errors -> (extra path parts, message); one describer per schema keyword, each
# called with the failing instance, the keyword's value and the schema that holds the keyword.

_Described = tuple[list[str | int], str]


def _describe_required(instance: Any, value: Any, schema: Any) -> _Described:
    present = instance if isinstance(instance, dict) else {}
    missing = [key for key in value if key not in present]
    return [missing[0]] if missing else [], "required key is missing"


def _describe_additional(instance: Any, value: Any, schema: Any) -> _Described:
    allowed = sorted(schema.get("properties", {}))
    extra = sorted(key for key in instance if key not in allowed)
    return [extra[0]] if extra else [], f"unknown key (allowed: {', '.join(allowed)})"


def _describe_type(instance: Any, value: Any, schema: Any) -> _Described:
    wanted = value if isinstance(value, str) else " or ".join(value)
    return [], f"expected {wanted}, got {json_type_name(instance)}"


def _describe_enum(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"{short_value(instance)} is not one of {', '.join(short_value(v) for v in value)}"


def _describe_const(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"must be {short_value(value)}, got {short_value(instance)}"


def _describe_min_length(instance: Any, value: Any, schema: Any) -> _Described:
    return [], "must not be empty" if value == 1 else f"must be at least {value} characters long"


def _describe_max_length(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"is {len(instance)} characters long, at most {value} allowed"


def _describe_min_items(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"must have at least {value} item{'' if value == 1 else 's'}"


def _describe_pattern(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"{short_value(instance)} does not match the pattern {value}"


def _describe_minimum(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"{short_value(instance)} is below the minimum {value}"


def _describe_maximum(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"{short_value(instance)} is above the maximum {value}"


_DESCRIBERS: dict[str, Callable[[Any, Any, Any], _Described]] = {
    "required": _describe_required,
    "additionalProperties": _describe_additional,
    "type": _describe_type,
    "enum": _describe_enum,
    "const": _describe_const,
    "minLength": _describe_min_length,
    "maxLength": _describe_max_length,
    "minItems": _describe_min_items,
    "pattern": _describe_pattern,
    "minimum": _describe_minimum,
    "maximum": _describe_maximum,
}


def problem_from_schema_error(error: ValidationError, base: str = "") -> TaskProblem:
    describer = _DESCRIBERS.get(str(error.validator))
    described: _Described = (
        ([], one_line(error.message))
        if describer is None
        else describer(error.instance, error.validator_value, error.schema)
    )
    extra, message = described
    return TaskProblem(format_path([*error.absolute_path, *extra], base), message)
