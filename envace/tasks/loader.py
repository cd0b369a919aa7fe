"""Load and validate task files (JSON Lines, one task per line; see docs/task_format.md).

Validation is the JSON schema shipped in `envace/tasks/schema/` plus the checks a schema cannot
express: unique ids, checklist weights summing to 1, expected calls that match a tool and its
parameter schema, a known environment, at least one way to grade the task. Every problem becomes
a `TaskFormatError` naming the file, the line, the task id and the field path, e.g.
`tasks.jsonl:17 (id=bank-3): turns[1].checklist[0].weight: weights of turn 1 sum to 0.8,
expected 1`.

jsonschema is imported on first validation, not at import time, so `envace --help` and
`import envace.tasks` stay fast.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace.errors import UserInputError
from envace.tasks.io import task_from_dict
from envace.tasks.model import Task

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

__all__ = [
    "CHECKLIST_KEYS",
    "LoadResult",
    "TaskFormatError",
    "TaskProblem",
    "check_task",
    "format_path",
    "json_type_name",
    "load_gold",
    "load_tasks",
    "parse_json_strict",
    "show_text",
]

logger = logging.getLogger(__name__)

WEIGHT_TOLERANCE = 1e-6
SHOWN_TEXT_LIMIT = 80
REFERENCE_ROLES = ("assistant", "system", "tool", "user")
# The keys of a checklist item, in the order the task format lists them.
CHECKLIST_KEYS = (
    "id",
    "question",
    "focus_on",
    "pass_condition",
    "failure_examples",
    "weight",
    "required_for_next_turn",
)
_EXPECTED_CALL_KEYS = frozenset({"name", "arguments"})
_ENVIRONMENT_KEYS = frozenset({"name", "initial_state"})
_SUCCESS_KEYS = frozenset({"final_state", "match", "free"})
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")
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


@dataclass(frozen=True)
class LoadResult:
    """The tasks of a file and, with `skip_invalid`, the errors of the tasks left out."""

    tasks: list[Task]
    skipped: list[TaskFormatError] = field(default_factory=list)


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
            out += f"[{_short(part, SHOWN_TEXT_LIMIT)}]"
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


def _short(value: Any, limit: int = 60) -> str:
    """A value as JSON, cut short so one error stays one readable line."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _one_line(text: str, limit: int = 300) -> str:
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
    return [], f"{_short(instance)} is not one of {', '.join(_short(v) for v in value)}"


