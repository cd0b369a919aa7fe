"""Load and validate task files (JSON Lines, one task per line; see docs/task_format.md).

The format admits only what the rest of EnvACE can handle, so a task that loads can be run:
a file is read once and only when it is a regular file; lines, nesting, strings and list
lengths are capped (the MAX_* constants, docs/task_format.md "Limits"); strings must be text
(no lone surrogates) and numbers plain finite doubles. Then comes the JSON schema shipped in
`envace/tasks/schema/`, and the checks a schema cannot express: unique ids, checklist weights
summing to 1, parameter schemas the worlds can check at a bounded cost
(`envace.envs.schema_check`), expected calls that satisfy them as a world would, a known
environment whose world accepts the initial state, at least one way to grade the task. Every
problem becomes a `TaskFormatError` naming the file, the line, the task id and the field path,
e.g. `tasks.jsonl:17 (id=bank-3): turns[1].checklist[0].weight: weights of turn 1 sum to 0.8,
expected 1`. The error type and its rendering live in `envace.tasks.problems`, reading files
and the strict JSON parser in `envace.tasks.reading`; this module holds the checks.

jsonschema is imported on first validation, not at import time, so `envace --help` and
`import envace.tasks` stay fast.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace.errors import UserInputError
from envace.tasks.io import task_from_dict
from envace.tasks.model import Task
from envace.tasks.problems import (
    TaskFormatError,
    TaskProblem,
    format_path,
    json_type_name,
    one_line,
    problem_from_schema_error,
    short_value,
    show_text,
)
from envace.tasks.reading import (
    LONG_LINE,
    MAX_FILE_BYTES,
    MAX_LINE_BYTES,
    decode_line,
    open_input_file,
    parse_json_strict,
    read_lines,
)

if TYPE_CHECKING:
    from jsonschema.protocols import Validator

__all__ = [
    "CHECKLIST_KEYS",
    "MAX_DEPTH",
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_STRING_CHARS",
    "MAX_TOOLS",
    "MAX_TURNS",
    "MAX_TURN_ITEMS",
    "LoadResult",
    "TaskFormatError",
    "TaskProblem",
    "check_task",
    "format_path",
    "json_type_name",
    "load_gold",
    "load_tasks",
    "open_input_file",
    "parse_json_strict",
    "scan_tasks",
    "show_text",
]

logger = logging.getLogger(__name__)

WEIGHT_TOLERANCE = 1e-6
# What a task file may hold (docs/task_format.md, "Limits"): every one bounds the memory and the
# time one file, one line or one task can cost, whoever wrote it.
MAX_DEPTH = 64  # objects and arrays nested in one task (the task object is level 1)
MAX_STRING_CHARS = 100_000  # one string or object key
MAX_TOOLS = 128  # tools of one task (OpenAI's limit too)
MAX_TURNS = 64  # turns of one task
MAX_TURN_ITEMS = 64  # checklist items, expected calls and answer facts, each, of one turn
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


@dataclass(frozen=True)
class LoadResult:
    """The tasks of a file and, with `skip_invalid`, the errors of the tasks left out.

    `not_checked` (from `scan_tasks` without skip_invalid): the non-blank lines after the first
    bad task, which were read but not checked."""

    tasks: list[Task]
    skipped: list[TaskFormatError] = field(default_factory=list)
    not_checked: int = 0


# ---------------------------------------------------------------------------------------------
# Schema validation


@lru_cache(maxsize=1)
def _task_validator() -> Validator:
    from envace.envs.schema_check import checked_validator

    text = resources.files("envace.tasks").joinpath("schema/task.schema.json").read_text("utf-8")
    # The validator every parameter schema gets too: its `$` is the end of the text, so a tool
    # name with a final newline does not match the name pattern.
    validator: Validator = checked_validator(json.loads(text))
    return validator


def _schema_problem(data: Any) -> TaskProblem | None:
    from jsonschema.exceptions import best_match

    error = best_match(_task_validator().iter_errors(data))
    return None if error is None else problem_from_schema_error(error)


def _parameters_reason(parameters: Any, tool: str) -> str | None:
    """Why a tool's parameter schema cannot be used (envace.envs.schema_check), or None."""
    from envace.envs.schema_check import parameters_problem

    problem = parameters_problem(parameters)
    if problem is None:
        return None
    head = "not a valid JSON schema" if problem.invalid else "cannot be used as parameters"
    where = format_path(problem.path)
    at = f" at {where}" if where else ""
    return f"{head}{at}: {one_line(problem.message)} (tool {show_text(tool, quote=True)})"


