"""Import of the reference checklist dataset layout (JSON array, JSONL and parquet)."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from envace.tasks import (
    ChecklistItem,
    TaskFormatError,
    import_reference,
    load_tasks,
    read_reference,
    write_tasks_jsonl,
)

FIXTURES = Path(__file__).parent / "fixtures"
HAS_PYARROW = importlib.util.find_spec("pyarrow") is not None


def records() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(
        (FIXTURES / "reference_records.json").read_text("utf-8")
    )
    return data


def write_json(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value, ensure_ascii=False), encoding="utf-8")
    return path


def write_jsonl(path: Path, values: list[Any]) -> Path:
    path.write_text("".join(json.dumps(v) + "\n\n" for v in values), encoding="utf-8")
    return path


def checklist_of(record: dict[str, Any]) -> list[Any]:
    lists: list[Any] = record["extra_info"]["interaction_kwargs"]["checklist_list"][0]
    return lists


# ---------------------------------------------------------------------------------------------
# Conversion


def test_imports_the_reference_fixture() -> None:
    first, second = import_reference(FIXTURES / "reference_records.json")

    assert first.id == "fbf37337-aaaa"
    assert first.system == "You help football fans."
    assert first.tool_names == ["get_last_games"]
    assert [t.user for t in first.turns] == [
        "Pull up the last games of the Washington Huskies.",
        "I'm not sure about the exact ID; try 1234.",
    ]
    assert first.turns[0].checklist[0] == ChecklistItem(
        id="C0",
        question="Did the assistant call get_last_games with the user's team?",
        focus_on="assistant.tool_calls",
        pass_condition="arguments.teamid names the Washington Huskies.",
        weight=0.75,
        failure_examples=("No tool call observed", "Wrong tool name"),
        required_for_next_turn=True,
    )
    assert first.turns[0].expected_calls == ()
    assert first.meta == {
        "source_format": "reference_checklist",
        "data_source": "nvidia_nemotron_checklist",
        "index": 17,
    }
    # no original_index: the id falls back to extra_info.index; no system message anywhere
    assert second.id == "18"
    assert second.system is None
    assert second.turns[0].checklist[0].focus_on == "tool.content"


def test_content_sub_foci_map_to_assistant_content() -> None:
    first = import_reference(FIXTURES / "reference_records.json")[0]
    assert first.turns[0].checklist[1].focus_on == "assistant.content"  # was ...thinking
    assert first.turns[1].checklist[0].focus_on == "assistant.content"  # was ...user_visible_reply


def test_extra_checklist_keys_are_dropped() -> None:
    first = import_reference(FIXTURES / "reference_records.json")[0]
    item = first.turns[0].checklist[1]
    assert not hasattr(item, "evidence") and not hasattr(item, "dependence")
    assert item.failure_examples == ()


def test_reference_keeps_the_conversation_with_decoded_arguments() -> None:
    first = import_reference(FIXTURES / "reference_records.json")[0]
    source = records()[0]["extra_info"]["messages"]

    assert len(first.reference) == len(source)
    assert [m["role"] for m in first.reference] == [m["role"] for m in source]
    call = first.reference[2]["tool_calls"][0]
    assert call["function"]["arguments"] == {"teamid": "Washington Huskies"}
    assert call["id"] == "c1"
    assert first.reference[3]["content"] == '{"error": "Invalid team id"}'  # tool text untouched


def test_id_falls_back_to_the_record_position(tmp_path: Path) -> None:
    recs = records()
    del recs[1]["extra_info"]["index"]
    tasks = import_reference(write_json(tmp_path / "r.json", recs))
    assert [t.id for t in tasks] == ["fbf37337-aaaa", "1"]


def test_tools_given_as_a_list_are_accepted(tmp_path: Path) -> None:
    recs = records()
    recs[0]["extra_info"]["tools"] = json.loads(recs[0]["extra_info"]["tools"])
    tasks = import_reference(write_json(tmp_path / "r.json", recs))
    assert tasks == import_reference(FIXTURES / "reference_records.json")


def test_without_full_conversation_the_prompt_messages_are_used(tmp_path: Path) -> None:
    recs = records()[:1]
    del recs[0]["extra_info"]["messages"]
    checklist_of(recs[0])[:] = checklist_of(recs[0])[:1]
    (task,) = import_reference(write_json(tmp_path / "r.json", recs))
    assert [t.user for t in task.turns] == ["Pull up the last games of the Washington Huskies."]
    assert task.reference[0] == {"role": "system", "content": "You help football fans."}


def test_jsonl_input_gives_the_same_tasks(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "r.jsonl", records())
    assert import_reference(path) == import_reference(FIXTURES / "reference_records.json")


def test_single_pretty_printed_record(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(json.dumps(records()[1], indent=2), encoding="utf-8")
    assert [t.id for t in import_reference(path)] == ["18"]


@pytest.mark.skipif(not HAS_PYARROW, reason="pyarrow is not installed (parquet support)")
def test_parquet_input_gives_the_same_tasks(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Columnar storage fills keys a row lacks with null (e.g. tool_calls of a user message):
    # the importer must drop them again.
    path = tmp_path / "r.parquet"
    pq.write_table(pa.Table.from_pylist(records()), path)
    assert import_reference(path) == import_reference(FIXTURES / "reference_records.json")


def test_parquet_without_pyarrow_says_how_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Simulates an install without pyarrow (None in sys.modules makes the import fail)."""
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = tmp_path / "r.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(TaskFormatError) as info:
        import_reference(path)
    assert str(info.value) == f"{path}: reading parquet files needs pyarrow: pip install pyarrow"