def _describe_const(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"must be {_short(value)}, got {_short(instance)}"


def _describe_min_length(instance: Any, value: Any, schema: Any) -> _Described:
    return [], "must not be empty" if value == 1 else f"must be at least {value} characters long"


def _describe_max_length(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"is {len(instance)} characters long, at most {value} allowed"


def _describe_min_items(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"must have at least {value} item{'' if value == 1 else 's'}"


def _describe_pattern(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"{_short(instance)} does not match the pattern {value}"


def _describe_minimum(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"{_short(instance)} is below the minimum {value}"


def _describe_maximum(instance: Any, value: Any, schema: Any) -> _Described:
    return [], f"{_short(instance)} is above the maximum {value}"


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


def _problem_from_schema_error(error: ValidationError, base: str = "") -> TaskProblem:
    describer = _DESCRIBERS.get(str(error.validator))
    described: _Described = (
        ([], _one_line(error.message))
        if describer is None
        else describer(error.instance, error.validator_value, error.schema)
    )
    extra, message = described
    return TaskProblem(format_path([*error.absolute_path, *extra], base), message)


# ---------------------------------------------------------------------------------------------
# Schema validation


@lru_cache(maxsize=1)
def _task_validator() -> Validator:
    from jsonschema import Draft202012Validator

    text = resources.files("envace.tasks").joinpath("schema/task.schema.json").read_text("utf-8")
    schema = json.loads(text)
    Draft202012Validator.check_schema(schema)
    validator: Validator = Draft202012Validator(schema)
    return validator


def _schema_problem(data: Any) -> TaskProblem | None:
    from jsonschema.exceptions import best_match

    error = best_match(_task_validator().iter_errors(data))
    return None if error is None else _problem_from_schema_error(error)


# Task files repeat the same tool schemas over thousands of tasks, and checking a schema costs
# far more than serialising it: results are memoised by the schema's canonical JSON text.
_MEMO_LIMIT = 4096
_schema_reasons: dict[str, str | None] = {}
_argument_validators: dict[str, Validator] = {}


def _canonical(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True, default=repr)


def _invalid_schema_reason(schema: Any) -> str | None:
    """Why `schema` is not a valid Draft 2020-12 JSON schema, or None when it is."""
    key = _canonical(schema)
    try:
        return _schema_reasons[key]
    except KeyError:
        reason = _check_schema(schema)
    if len(_schema_reasons) >= _MEMO_LIMIT:
        _schema_reasons.clear()
    _schema_reasons[key] = reason
    return reason


def _check_schema(schema: Any) -> str | None:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = format_path(exc.absolute_path)
        at = f" at {where}" if where else ""
        return f"not a valid JSON schema{at}: {_one_line(exc.message)}"
    return None


def _arguments_validator(parameters: Mapping[str, Any]) -> Validator:
    from jsonschema import Draft202012Validator
    from referencing import Registry

    key = _canonical(parameters)
    try:
        return _argument_validators[key]
    except KeyError:
        # An empty registry: a $ref outside the schema is an error, never a network fetch.
        validator: Validator = Draft202012Validator(parameters, registry=Registry())
    if len(_argument_validators) >= _MEMO_LIMIT:
        _argument_validators.clear()
    _argument_validators[key] = validator
    return validator


def _arguments_problem(
    arguments: Any, parameters: Mapping[str, Any], tool: str, base: str
) -> TaskProblem | None:
    from jsonschema.exceptions import best_match
    from referencing.exceptions import Unresolvable

    try:
        error = best_match(_arguments_validator(parameters).iter_errors(arguments))
    except Unresolvable as exc:
        message = (
            f"cannot check against the parameters of tool {show_text(tool, quote=True)}: "
            f"{_one_line(str(exc))}; "
            "inline the referenced schema (remote $refs are not fetched)"
        )
        return TaskProblem(base, message)
    if error is None:
        return None
    problem = _problem_from_schema_error(error, base)
    shown = show_text(tool, quote=True)
    return TaskProblem(problem.field, f"{problem.message} (parameters of tool {shown})")


# ---------------------------------------------------------------------------------------------
# Semantic checks, run on schema-valid tasks only (they rely on the shapes the schema ensures).


def _unknown_keys(obj: Mapping[str, Any], allowed: frozenset[str], base: str) -> TaskProblem | None:
    # The schema lets these objects carry extra keys, but the dataclasses would drop them
    # silently; refusing them keeps every key of a file meaningful.
    extra = sorted(set(obj) - allowed)
    if not extra:
        return None
    return TaskProblem(
        format_path([extra[0]], base), f"unknown key (allowed: {', '.join(sorted(allowed))})"
    )


def _tool_problems(tools: list[dict[str, Any]]) -> Iterator[TaskProblem]:
    first_index: dict[str, int] = {}
    for i, tool in enumerate(tools):
        function = tool["function"]
        reason = _invalid_schema_reason(function["parameters"])
        if reason is not None:
            yield TaskProblem(f"tools[{i}].function.parameters", reason)
        name = function["name"]
        if name in first_index:
            yield TaskProblem(
                f"tools[{i}].function.name",
                f"duplicate tool name {show_text(name, quote=True)}"
                f" (also tools[{first_index[name]}])",
            )
        first_index.setdefault(name, i)


def _checklist_problems(turn_index: int, items: list[dict[str, Any]]) -> Iterator[TaskProblem]:
    base = f"turns[{turn_index}].checklist"
    first_index: dict[str, int] = {}
    for k, item in enumerate(items):
        unknown = _unknown_keys(item, frozenset(CHECKLIST_KEYS), f"{base}[{k}]")
        if unknown is not None:
            yield unknown
        if item["id"] in first_index:
            yield TaskProblem(
                f"{base}[{k}].id",
                f"duplicate checklist item id {show_text(item['id'], quote=True)}"
                f" in turn {turn_index} "
                f"(also checklist[{first_index[item['id']]}])",
            )
        first_index.setdefault(item["id"], k)
    if items:
        total = math.fsum(item["weight"] for item in items)
        # Written as "not <=" so that a NaN total is reported too.
        if not abs(total - 1.0) <= WEIGHT_TOLERANCE:
            yield TaskProblem(
                f"{base}[0].weight", f"weights of turn {turn_index} sum to {total:.10g}, expected 1"
            )


def _name_list(names: Collection[str], most: int = 10) -> str:
    """Names for a message: each shown safely, at most `most` of them."""
    ordered = sorted(names)
    shown = ", ".join(show_text(name) for name in ordered[:most])
    return shown + (f", … ({len(ordered)} in all)" if len(ordered) > most else "")


def _expected_call_problems(
    turn_index: int, calls: list[dict[str, Any]], tools: Mapping[str, Mapping[str, Any]]
) -> Iterator[TaskProblem]:
    for k, call in enumerate(calls):
        base = f"turns[{turn_index}].expected_calls[{k}]"
        unknown = _unknown_keys(call, _EXPECTED_CALL_KEYS, base)
        if unknown is not None:
            yield unknown
        name = call["name"]
        if name not in tools:
            yield TaskProblem(
                f"{base}.name",
                f"no tool named {show_text(name, quote=True)} in this task"
                f" (tools: {_name_list(tools)})",
            )
            continue
        problem = _arguments_problem(
            call["arguments"], tools[name]["parameters"], name, f"{base}.arguments"
        )
        if problem is not None:
            yield problem


def _environment_problems(
    data: Mapping[str, Any], known: frozenset[str] | None
) -> Iterator[TaskProblem]:
    env = data.get("environment")
    if env is not None:
        unknown = _unknown_keys(env, _ENVIRONMENT_KEYS, "environment")
        if unknown is not None:
            yield unknown
        if known is not None and env["name"] not in known:
            names = ", ".join(sorted(known)) or "none registered"
            yield TaskProblem(
                "environment.name",
                f"unknown environment {show_text(env['name'], quote=True)} (known: {names})",
            )
    if "success" in data and env is None:
        yield TaskProblem(
            "success",
            "a success rule needs an environment (the final state is read from it); "
            "add environment: {name, initial_state} or remove success",
        )
    success = data.get("success") or {}
    unknown_success = _unknown_keys(success, _SUCCESS_KEYS, "success")
    if unknown_success is not None:
        yield unknown_success
    if "free" in success and success.get("match", "subset") != "whole":
        yield TaskProblem(
            "success.free",
            'free paths only apply to a whole-state rule: add "match": "whole" or remove free',
        )
    if ("match" in success or "free" in success) and "final_state" not in success:
        yield TaskProblem("success", "a success rule needs final_state (the expected state)")


def _reference_problems(messages: list[dict[str, Any]]) -> Iterator[TaskProblem]:
    for i, message in enumerate(messages):
        role = message["role"]
        if role not in REFERENCE_ROLES:
            yield TaskProblem(
                f"reference[{i}].role",
                f"{_short(role)} is not a valid role (one of {', '.join(REFERENCE_ROLES)})",
            )
        calls = message.get("tool_calls")
        if calls is not None:
            yield from _reference_call_problems(calls, f"reference[{i}].tool_calls")


def _reference_call_problems(calls: Any, base: str) -> Iterator[TaskProblem]:
    # The simulator's few-shot grounding reads function.name from every logged call.
    if not isinstance(calls, list):
        yield TaskProblem(base, f"expected array, got {json_type_name(calls)}")
        return
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            yield TaskProblem(
                f"{base}[{j}]", 'expected {"function": {"name": ..., "arguments": ...}}'
            )


def _grading_problems(data: Mapping[str, Any]) -> Iterator[TaskProblem]:
    turns = data["turns"]
    graded = (
        any(turn.get("checklist") for turn in turns)
        or any(turn.get("expected_calls") or turn.get("answer_facts") for turn in turns)
        or bool(data.get("success"))
    )
    if not graded:
        yield TaskProblem(
            "",
            "task has no way to be graded: give a turn checklist items or expected_calls, "
            "or add a success rule",
        )


def _semantic_problems(
    data: Mapping[str, Any], known: frozenset[str] | None
) -> Iterator[TaskProblem]:
    yield from _tool_problems(data["tools"])
    tools = {tool["function"]["name"]: tool["function"] for tool in data["tools"]}
    for t, turn in enumerate(data["turns"]):
        yield from _checklist_problems(t, turn.get("checklist", []))
        yield from _expected_call_problems(t, turn.get("expected_calls", []), tools)
    yield from _environment_problems(data, known)
    yield from _reference_problems(data.get("reference", []))
    yield from _grading_problems(data)


def _first_problem(data: Any, known: frozenset[str] | None) -> TaskProblem | None:
    problem = _schema_problem(data)
    if problem is not None:
        return problem
    return next(_semantic_problems(data, known), None)


def _resolve_known(known_environments: Collection[str] | None) -> frozenset[str] | None:
    """The accepted environment names; None accepts any name (no registry installed)."""
    if isinstance(known_environments, str):
        raise TypeError("known_environments must be a collection of names, not one string")
    if known_environments is not None:
        return frozenset(known_environments)
    try:
        from envace.envs.registry import environment_names
    except ModuleNotFoundError as exc:
        if exc.name != "envace.envs.registry":
            raise
        logger.debug("no environment registry installed: accepting any environment name")
        return None
    return frozenset(environment_names())


def check_task(
    data: Any, *, known_environments: Collection[str] | None = None
) -> TaskProblem | None:
    """The first problem of a task object (schema, then semantic checks), or None when valid.

    `known_environments=None` takes the names from `envace.envs.registry` (any name when that
    registry is not installed). Duplicate ids are a property of a file and are not checked here.
    """
    return _first_problem(data, _resolve_known(known_environments))


# ---------------------------------------------------------------------------------------------
# Reading files


class _JsonValueError(ValueError):
    """Valid JSON syntax whose meaning is ambiguous or non-portable (duplicate key, NaN)."""


def _reject_constant(name: str) -> Any:
    raise _JsonValueError(f"{name} is not allowed; use a finite number")


def _parse_int(text: str) -> int:
    # Python refuses to convert integers this long (CVE-2020-10735) with a hint at
    # sys.set_int_max_str_digits(), which is no help to someone fixing a task file.
    digits = len(text.lstrip("-"))
    most = sys.get_int_max_str_digits()
    if most and digits > most:
        raise _JsonValueError(
            f"a number with {digits} digits is too long (over {most} digits);"
            " it is not a valid task value"
        )
    return int(text)


def _parse_float(text: str) -> float:
    # float() turns 1e999 into inf: the NaN/Infinity rule would be bypassed.
    value = float(text)
    if not math.isfinite(value):
        shown = text if len(text) <= 40 else text[:39] + "…"
        raise _JsonValueError(f"the number {shown} is too large; use a finite number")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _JsonValueError(f"duplicate key {_short(key)} in an object")
        out[key] = value
    return out


def parse_json_strict(text: str) -> Any:
    """`json.loads` that refuses NaN/Infinity (also as an overflowing number like 1e999),
    integers too long to convert, and duplicate keys (Python accepts duplicates silently).

    Raises ValueError with a one-line reason on any problem.
    """
    try:
        return json.loads(
            text,
            parse_constant=_reject_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as exc:
        raise ValueError(f"{exc.msg} at column {exc.colno}") from exc
    except RecursionError as exc:
        raise ValueError("nested too deeply") from exc


def _read_lines(path: Path, file: str) -> Iterator[tuple[int, bytes]]:
    """(line number, raw bytes) of every non-blank line; bytes so one bad line can be reported."""
    try:
        with path.open("rb") as handle:
            for lineno, raw in enumerate(handle, start=1):
                if raw.strip():
                    yield lineno, raw
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise TaskFormatError(
            file, None, None, "", f"cannot read the task file: {reason}; check the path"
        ) from exc


def _decode_line(raw: bytes, lineno: int) -> Any:
    """The JSON value of one line; raises ValueError with a one-line reason."""
    try:
        # A byte order mark is legal at the very start of a UTF-8 file and nowhere else.
        text = raw.rstrip(b"\r\n").decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"not valid UTF-8 at byte {exc.start + 1} of the line; save the file as UTF-8"
        ) from exc
    try:
        return parse_json_strict(text)
    except ValueError as exc:
        raise ValueError(f"not valid JSON: {exc}") from exc


def _readable_id(data: Any) -> str | None:
    task_id = data.get("id") if isinstance(data, dict) else None
    return task_id if isinstance(task_id, str) and task_id else None


@dataclass
class _FileState:
    file: str
    known: frozenset[str] | None
    first_line: dict[str, int] = field(default_factory=dict)

    def task_from_line(self, lineno: int, raw: bytes) -> Task:
        try:
            data = _decode_line(raw, lineno)
        except ValueError as exc:
            raise TaskFormatError(self.file, lineno, None, "", str(exc)) from None
        if not isinstance(data, dict):
            message = f"expected a JSON object (one task per line), got {json_type_name(data)}"
            raise TaskFormatError(self.file, lineno, None, "", message)
        task_id = _readable_id(data)
        if task_id is not None:
            if task_id in self.first_line:
                message = (
                    f"duplicate task id {show_text(task_id, quote=True)} (first seen on line "
                    f"{self.first_line[task_id]}); ids must be unique in a file"
                )
                raise TaskFormatError(self.file, lineno, task_id, "id", message)
            self.first_line[task_id] = lineno
        problem = _first_problem(data, self.known)
        if problem is not None:
            raise TaskFormatError(self.file, lineno, task_id, problem.field, problem.message)
        return task_from_dict(data)


def load_tasks(
    path: str | os.PathLike[str],
    *,
    skip_invalid: bool = False,
    known_environments: Collection[str] | None = None,
) -> LoadResult:
    """Load and validate a task file (JSON Lines, blank lines ignored).

    By default the first bad task raises `TaskFormatError`. With `skip_invalid`, bad tasks are
    collected in `LoadResult.skipped` (one error each, in file order) and loading goes on; a file
    that cannot be read at all raises either way. `known_environments=None` takes the names from
    `envace.envs.registry` (any name when that registry is not installed).
    """
    state = _FileState(str(path), _resolve_known(known_environments))
    tasks: list[Task] = []
    skipped: list[TaskFormatError] = []
    for lineno, raw in _read_lines(Path(path), state.file):
        try:
            tasks.append(state.task_from_line(lineno, raw))
        except TaskFormatError as err:
            if not skip_invalid:
                raise
            skipped.append(err)
    if skipped:
        logger.warning(
            "%s: skipped %d invalid task(s), loaded %d; first: %s",
            state.file,
            len(skipped),
            len(tasks),
            skipped[0],
        )
    return LoadResult(tasks=tasks, skipped=skipped)


def load_gold(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Gold conversations (`{"task_id": ..., "messages": [...]}` per line) by task id; errors
    name the file, the line and what is wrong."""
    name = str(path)
    gold: dict[str, list[dict[str, Any]]] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserInputError(f"{name}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise UserInputError(f"{name}: cannot read the gold file: {exc.strerror}") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserInputError(f"{name}:{lineno}: not valid JSON ({exc.msg})") from None
        if (
            not isinstance(rec, dict)
            or not isinstance(rec.get("task_id"), str)
            or not isinstance(rec.get("messages"), list)
        ):
            raise UserInputError(
                f"{name}:{lineno}: expected an object with a string task_id and a messages list"
                " (docs/task_format.md, gold conversations)"
            )
        gold[rec["task_id"]] = rec["messages"]
    return gold
