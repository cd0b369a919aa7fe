"""Import the reference checklist dataset layout (CM2 / EnvACE reference data) as EnvACE tasks.

A reference record looks like (see docs/task_format.md, "Import"):

    {"data_source": "...", "messages": [<system?>, <first user message>],
     "extra_info": {"index": 17, "original_index": "fbf37337-...",
                    "tools": "<JSON string: OpenAI function tools>",
                    "messages": [<the full logged conversation>],
                    "interaction_kwargs": {"checklist_list": [[[<items of turn 0>], ...]]}}}

Mapping: `original_index` (else `index`, else the record position) is the task id; every user
message of the full conversation is a turn, graded by checklist 0 of `checklist_list` (the
reference trains with one checklist); the full conversation, with tool-call arguments decoded
from JSON strings, becomes `reference`. Checklist keys the task format has no use for
(`evidence`, `dependence`) are dropped, and the two content sub-foci of the reference
(`assistant.content.thinking`, `assistant.content.user_visible_reply`) become `assistant.content`.
Each converted task is validated like a loaded one; errors name the record index and, where
possible, the field of the source record.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.tasks.io import task_from_dict
from envace.tasks.loader import (
    CHECKLIST_KEYS,
    MAX_FILE_BYTES,
    LoadResult,
    TaskFormatError,
    TaskProblem,
    check_task,
    json_type_name,
    open_input_file,
    parse_json_strict,
    show_text,
)
from envace.tasks.model import Task

__all__ = ["FOCUS_ON_ALIASES", "import_reference", "read_reference"]

logger = logging.getLogger(__name__)

FOCUS_ON_ALIASES = {
    "assistant.content.thinking": "assistant.content",
    "assistant.content.user_visible_reply": "assistant.content",
}
_CHECKLIST_PATH = "extra_info.interaction_kwargs.checklist_list[0]"


class _RecordError(Exception):
    """A record that does not follow the reference layout, located in the source record."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@dataclass(frozen=True)
class _Converted:
    """A task object built from one record, and what is needed to map errors back to it."""

    data: dict[str, Any]
    conversation_key: str  # "extra_info.messages" or "messages"
    user_positions: list[int]  # conversation index of each turn's user message


# ---------------------------------------------------------------------------------------------
# Reading the source file


def _read_parquet(path: Path, file: str) -> list[Any]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise TaskFormatError(
            file, None, None, "", "reading parquet files needs pyarrow: pip install pyarrow"
        ) from exc
    # Opened here, once: pyarrow's error for a missing file carries no reason, it would read a
    # folder as a dataset of parquet files, and a pipe must not reach it.
    with open_input_file(path, file, "file") as handle:
        try:
            rows: list[Any] = pq.read_table(handle).to_pylist()
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            message = f"cannot read the parquet file: {exc}"
            raise TaskFormatError(file, None, None, "", message) from exc
    return rows


def _read_text(path: Path, file: str) -> str:
    with open_input_file(path, file, "file") as handle:
        data = handle.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        message = f"the file grew past {MAX_FILE_BYTES} bytes while being read"
        raise TaskFormatError(file, None, None, "", message)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TaskFormatError(
            file, None, None, "", f"not valid UTF-8 at byte {exc.start + 1}; save the file as UTF-8"
        ) from exc