def _arguments_problem(
    arguments: Any, parameters: Mapping[str, Any], tool: str, base: str
) -> TaskProblem | None:
    """Arguments checked as the world checks a call: integers are integer literals, patterns
    match without backtracking (the parameters have passed `_parameters_reason`)."""
    from jsonschema.exceptions import best_match

    from envace.envs.schema_check import checked_validator

    error = best_match(checked_validator(parameters).iter_errors(arguments))
    if error is None:
        return None
    problem = problem_from_schema_error(error, base)
    shown = show_text(tool, quote=True)
    return TaskProblem(problem.field, f"{problem.message} (parameters of tool {shown})")


# ---------------------------------------------------------------------------------------------
# Limits and text, checked before anything else looks at a task (the schema check recurses once
# per level, and a lone surrogate cannot be written as UTF-8 or tokenised).


def _text_problem(text: str) -> str | None:
    if len(text) > MAX_STRING_CHARS:
        return f"is {len(text)} characters long, at most {MAX_STRING_CHARS} allowed"
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        code = ascii(text[exc.start])[1:-1]
        return (
            f"holds a lone surrogate ({code} at character {exc.start}), which is not text; fix "
            "the escape (a pair such as \\ud83d\\ude00 is one character)"
        )
    return None


def _value_problem(data: Any) -> TaskProblem | None:
    """The first string or key that is too long or not text, or the first value nested deeper
    than MAX_DEPTH; walked without recursion."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            reason = _text_problem(value)
            if reason is not None:
                return TaskProblem(format_path(path), reason)
            continue
        if not isinstance(value, dict | list):
            continue
        if len(path) >= MAX_DEPTH:
            message = f"nested more than {MAX_DEPTH} levels deep (objects and arrays); flatten it"
            return TaskProblem(format_path(path), message)
        if isinstance(value, list):
            stack.extend((item, (*path, i)) for i, item in reversed(list(enumerate(value))))
            continue
        for key in value:
            reason = _text_problem(key)
            if reason is not None:
                return TaskProblem(format_path(path), f"a key {reason}")
        stack.extend((item, (*path, key)) for key, item in reversed(list(value.items())))
    return None


def _count_problems(data: Mapping[str, Any]) -> Iterator[TaskProblem]:
    """Lists longer than the limits (run on schema-valid tasks: the shapes are known)."""
    counted: list[tuple[str, Any, int]] = [
        ("tools", data["tools"], MAX_TOOLS),
        ("turns", data["turns"], MAX_TURNS),
    ]
    for t, turn in enumerate(data["turns"]):
        for key in ("checklist", "expected_calls", "answer_facts"):
            counted.append((f"turns[{t}].{key}", turn.get(key, ()), MAX_TURN_ITEMS))
    for where, items, most in counted:
        if len(items) > most:
            yield TaskProblem(where, f"has {len(items)} items, at most {most} allowed")


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
        name = function["name"]
        reason = _parameters_reason(function["parameters"], name)
        if reason is not None:
            yield TaskProblem(f"tools[{i}].function.parameters", reason)
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


def _environment_problems(data: Mapping[str, Any], known: _Known) -> Iterator[TaskProblem]:
    env = data.get("environment")
    if env is not None:
        unknown = _unknown_keys(env, _ENVIRONMENT_KEYS, "environment")
        if unknown is not None:
            yield unknown
        if known.names is not None and env["name"] not in known.names:
            names = ", ".join(sorted(known.names)) or "none registered"
            yield TaskProblem(
                "environment.name",
                f"unknown environment {show_text(env['name'], quote=True)} (known: {names})",
            )
        elif known.registry:
            problem = _initial_state_problem(env)
            if problem is not None:
                yield problem
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
                f"{short_value(role)} is not a valid role (one of {', '.join(REFERENCE_ROLES)})",
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


def _semantic_problems(data: Mapping[str, Any], known: _Known) -> Iterator[TaskProblem]:
    yield from _count_problems(data)
    yield from _tool_problems(data["tools"])
    tools = {tool["function"]["name"]: tool["function"] for tool in data["tools"]}
    for t, turn in enumerate(data["turns"]):
        yield from _checklist_problems(t, turn.get("checklist", []))
        yield from _expected_call_problems(t, turn.get("expected_calls", []), tools)
    yield from _environment_problems(data, known)
    yield from _reference_problems(data.get("reference", []))
    yield from _grading_problems(data)


def _first_problem(data: Any, known: _Known) -> TaskProblem | None:
    problem = _value_problem(data) or _schema_problem(data)
    if problem is not None:
        return problem
    return next(_semantic_problems(data, known), None)


@dataclass(frozen=True)
class _Known:
    """The accepted environment names (None: any name, no registry installed); `registry`: the
    names are the registry's, so each task's initial state is loaded into its world as well."""

    names: frozenset[str] | None
    registry: bool = False


def _resolve_known(known_environments: Collection[str] | None) -> _Known:
    if isinstance(known_environments, str):
        raise TypeError("known_environments must be a collection of names, not one string")
    if known_environments is not None:
        return _Known(frozenset(known_environments))
    try:
        from envace.envs.registry import environment_names
    except ModuleNotFoundError as exc:
        if exc.name != "envace.envs.registry":
            raise
        logger.debug("no environment registry installed: accepting any environment name")
        return _Known(None)
    return _Known(frozenset(environment_names()), registry=True)


def _initial_state_problem(env: Mapping[str, Any]) -> TaskProblem | None:
    """Why a registry world refuses the task's initial state (its shape, its cross-references,
    room for new ids), or None: a task that loads can run (evaluate would fail on it later)."""
    from envace.envs.registry import make_environment

    try:
        make_environment(env["name"]).reset(env.get("initial_state", {}))
    except UserInputError as exc:
        return TaskProblem("environment.initial_state", one_line(str(exc)))
    return None


def check_task(
    data: Any, *, known_environments: Collection[str] | None = None
) -> TaskProblem | None:
    """The first problem of a task object (schema, then semantic checks), or None when valid.

    `known_environments=None` takes the names from `envace.envs.registry` and loads each
    initial state into its world (any name when that registry is not installed); given names are
    only names. Duplicate ids are a property of a file and are not checked here.
    """
    problem = _first_problem(data, _resolve_known(known_environments))
    if problem is not None:
        return problem
    size = len(json.dumps(data, ensure_ascii=False).encode("utf-8"))
    if size > MAX_LINE_BYTES:  # loaded lines are capped as they are read
        return TaskProblem(
            "", f"is {size} bytes as one line, at most {MAX_LINE_BYTES} allowed; shorten its values"
        )
    return None


def _readable_id(data: Any) -> str | None:
    task_id = data.get("id") if isinstance(data, dict) else None
    return task_id if isinstance(task_id, str) and task_id else None


@dataclass
class _FileState:
    file: str
    known: _Known
    first_line: dict[str, int] = field(default_factory=dict)

    def object_from_line(self, lineno: int, raw: bytes | None, expected: str) -> dict[str, Any]:
        """The JSON object on a line; TaskFormatError naming the line when there is none."""
        if raw is None:
            raise TaskFormatError(self.file, lineno, None, "", LONG_LINE)
        try:
            data = decode_line(raw, lineno)
        except ValueError as exc:
            raise TaskFormatError(self.file, lineno, None, "", str(exc)) from None
        if not isinstance(data, dict):
            message = f"{expected}, got {json_type_name(data)}"
            raise TaskFormatError(self.file, lineno, None, "", message)
        return data

    def claim_id(self, lineno: int, task_id: str, field: str) -> None:
        """Refuse an id already seen on an earlier line of the file."""
        if task_id in self.first_line:
            message = (
                f"duplicate task id {show_text(task_id, quote=True)} (first seen on line "
                f"{self.first_line[task_id]}); ids must be unique in a file"
            )
            raise TaskFormatError(self.file, lineno, task_id, field, message)
        self.first_line[task_id] = lineno

    def task_from_line(self, lineno: int, raw: bytes | None) -> Task:
        data = self.object_from_line(lineno, raw, "expected a JSON object (one task per line)")
        task_id = _readable_id(data)
        if task_id is not None:
            self.claim_id(lineno, task_id, "id")
        problem = _first_problem(data, self.known)
        if problem is not None:
            raise TaskFormatError(self.file, lineno, task_id, problem.field, problem.message)
        return task_from_dict(data)


def scan_tasks(
    path: str | os.PathLike[str],
    *,
    skip_invalid: bool = False,
    known_environments: Collection[str] | None = None,
) -> LoadResult:
    """Check a task file, reading it once, without raising for bad tasks (what `envace tasks
    validate` reports). Without `skip_invalid`, checking stops at the first bad task: it is
    `skipped[0]` and the non-blank lines after it are counted in `not_checked`. A file that
    cannot be read raises TaskFormatError (its `line` is None)."""
    return _scan(path, skip_invalid, known_environments, count_rest=True)


def _scan(
    path: str | os.PathLike[str],
    skip_invalid: bool,
    known_environments: Collection[str] | None,
    *,
    count_rest: bool,
) -> LoadResult:
    state = _FileState(str(path), _resolve_known(known_environments))
    tasks: list[Task] = []
    skipped: list[TaskFormatError] = []
    not_checked = 0
    with open_input_file(path, state.file) as handle:
        for lineno, raw in read_lines(handle, state.file):
            if skipped and not skip_invalid:
                if not count_rest:
                    break
                not_checked += 1
                continue
            try:
                tasks.append(state.task_from_line(lineno, raw))
            except TaskFormatError as err:
                skipped.append(err)
    return LoadResult(tasks=tasks, skipped=skipped, not_checked=not_checked)


def load_tasks(
    path: str | os.PathLike[str],
    *,
    skip_invalid: bool = False,
    known_environments: Collection[str] | None = None,
) -> LoadResult:
    """Load and validate a task file (JSON Lines, blank lines ignored; see docs/task_format.md
    for the limits on files, lines and tasks).

    By default the first bad task raises `TaskFormatError`. With `skip_invalid`, bad tasks are
    collected in `LoadResult.skipped` (one error each, in file order) and loading goes on; a file
    that cannot be read at all (missing, a folder, a pipe or a device, too large) raises either
    way. `known_environments=None` takes the names from `envace.envs.registry` and loads each
    initial state into its world (any name when that registry is not installed).
    """
    result = _scan(path, skip_invalid, known_environments, count_rest=False)
    if result.skipped and not skip_invalid:
        raise result.skipped[0]
    if result.skipped:
        logger.warning(
            "%s: skipped %d invalid task(s), loaded %d; first: %s",
            path,
            len(result.skipped),
            len(result.tasks),
            result.skipped[0],
        )
    return result


# ---------------------------------------------------------------------------------------------
# Gold conversations


def _gold_content_problem(message: dict[str, Any], base: str) -> TaskProblem | None:
    content = message.get("content")
    # A tool result may be any JSON value (it is shown as JSON); the others are text.
    if message["role"] != "tool" and not (content is None or isinstance(content, str)):
        return TaskProblem(
            f"{base}.content", f"expected string or null, got {json_type_name(content)}"
        )
    return None


def _gold_call_problem(call: Any, base: str) -> TaskProblem | None:
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return TaskProblem(base, 'expected {"function": {"name": ..., "arguments": ...}}')
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = parse_json_strict(arguments)
        except ValueError as exc:
            return TaskProblem(f"{base}.function.arguments", f"not valid JSON: {exc}")
    if not isinstance(arguments, dict):
        found = json_type_name(arguments)
        return TaskProblem(f"{base}.function.arguments", f"expected an object, got {found}")
    return None


def _gold_message_problems(messages: list[Any]) -> Iterator[TaskProblem]:
    """What the warm start's replay of a gold conversation relies on, message by message."""
    for i, message in enumerate(messages):
        base = f"messages[{i}]"
        if not isinstance(message, dict):
            yield TaskProblem(
                base, f"expected a chat message (an object), got {json_type_name(message)}"
            )
            return
        role = message.get("role")
        if role not in REFERENCE_ROLES:
            roles = ", ".join(REFERENCE_ROLES)
            yield TaskProblem(
                f"{base}.role", f"{short_value(role)} is not a valid role (one of {roles})"
            )
            return
        content = _gold_content_problem(message, base)
        if content is not None:
            yield content
        calls = message.get("tool_calls") or []
        if not isinstance(calls, list):
            yield TaskProblem(f"{base}.tool_calls", f"expected array, got {json_type_name(calls)}")
            return
        for j, call in enumerate(calls):
            problem = _gold_call_problem(call, f"{base}.tool_calls[{j}]")
            if problem is not None:
                yield problem


