"""Convert tasks between validated JSON objects and the frozen dataclasses, and write task files.

`task_to_dict` is the exact inverse of `task_from_dict` on canonical input: optional fields that
hold their default value (no system prompt, empty checklist, `ordered: false`, ...) are left out,
so a file written here is as small as the data allows and loads back to equal tasks.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

from envace.errors import UserInputError
from envace.tasks.model import ChecklistItem, EnvironmentSpec, ExpectedCall, FocusOn, Task, Turn
from envace.tasks.problems import show_text

__all__ = ["atomic_write_text", "task_from_dict", "task_to_dict", "write_tasks_jsonl"]


def task_from_dict(data: Mapping[str, Any]) -> Task:
    """Build a `Task` from a task object that has passed validation (see `check_task`).

    Mutable values (tool schemas, arguments, states) are deep-copied, so later edits to `data`
    cannot reach into the frozen task. Unvalidated input may raise KeyError or TypeError.
    """
    env = data.get("environment")
    success = data.get("success")
    return Task(
        id=data["id"],
        tools=tuple(copy.deepcopy(tool) for tool in data["tools"]),
        turns=tuple(_turn_from_dict(turn) for turn in data["turns"]),
        system=data.get("system"),
        environment=None if env is None else _environment_from_dict(env),
        success=None if success is None else copy.deepcopy(dict(success)),
        reference=tuple(copy.deepcopy(message) for message in data.get("reference", ())),
        meta=copy.deepcopy(dict(data.get("meta", {}))),
    )


def _turn_from_dict(data: Mapping[str, Any]) -> Turn:
    return Turn(
        user=data["user"],
        checklist=tuple(_item_from_dict(item) for item in data.get("checklist", ())),
        expected_calls=tuple(
            ExpectedCall(name=call["name"], arguments=copy.deepcopy(dict(call["arguments"])))
            for call in data.get("expected_calls", ())
        ),
        ordered=bool(data.get("ordered", False)),
        answer_facts=tuple(str(f) for f in data.get("answer_facts", ())),
    )


def _item_from_dict(data: Mapping[str, Any]) -> ChecklistItem:
    return ChecklistItem(
        id=data["id"],
        question=data["question"],
        focus_on=cast(FocusOn, data["focus_on"]),
        pass_condition=data["pass_condition"],
        weight=float(data["weight"]),
        failure_examples=tuple(data.get("failure_examples", ())),
        required_for_next_turn=bool(data.get("required_for_next_turn", False)),
    )


def _environment_from_dict(data: Mapping[str, Any]) -> EnvironmentSpec:
    return EnvironmentSpec(
        name=data["name"], initial_state=copy.deepcopy(dict(data.get("initial_state", {})))
    )


def task_to_dict(task: Task) -> dict[str, Any]:
    """The task as a JSON-ready object in canonical form (defaults left out, values deep-copied)."""
    out: dict[str, Any] = {"id": task.id}
    if task.system is not None:
        out["system"] = task.system
    out["tools"] = copy.deepcopy(list(task.tools))
    out["turns"] = [_turn_to_dict(turn) for turn in task.turns]
    if task.environment is not None:
        env: dict[str, Any] = {"name": task.environment.name}
        if task.environment.initial_state:
            env["initial_state"] = copy.deepcopy(task.environment.initial_state)
        out["environment"] = env
    if task.success is not None:
        out["success"] = copy.deepcopy(task.success)
    if task.reference:
        out["reference"] = copy.deepcopy(list(task.reference))
    if task.meta:
        out["meta"] = copy.deepcopy(task.meta)
    return out


def _turn_to_dict(turn: Turn) -> dict[str, Any]:
    out: dict[str, Any] = {"user": turn.user}
    if turn.checklist:
        out["checklist"] = [_item_to_dict(item) for item in turn.checklist]
    if turn.expected_calls:
        out["expected_calls"] = [
            {"name": call.name, "arguments": copy.deepcopy(call.arguments)}
            for call in turn.expected_calls
        ]
    if turn.ordered:
        out["ordered"] = True
    if turn.answer_facts:
        out["answer_facts"] = list(turn.answer_facts)
    return out


def _item_to_dict(item: ChecklistItem) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": item.id,
        "question": item.question,
        "focus_on": item.focus_on,
        "pass_condition": item.pass_condition,
    }
    if item.failure_examples:
        out["failure_examples"] = list(item.failure_examples)
    out["weight"] = item.weight
    if item.required_for_next_turn:
        out["required_for_next_turn"] = True
    return out


def _task_line(task: Task) -> str:
    try:
        # allow_nan=False: NaN/Infinity are not JSON, and the loader would refuse the file.
        return json.dumps(task_to_dict(task), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UserInputError(
            f"task {show_text(task.id, quote=True)} cannot be written as JSON: {exc}; "
            "task values must be JSON (no NaN/Infinity, no Python-only types)"
        ) from exc


def write_tasks_jsonl(path: str | os.PathLike[str], tasks: Iterable[Task]) -> int:
    """Write `tasks` to `path` as JSON Lines (UTF-8), atomically; returns how many were written.

    Every task is serialised before the disk is touched, then the text goes to a temporary file
    in the target's directory, which `os.replace` moves over the target: a failure at any point
    leaves an existing file as it was, never half-written. Parent directories are created.
    """
    target = Path(path)
    lines: list[str] = []
    first_index: dict[str, int] = {}
    for index, task in enumerate(tasks):
        if task.id in first_index:
            raise UserInputError(
                f"cannot write {target}: duplicate task id {show_text(task.id, quote=True)} "
                f"(tasks {first_index[task.id]} and {index}); ids must be unique in a file"
            )
        first_index[task.id] = index
        lines.append(_task_line(task))
    atomic_write_text(target, "".join(line + "\n" for line in lines))
    return len(lines)


def atomic_write_text(target: Path, text: str) -> None:
    """Write via a temp file in the same folder + `os.replace`: a crash never leaves a
    half-written file, and a file already there stays intact until the new one is complete.

    A path that cannot be written (a folder, a read-only place, a file where a folder should
    be, a full disk) raises UserInputError naming the target, never a bare OSError.
    """
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        what = f"cannot create its folder {target.parent}"
        if isinstance(exc, FileExistsError | NotADirectoryError):
            what += ": a file is in the way"
        raise _cannot_write(target, what, exc) from exc
    try:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _cannot_write(target, "", exc) from exc
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        # mkstemp creates the file 0600; keep the mode of the file being replaced, else 0644.
        mode = target.stat().st_mode & 0o777 if target.exists() else 0o644
        tmp.chmod(mode)
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _cannot_write(target, "", exc) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _cannot_write(target: Path, what: str, exc: OSError) -> UserInputError:
    reason = exc.strerror or str(exc)
    detail = f"{what} ({reason})" if what else reason
    return UserInputError(f"cannot write {target}: {detail}; choose a writable file path")