def _single_json_object(text: str) -> dict[str, Any] | None:
    try:
        value = parse_json_strict(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _iter_records(path: Path, file: str) -> Iterator[tuple[int, int | None, Any]]:
    """(record index, line or None, record) for each record; a bad JSONL line yields its error."""
    if path.suffix.lower() == ".parquet":
        for index, row in enumerate(_read_parquet(path, file)):
            yield index, None, row
        return
    text = _read_text(path, file)
    start = text.lstrip()[:1]
    if start == "[":
        try:
            records = parse_json_strict(text)
        except ValueError as exc:
            raise TaskFormatError(file, None, None, "", f"not valid JSON: {exc}") from None
        for index, record in enumerate(records):
            yield index, None, record
        return
    if start == "{":
        single = _single_json_object(text)
        if single is not None:  # one (possibly pretty-printed) record, not JSON Lines
            yield 0, None, single
            return
    lines = (line for line in enumerate(text.split("\n"), start=1) if line[1].strip())
    for index, (lineno, line) in enumerate(lines):
        try:
            yield index, lineno, parse_json_strict(line)
        except ValueError as exc:
            error = f"not valid JSON: {exc}"
            yield index, lineno, TaskFormatError(file, lineno, None, "", error, record=index)


# ---------------------------------------------------------------------------------------------
# Converting one record


def _require_dict(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _RecordError(where, f"expected an object, got {json_type_name(value)}")
    return value


def _task_id(record: dict[str, Any], index: int) -> str:
    extra = record.get("extra_info")
    extra = extra if isinstance(extra, dict) else {}
    for key in ("original_index", "index"):
        value = extra.get(key)
        if value is not None and str(value):
            return str(value)
    return str(index)


def _tools(extra: dict[str, Any]) -> Any:
    tools = extra.get("tools")
    if isinstance(tools, str):
        try:
            return parse_json_strict(tools)
        except ValueError as exc:
            raise _RecordError("extra_info.tools", f"not valid JSON: {exc}") from None
    if tools is None:
        raise _RecordError("extra_info.tools", "required key is missing")
    return tools


def _decode_call(call: Any, where: str) -> Any:
    if not isinstance(call, dict):
        return call
    call = {k: v for k, v in call.items() if v is not None}
    function = call.get("function")
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        try:
            arguments = parse_json_strict(function["arguments"])
        except ValueError as exc:
            raise _RecordError(f"{where}.function.arguments", f"not valid JSON: {exc}") from None
        call["function"] = {**function, "arguments": arguments}
    return call


def _normalise_message(message: Any, where: str) -> Any:
    """Drop keys a columnar file fills with null, and decode JSON-string tool-call arguments."""
    if not isinstance(message, dict):
        return message
    out = {k: v for k, v in message.items() if v is not None or k == "content"}
    calls = out.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [
            _decode_call(call, f"{where}.tool_calls[{j}]") for j, call in enumerate(calls)
        ]
    return out


def _conversation(record: dict[str, Any], extra: dict[str, Any]) -> tuple[str, list[Any]]:
    key, messages = "extra_info.messages", extra.get("messages")
    if messages is None:  # no full conversation logged: fall back to the prompt messages
        key, messages = "messages", record.get("messages")
    if not isinstance(messages, list):
        raise _RecordError(key, "expected a list of chat messages")
    return key, [_normalise_message(m, f"{key}[{i}]") for i, m in enumerate(messages)]


def _system_prompt(conversation: list[Any], prompt: Any) -> str | None:
    for messages in (conversation, prompt if isinstance(prompt, list) else []):
        for message in messages:
            if isinstance(message, dict) and message.get("role") == "system":
                content = message.get("content")
                return content if isinstance(content, str) else None
    return None


def _checklists(extra: dict[str, Any]) -> list[Any]:
    kwargs = extra.get("interaction_kwargs")
    lists = kwargs.get("checklist_list") if isinstance(kwargs, dict) else None
    if not lists:
        return []
    if not isinstance(lists, list) or not isinstance(lists[0], list):
        raise _RecordError(
            "extra_info.interaction_kwargs.checklist_list",
            "expected [checklists][user turns][items]",
        )
    return lists[0]


def _checklist_item(item: Any) -> Any:
    if not isinstance(item, dict):
        return item
    out = {key: item[key] for key in CHECKLIST_KEYS if item.get(key) is not None}
    focus = out.get("focus_on")
    if isinstance(focus, str):
        out["focus_on"] = FOCUS_ON_ALIASES.get(focus, focus)
    return out


def _turns(
    conversation: list[Any], checklists: list[Any], key: str
) -> tuple[list[dict[str, Any]], list[int]]:
    positions = [
        i for i, m in enumerate(conversation) if isinstance(m, dict) and m.get("role") == "user"
    ]
    if checklists and len(checklists) != len(positions):
        raise _RecordError(
            _CHECKLIST_PATH,
            f"has checklists for {len(checklists)} user turn(s) but {key} has "
            f"{len(positions)} user message(s); give one list of items per user turn",
        )
    turns: list[dict[str, Any]] = []
    for t, position in enumerate(positions):
        turn: dict[str, Any] = {"user": conversation[position].get("content")}
        items = checklists[t] if checklists else []
        if items:
            turn["checklist"] = [_checklist_item(item) for item in items]
        turns.append(turn)
    return turns, positions


def _meta(record: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    meta = {
        "source_format": "reference_checklist",
        "data_source": record.get("data_source"),
        "index": extra.get("index"),
    }
    return {k: v for k, v in meta.items() if v is not None}


def _convert(record: Any, task_id: str) -> _Converted:
    record = _require_dict(record, "")
    extra = _require_dict(record.get("extra_info"), "extra_info")
    key, conversation = _conversation(record, extra)
    turns, positions = _turns(conversation, _checklists(extra), key)
    data: dict[str, Any] = {"id": task_id}
    system = _system_prompt(conversation, record.get("messages"))
    if system is not None:
        data["system"] = system
    data.update(
        tools=_tools(extra),
        turns=turns,
        reference=conversation,
        meta=_meta(record, extra),
    )
    return _Converted(data, key, positions)


# ---------------------------------------------------------------------------------------------
# Mapping task field paths back to the source record


def _source_field(path: str, converted: _Converted) -> str:
    """The source-record path of a task path, e.g. turns[1].checklist[0] -> ...checklist_list."""

    def checklist(match: re.Match[str]) -> str:
        return f"{_CHECKLIST_PATH}[{match.group(1)}]{match.group(2) or ''}"

    def user(match: re.Match[str]) -> str:
        position = converted.user_positions[int(match.group(1))]
        return f"{converted.conversation_key}[{position}].content"

    def reference(match: re.Match[str]) -> str:
        return f"{converted.conversation_key}[{match.group(1)}]"

    rules: list[tuple[str, Any]] = [
        (r"^turns\[(\d+)\]\.checklist(\[\d+\])?", checklist),
        (r"^turns\[(\d+)\]\.user", user),
        (r"^reference\[(\d+)\]", reference),
        (r"^tools", "extra_info.tools"),
        (r"^id$", "extra_info.original_index"),
    ]
    for pattern, replacement in rules:
        mapped, count = re.subn(pattern, replacement, path)
        if count:
            return mapped
    return path


@dataclass
class _Importer:
    file: str
    first_record: dict[str, int]

    def task_from_record(self, index: int, line: int | None, record: Any) -> Task:
        if isinstance(record, TaskFormatError):
            raise record
        task_id = _task_id(record, index) if isinstance(record, dict) else str(index)
        try:
            converted = _convert(record, task_id)
        except _RecordError as exc:
            raise self._error(index, line, task_id, exc.field, exc.message) from None
        if task_id in self.first_record:
            first = self.first_record[task_id]
            message = (
                f"duplicate task id {show_text(task_id, quote=True)} (first in record {first})"
            )
            raise self._error(index, line, task_id, "extra_info.original_index", message)
        self.first_record[task_id] = index
        # Imported tasks carry no environment, so no environment names are needed.
        problem: TaskProblem | None = check_task(converted.data, known_environments=())
        if problem is not None:
            field = _source_field(problem.field, converted)
            raise self._error(index, line, task_id, field, problem.message)
        return task_from_dict(converted.data)

    def _error(
        self, index: int, line: int | None, task_id: str, field: str, message: str
    ) -> TaskFormatError:
        return TaskFormatError(self.file, line, task_id, field, message, record=index)


def read_reference(path: str | os.PathLike[str], *, skip_invalid: bool = False) -> LoadResult:
    """Convert every record of a reference-layout file (JSON array, JSONL or parquet) to a task.

    By default the first bad record raises `TaskFormatError`; with `skip_invalid` bad records are
    collected in `LoadResult.skipped`. Parquet needs pyarrow.
    """
    file = str(path)
    importer = _Importer(file, {})
    tasks: list[Task] = []
    skipped: list[TaskFormatError] = []
    for index, line, record in _iter_records(Path(path), file):
        try:
            tasks.append(importer.task_from_record(index, line, record))
        except TaskFormatError as err:
            if not skip_invalid:
                raise
            skipped.append(err)
    if skipped:
        logger.warning(
            "%s: skipped %d invalid record(s), imported %d", file, len(skipped), len(tasks)
        )
    return LoadResult(tasks=tasks, skipped=skipped)


def import_reference(path: str | os.PathLike[str]) -> list[Task]:
    """All records of a reference-layout file as validated tasks; raises on the first bad one."""
    return read_reference(path).tasks
