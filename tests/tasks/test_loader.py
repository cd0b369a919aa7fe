"""Loading, conversion, writing and the round trips of the task format (docs/task_format.md)."""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace.errors import UserInputError
from envace.tasks import (
    ChecklistItem,
    EnvironmentSpec,
    ExpectedCall,
    LoadResult,
    Task,
    TaskFormatError,
    TaskProblem,
    Turn,
    check_task,
    load_tasks,
    task_from_dict,
    task_to_dict,
    write_tasks_jsonl,
)

FIXTURES = Path(__file__).parent / "fixtures"
KNOWN = ("bank", "shop")


def full_task_dict() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "full_task.json").read_text("utf-8"))
    return data


def write_lines(path: Path, lines: list[Any]) -> Path:
    """One line per item: dicts are dumped as JSON, strings written as they are."""
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    path.write_text(text, encoding="utf-8")
    return path


def minimal_task(task_id: str) -> dict[str, Any]:
    return {
        "id": task_id,
        "tools": [{"type": "function", "function": {"name": "ping", "parameters": {}}}],
        "turns": [{"user": "ping", "expected_calls": [{"name": "ping", "arguments": {}}]}],
    }


# ---------------------------------------------------------------------------------------------
# Loading


def test_loads_valid_file_into_frozen_dataclasses() -> None:
    result = load_tasks(FIXTURES / "valid_tasks.jsonl", known_environments=KNOWN)

    assert isinstance(result, LoadResult)
    assert result.skipped == []
    assert [t.id for t in result.tasks] == ["calc-1", "calc-2", "weather-1"]
    calc1, calc2, weather = result.tasks
    assert calc1.turns == (
        Turn(user="What is 2 + 3?", expected_calls=(ExpectedCall("add", {"a": 2, "b": 3}),)),
    )
    assert calc1.system is None and calc1.environment is None and calc1.meta == {}
    assert calc2.system == "Answer briefly."
    assert len(calc2.turns) == 2
    assert calc2.turns[1].checklist == (
        ChecklistItem(
            id="C0",
            question="Did the reply say 4?",
            focus_on="assistant.content",
            pass_condition="The reply contains 4.",
            weight=1.0,
        ),
    )
    assert isinstance(calc2.turns[0].checklist, tuple)
    assert weather.turns[0].user == "Wetter in Zürich? 天气如何？"
    assert weather.tool_names == ["get_weather"]
    assert weather.meta == {"lang": "de"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        calc1.id = "other"  # type: ignore[misc]


def test_full_featured_task_converts_field_by_field() -> None:
    task = task_from_dict(full_task_dict())

    assert task.environment == EnvironmentSpec("bank", {"accounts": {"alice": 100, "bob": 0}})
    assert task.success == {"final_state": {"accounts": {"alice": 95, "bob": 5}}}
    assert task.turns[0].ordered is True
    assert task.turns[1].ordered is False
    first = task.turns[0].checklist[0]
    assert first.failure_examples == ("transfer is called first", "no get_balance call")
    assert first.required_for_next_turn is True
    assert task.turns[0].checklist[1].required_for_next_turn is False
    assert [c.name for c in task.turns[0].expected_calls] == ["get_balance", "transfer"]
    assert len(task.reference) == 5 and task.reference[2]["tool_calls"][0]["id"] == "call_1"
    assert task.tool_schema("transfer") is not None
    assert task.tool_schema("missing") is None
    assert check_task(full_task_dict(), known_environments=KNOWN) is None


def test_dict_to_task_to_dict_is_exact_for_full_task() -> None:
    data = full_task_dict()
    assert task_to_dict(task_from_dict(data)) == data


def test_defaults_are_left_out_of_canonical_dicts() -> None:
    data = minimal_task("m-1")
    assert task_to_dict(task_from_dict(data)) == data


def test_task_does_not_share_mutable_values_with_its_source() -> None:
    data = full_task_dict()
    task = task_from_dict(data)
    data["tools"][0]["function"]["name"] = "changed"
    data["turns"][0]["expected_calls"][0]["arguments"]["account"] = "mallory"
    data["environment"]["initial_state"]["accounts"]["alice"] = 0

    assert task.tools[0]["function"]["name"] == "get_balance"
    assert task.turns[0].expected_calls[0].arguments == {"account": "alice"}
    assert task.environment is not None
    assert task.environment.initial_state["accounts"]["alice"] == 100
    out = task_to_dict(task)
    out["meta"]["source"] = "changed"
    assert task.meta["source"] == "handwritten"


def test_blank_lines_are_ignored_and_line_numbers_count_them(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "t.jsonl", [minimal_task("a"), "", "   ", "[]"])
    with pytest.raises(TaskFormatError) as info:
        load_tasks(path, known_environments=KNOWN)
    assert info.value.line == 4
    result = load_tasks(path, skip_invalid=True, known_environments=KNOWN)
    assert [t.id for t in result.tasks] == ["a"]


def test_utf8_byte_order_mark_at_file_start_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(minimal_task("bom")).encode() + b"\n")
    assert [t.id for t in load_tasks(path, known_environments=KNOWN).tasks] == ["bom"]