_GOLD_SHAPE = (
    "expected an object with a string task_id and a messages list"
    " (docs/task_format.md, gold conversations)"
)


def _gold_record(state: _FileState, lineno: int, raw: bytes | None) -> tuple[str, list[Any]]:
    rec = state.object_from_line(lineno, raw, _GOLD_SHAPE)
    task_id, messages = rec.get("task_id"), rec.get("messages")
    if not isinstance(task_id, str) or not task_id or not isinstance(messages, list):
        raise TaskFormatError(state.file, lineno, None, "", _GOLD_SHAPE)
    state.claim_id(lineno, task_id, "task_id")
    problem = _value_problem(rec) or next(_gold_message_problems(messages), None)
    if problem is not None:
        raise TaskFormatError(state.file, lineno, task_id, problem.field, problem.message)
    return task_id, messages


def load_gold(path: Path) -> dict[str, list[dict[str, Any]]]:
    """Gold conversations (`{"task_id": ..., "messages": [...]}` per line) by task id, read like
    a task file (strict JSON, the same limits); errors name the file, the line, the task id and
    the field."""
    state = _FileState(str(path), _Known(None))
    gold: dict[str, list[dict[str, Any]]] = {}
    with open_input_file(path, state.file, "gold file") as handle:
        for lineno, raw in read_lines(handle, state.file):
            task_id, messages = _gold_record(state, lineno, raw)
            gold[task_id] = messages
    return gold