def test_imported_tasks_round_trip_through_a_task_file(tmp_path: Path) -> None:
    tasks = import_reference(FIXTURES / "reference_records.json")
    path = tmp_path / "tasks.jsonl"
    write_tasks_jsonl(path, tasks)
    assert load_tasks(path, known_environments=()).tasks == tasks


# ---------------------------------------------------------------------------------------------
# Errors name the record and the field of the source record


def _import_error(tmp_path: Path, recs: list[Any]) -> TaskFormatError:
    path = write_json(tmp_path / "r.json", recs)
    with pytest.raises(TaskFormatError) as info:
        import_reference(path)
    return info.value


def test_weight_error_points_into_checklist_list(tmp_path: Path) -> None:
    recs = records()
    checklist_of(recs[0])[1][0]["weight"] = 0.7
    err = _import_error(tmp_path, recs)
    assert str(err) == (
        f"{tmp_path / 'r.json'} record 0 (id=fbf37337-aaaa): "
        "extra_info.interaction_kwargs.checklist_list[0][1][0].weight: "
        "weights of turn 1 sum to 0.7, expected 1"
    )
    assert (err.record, err.line) == (0, None)


def test_bad_focus_on_points_into_checklist_list(tmp_path: Path) -> None:
    recs = records()
    checklist_of(recs[1])[0][0]["focus_on"] = "user.content"
    err = _import_error(tmp_path, recs)
    assert err.record == 1 and err.task_id == "18"
    assert err.field == "extra_info.interaction_kwargs.checklist_list[0][0][0].focus_on"


def test_tools_string_that_is_not_json(tmp_path: Path) -> None:
    recs = records()
    recs[1]["extra_info"]["tools"] = "[{"
    err = _import_error(tmp_path, recs)
    assert (err.record, err.task_id, err.field) == (1, "18", "extra_info.tools")
    assert err.message.startswith("not valid JSON: ")


def test_invalid_tool_schema_points_into_extra_info_tools(tmp_path: Path) -> None:
    recs = records()
    tools = json.loads(recs[1]["extra_info"]["tools"])
    tools[0]["function"]["name"] = "convert money"
    recs[1]["extra_info"]["tools"] = json.dumps(tools)
    err = _import_error(tmp_path, recs)
    assert err.field == "extra_info.tools[0].function.name"


def test_tool_call_arguments_that_are_not_json(tmp_path: Path) -> None:
    recs = records()
    recs[0]["extra_info"]["messages"][6]["tool_calls"][0]["function"]["arguments"] = "{'a': 1}"
    err = _import_error(tmp_path, recs)
    assert err.record == 0
    assert err.field == "extra_info.messages[6].tool_calls[0].function.arguments"
    assert err.message.startswith("not valid JSON: Expecting property name")


def test_checklist_turns_must_match_user_turns(tmp_path: Path) -> None:
    recs = records()
    checklist_of(recs[0]).pop()
    err = _import_error(tmp_path, recs)
    assert err.field == "extra_info.interaction_kwargs.checklist_list[0]"
    assert err.message == (
        "has checklists for 1 user turn(s) but extra_info.messages has 2 user message(s); "
        "give one list of items per user turn"
    )


def test_user_message_without_text_points_at_the_message(tmp_path: Path) -> None:
    recs = records()
    recs[0]["extra_info"]["messages"][5]["content"] = ""
    err = _import_error(tmp_path, recs)
    assert (err.field, err.message) == ("extra_info.messages[5].content", "must not be empty")


def test_record_without_checklist_has_no_grading(tmp_path: Path) -> None:
    recs = records()
    del recs[1]["extra_info"]["interaction_kwargs"]
    err = _import_error(tmp_path, recs)
    assert err.record == 1 and err.message.startswith("task has no way to be graded")


def test_duplicate_ids_are_refused(tmp_path: Path) -> None:
    recs = [records()[0], copy.deepcopy(records()[0])]
    err = _import_error(tmp_path, recs)
    assert (err.record, err.field) == (1, "extra_info.original_index")
    assert err.message == "duplicate task id 'fbf37337-aaaa' (first in record 0)"


def test_record_that_is_not_an_object(tmp_path: Path) -> None:
    err = _import_error(tmp_path, [records()[0], "text"])
    assert (err.record, err.task_id, err.field) == (1, "1", "")
    assert err.message == "expected an object, got string"


def test_jsonl_errors_name_line_and_record(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(records()[0]) + "\n\nnot json\n", encoding="utf-8")
    with pytest.raises(TaskFormatError) as info:
        import_reference(path)
    assert str(info.value) == f"{path}:3 record 1: not valid JSON: Expecting value at column 1"


def test_skip_invalid_imports_the_good_records(tmp_path: Path) -> None:
    recs = records()
    checklist_of(recs[0])[0][0]["weight"] = 2
    path = write_json(tmp_path / "r.json", recs)
    result = read_reference(path, skip_invalid=True)
    assert [t.id for t in result.tasks] == ["18"]
    assert [(e.record, e.field) for e in result.skipped] == [
        (0, "extra_info.interaction_kwargs.checklist_list[0][0][0].weight")
    ]


def test_missing_source_file(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match="cannot read the file: No such file or directory"):
        import_reference(tmp_path / "missing.json")