def test_empty_file_loads_no_task(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("\n\n", encoding="utf-8")
    assert load_tasks(path, known_environments=KNOWN) == LoadResult(tasks=[], skipped=[])


# ---------------------------------------------------------------------------------------------
# Bad input: stop at the first bad task, or skip and report


def _mixed_file(tmp_path: Path) -> Path:
    no_grading = minimal_task("b")
    no_grading["turns"] = [{"user": "hi"}]
    return write_lines(
        tmp_path / "mixed.jsonl",
        [minimal_task("a"), no_grading, "not json", minimal_task("c"), minimal_task("a")],
    )


def test_default_stops_at_first_bad_task(tmp_path: Path) -> None:
    path = _mixed_file(tmp_path)
    with pytest.raises(TaskFormatError) as info:
        load_tasks(path, known_environments=KNOWN)
    err = info.value
    assert (err.file, err.line, err.task_id, err.field) == (str(path), 2, "b", "")
    assert str(err).startswith(f"{path}:2 (id=b): task has no way to be graded")
    assert isinstance(err, UserInputError)


def test_skip_invalid_keeps_valid_tasks_and_reports_each_bad_one(tmp_path: Path) -> None:
    path = _mixed_file(tmp_path)
    result = load_tasks(path, skip_invalid=True, known_environments=KNOWN)

    assert [t.id for t in result.tasks] == ["a", "c"]
    assert [(e.line, e.task_id, e.field) for e in result.skipped] == [
        (2, "b", ""),
        (3, None, ""),
        (5, "a", "id"),
    ]
    assert result.skipped[1].message.startswith("not valid JSON: Expecting value at column 1")
    assert str(result.skipped[2]) == (
        f"{path}:5 (id=a): id: duplicate task id 'a' (first seen on line 1); "
        "ids must be unique in a file"
    )
    # Nothing is dropped silently: every non-blank line is either a task or a reported error.
    assert len(result.tasks) + len(result.skipped) == 5


def test_skip_invalid_logs_a_summary(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    load_tasks(_mixed_file(tmp_path), skip_invalid=True, known_environments=KNOWN)
    assert "skipped 3 invalid task(s), loaded 2" in caplog.text


@pytest.mark.parametrize("skip_invalid", [False, True])
def test_missing_file_is_a_clear_error(tmp_path: Path, skip_invalid: bool) -> None:
    path = tmp_path / "nope.jsonl"
    with pytest.raises(TaskFormatError) as info:
        load_tasks(path, skip_invalid=skip_invalid, known_environments=KNOWN)
    assert info.value.line is None and info.value.task_id is None
    assert str(info.value) == (
        f"{path}: cannot read the task file: No such file or directory; check the path"
    )


def test_directory_instead_of_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match="cannot read the task file: Is a directory"):
        load_tasks(tmp_path, known_environments=KNOWN)


def test_weight_tolerance_accepts_rounding_but_not_real_gaps(tmp_path: Path) -> None:
    def with_weights(task_id: str, weights: list[float]) -> dict[str, Any]:
        task = minimal_task(task_id)
        task["turns"][0]["checklist"] = [
            {"id": f"C{i}", "question": "q", "focus_on": "tool.content", "pass_condition": "p"}
            | {"weight": w}
            for i, w in enumerate(weights)
        ]
        return task

    assert sum([0.1] * 10) != 1.0  # the float sum is off; the tolerance must absorb it
    assert check_task(with_weights("a", [0.1] * 10), known_environments=KNOWN) is None
    assert check_task(with_weights("b", [1 / 3] * 3), known_environments=KNOWN) is None
    problem = check_task(with_weights("c", [0.5, 0.500002]), known_environments=KNOWN)
    assert problem == TaskProblem(
        "turns[0].checklist[0].weight", "weights of turn 0 sum to 1.000002, expected 1"
    )


def test_repeated_tool_schemas_are_checked_every_time(tmp_path: Path) -> None:
    bad = minimal_task("x")
    bad["tools"][0]["function"]["parameters"] = {"type": "strng"}
    path = write_lines(tmp_path / "t.jsonl", [bad, {**bad, "id": "y"}, minimal_task("z")])
    result = load_tasks(path, skip_invalid=True, known_environments=KNOWN)
    assert [t.id for t in result.tasks] == ["z"]
    assert [(e.task_id, e.field) for e in result.skipped] == [
        ("x", "tools[0].function.parameters"),
        ("y", "tools[0].function.parameters"),
    ]
    assert result.skipped[0].message == result.skipped[1].message
    assert result.skipped[0].message.startswith("not a valid JSON schema at type: ")


def test_local_refs_in_tool_parameters_are_resolved() -> None:
    task = minimal_task("refs")
    task["tools"][0]["function"]["parameters"] = {
        "type": "object",
        "$defs": {"name": {"type": "string"}},
        "properties": {"who": {"$ref": "#/$defs/name"}},
    }
    task["turns"][0]["expected_calls"][0]["arguments"] = {"who": 7}
    assert check_task(task, known_environments=KNOWN) == TaskProblem(
        "turns[0].expected_calls[0].arguments.who",
        "expected string, got integer (parameters of tool 'ping')",
    )


def test_check_task_reports_first_problem_without_raising() -> None:
    data = full_task_dict()
    data["environment"]["name"] = "mars"
    assert check_task(data, known_environments=KNOWN) == TaskProblem(
        "environment.name", "unknown environment 'mars' (known: bank, shop)"
    )
    assert check_task(data, known_environments=["mars"]) is None
    with pytest.raises(TypeError, match="collection of names"):
        check_task(data, known_environments="mars")


def test_without_registry_any_environment_name_is_accepted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Simulates an install without `envace.envs.registry` (None in sys.modules blocks import)."""
    monkeypatch.setitem(sys.modules, "envace.envs.registry", None)
    data = full_task_dict()
    data["environment"]["name"] = "any-world-at-all"
    assert check_task(data) is None


@pytest.mark.skipif(
    importlib.util.find_spec("envace.envs.registry") is None,
    reason="envace.envs.registry is not installed",
)
def test_default_environment_names_come_from_the_registry() -> None:
    from envace.envs.registry import environment_names

    names = environment_names()
    assert names, "the registry should name at least one environment"
    data = full_task_dict()
    data["environment"]["name"] = names[0]
    # The name is accepted; the fixture's illustrative state is then loaded into that world,
    # which refuses it (a task that validates must be able to run).
    problem = check_task(data)
    assert problem is not None and problem.field == "environment.initial_state"
    assert f"{names[0]} initial_state is malformed" in problem.message
    data["environment"]["name"] = "no-such-world-" + "x" * 8
    problem = check_task(data)
    assert problem is not None and problem.field == "environment.name"


def test_error_survives_pickling() -> None:
    err = TaskFormatError("t.jsonl", 3, "x", "turns[0].user", "must not be empty")
    clone = pickle.loads(pickle.dumps(err))
    assert str(clone) == str(err) == "t.jsonl:3 (id=x): turns[0].user: must not be empty"
    assert (clone.line, clone.task_id, clone.field) == (3, "x", "turns[0].user")


def test_error_rendering_matches_the_documented_format() -> None:
    err = TaskFormatError(
        "tasks.jsonl",
        17,
        "bank-3",
        "turns[1].checklist[0].weight",
        "weights of turn 1 sum to 0.8, expected 1",
    )
    assert str(err) == (
        "tasks.jsonl:17 (id=bank-3): turns[1].checklist[0].weight: "
        "weights of turn 1 sum to 0.8, expected 1"
    )
    assert str(TaskFormatError("a.json", None, "r", "id", "bad", record=4)) == (
        "a.json record 4 (id=r): id: bad"
    )


def test_importing_the_package_does_not_import_jsonschema() -> None:
    code = "import sys, envace.tasks; print('jsonschema' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------------------------------
# Writing


def test_write_then_load_gives_equal_tasks(tmp_path: Path) -> None:
    tasks = load_tasks(FIXTURES / "valid_tasks.jsonl", known_environments=KNOWN).tasks
    tasks.append(task_from_dict(full_task_dict()))
    path = tmp_path / "sub" / "dir" / "out.jsonl"

    assert write_tasks_jsonl(path, tasks) == 4
    assert load_tasks(path, known_environments=KNOWN).tasks == tasks
    assert not [p for p in path.parent.iterdir() if p.name != "out.jsonl"], "temp file left"
    assert path.stat().st_mode & 0o777 == 0o644


def test_unicode_round_trip_keeps_text_readable(tmp_path: Path) -> None:
    text = 'Überweise 5 € an Zoë — 用户 🙂 مرحبا line\u2028sep "quoted" \\ tab\t'
    data = minimal_task("unicode-✓")
    data["system"] = text
    data["turns"][0]["user"] = text
    data["meta"] = {"note": text, "ключ": "значение"}
    task = task_from_dict(data)
    path = tmp_path / "u.jsonl"
    write_tasks_jsonl(path, [task])

    raw = path.read_bytes()
    assert "用户 🙂".encode() in raw  # written as UTF-8, not as \\u escapes
    assert raw.count(b"\n") == 1  # U+2028 inside a string must not split the line
    assert load_tasks(path, known_environments=KNOWN).tasks == [task]


def test_failed_write_leaves_existing_file_untouched(tmp_path: Path) -> None:
    path = tmp_path / "keep.jsonl"
    write_tasks_jsonl(path, [task_from_dict(minimal_task("old"))])
    before = path.read_bytes()
    bad = task_from_dict(minimal_task("nan"))
    bad.turns[0].expected_calls[0].arguments["x"] = float("nan")

    with pytest.raises(UserInputError, match="task 'nan' cannot be written as JSON"):
        write_tasks_jsonl(path, [task_from_dict(minimal_task("new")), bad])
    with pytest.raises(UserInputError, match="duplicate task id 'new'"):
        write_tasks_jsonl(path, [task_from_dict(minimal_task("new"))] * 2)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["keep.jsonl"]


def test_rewrite_keeps_file_mode(tmp_path: Path) -> None:
    path = tmp_path / "mode.jsonl"
    write_tasks_jsonl(path, [task_from_dict(minimal_task("a"))])
    path.chmod(0o600)
    write_tasks_jsonl(path, [task_from_dict(minimal_task("b"))])
    assert path.stat().st_mode & 0o777 == 0o600
    assert [t.id for t in load_tasks(path, known_environments=KNOWN).tasks] == ["b"]


# ---------------------------------------------------------------------------------------------
# Property: any valid task survives write -> load unchanged


_text = st.text(st.characters(codec="utf-8"), max_size=12)
_json_scalar = st.none() | st.booleans() | st.integers(-1000, 1000) | _text
_json_value = st.recursive(
    _json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def _checklists(draw: st.DrawFn) -> tuple[ChecklistItem, ...]:
    n = draw(st.integers(0, 4))
    return tuple(
        ChecklistItem(
            id=f"C{i}",
            question=draw(_text),
            focus_on=draw(st.sampled_from(["assistant.tool_calls", "assistant.content"])),
            pass_condition=draw(_text),
            weight=1 / n,
            failure_examples=tuple(draw(st.lists(_text, max_size=2))),
            required_for_next_turn=draw(st.booleans()),
        )
        for i in range(n)
    )


@st.composite
def _tasks(draw: st.DrawFn) -> Task:
    args = draw(st.dictionaries(_text, _json_value, max_size=3))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    turns = tuple(
        Turn(
            user=draw(_text.filter(bool)),
            checklist=draw(_checklists()),
            expected_calls=(ExpectedCall("f", copy.deepcopy(args)),),
            ordered=draw(st.booleans()),
        )
        for _ in range(draw(st.integers(1, 3)))
    )
    with_env = draw(st.booleans())
    return Task(
        id=draw(_text.filter(bool)),
        tools=(tool,),
        turns=turns,
        system=draw(st.none() | _text),
        environment=EnvironmentSpec("bank", draw(st.dictionaries(_text, _json_value)))
        if with_env
        else None,
        success={"final_state": draw(st.dictionaries(_text, _json_value))} if with_env else None,
        meta=draw(st.dictionaries(_text, _json_value, max_size=3)),
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(task=_tasks())
def test_any_valid_task_round_trips_through_a_file(tmp_path: Path, task: Task) -> None:
    path = tmp_path / "prop.jsonl"
    write_tasks_jsonl(path, [task])
    assert load_tasks(path, known_environments=KNOWN).tasks == [task]
    assert task_from_dict(task_to_dict(task)) == task
