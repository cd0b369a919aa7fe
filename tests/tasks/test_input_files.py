"""What a task (or gold, or import) file may be: a regular file read once, lines capped, strict
JSON; and what a gold conversation must hold for the warm start to replay it (issue #20)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from envace.errors import UserInputError
from envace.tasks import TaskFormatError, load_tasks
from envace.tasks.loader import MAX_LINE_BYTES, load_gold, scan_tasks
from tests.helpers.task_cli import run, task

NOT_REGULAR = "not a regular file; give the path of a file on disk"


def _lines(*tasks: object) -> str:
    return "".join((t if isinstance(t, str) else json.dumps(t)) + "\n" for t in tasks)


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "fifo.jsonl"
    os.mkfifo(path)
    yield path


# ---------------------------------------------------------------------------------------------
# files that are not regular files


@pytest.mark.timeout(30)
def test_a_fifo_without_a_writer_is_refused_at_once(fifo: Path) -> None:
    started = time.monotonic()
    with pytest.raises(TaskFormatError) as info:
        load_tasks(fifo)
    assert time.monotonic() - started < 5  # the open did not wait for a writer
    assert "it is a pipe or FIFO, " + NOT_REGULAR in str(info.value)
    assert info.value.line is None


@pytest.mark.timeout(30)
def test_a_device_that_never_ends_is_refused_up_front() -> None:
    with pytest.raises(TaskFormatError, match="it is a character device, " + NOT_REGULAR):
        load_tasks("/dev/zero")
    with pytest.raises(TaskFormatError, match="cannot read the gold file: it is a character"):
        load_gold(Path("/dev/zero"))


@pytest.mark.timeout(30)
def test_a_process_substitution_is_refused_not_miscounted(
    capsys: pytest.CaptureFixture[str],
) -> None:
    read_end, write_end = os.pipe()
    writer = threading.Thread(
        target=lambda: (
            os.write(write_end, _lines(task("a"), "{bad").encode()),
            os.close(write_end),
        )
    )
    writer.start()
    try:
        code, out, err = run(capsys, "tasks", "validate", f"/dev/fd/{read_end}")
    finally:
        writer.join()
        os.close(read_end)
    assert code == 2
    assert "it is a pipe or FIFO" in err
    assert out.strip() == "0 valid, 0 invalid, 1 unreadable file(s)"


@pytest.mark.timeout(30)
def test_import_refuses_a_fifo(
    fifo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "tasks", "import", str(fifo), "--out", str(tmp_path / "o.jsonl"))
    assert code == 2 and "cannot read the file: it is a pipe or FIFO" in err


# ---------------------------------------------------------------------------------------------
# lines


def test_an_over_long_line_is_reported_and_skipped_to_its_end(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    huge = json.dumps(task("big", system="x" * MAX_LINE_BYTES))
    path.write_text(_lines(task("a"), huge, task("b")), encoding="utf-8")
    result = load_tasks(path, skip_invalid=True)
    assert [t.id for t in result.tasks] == ["a", "b"]
    [error] = result.skipped
    assert (error.line, error.task_id) == (2, None)
    assert error.message.startswith(f"the line is longer than {MAX_LINE_BYTES} bytes (4 MiB)")


def test_a_line_of_exactly_the_limit_is_read(tmp_path: Path) -> None:
    line = json.dumps(task("edge", system=""))
    line = line.replace('"system": ""', '"system": "' + "x" * (MAX_LINE_BYTES - len(line)) + '"')
    assert len(line.encode()) == MAX_LINE_BYTES
    path = tmp_path / "edge.jsonl"
    path.write_text(line + "\n", encoding="utf-8")
    problem = load_tasks(path, skip_invalid=True).skipped
    # The line is read whole (its error, if any, is about a value, not the line's length).
    assert all("longer than" not in e.message for e in problem)


def test_a_line_separator_inside_a_string_is_text(tmp_path: Path) -> None:
    path = tmp_path / "ls.jsonl"
    path.write_text(_lines(task("a", system="one\u2028two")), encoding="utf-8")
    assert load_tasks(path).tasks[0].system == "one\u2028two"


def test_validate_reads_each_file_once_and_counts_what_it_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(_lines(task("a"), "", task("b", turns=[]), task("c"), task("d")))
    result = scan_tasks(path)
    assert ([t.id for t in result.tasks], len(result.skipped), result.not_checked) == (["a"], 1, 2)
    code, out, _ = run(capsys, "tasks", "validate", str(path))
    assert code == 2 and out.startswith("1 valid, 1 invalid, 2 not checked")


# ---------------------------------------------------------------------------------------------
# gold conversations


def _gold(tmp_path: Path, *records: str) -> Path:
    path = tmp_path / "gold.jsonl"
    path.write_text("".join(r + "\n" for r in records), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ('{"task_id": "a", "messages": [], "score": NaN}', "NaN is not allowed"),
        ('{"task_id": "a", "task_id": "b", "messages": []}', 'duplicate key "task_id"'),
        ('{"task_id": "a", "messages": [{"role": "bot"}]}', 'messages[0].role: "bot" is not a'),
        ('{"task_id": "a", "messages": [1]}', "messages[0]: expected a chat message (an object)"),
        (
            '{"task_id": "a", "messages": [{"role": "assistant", "content": {"x": 1}}]}',
            "messages[0].content: expected string or null, got object",
        ),
        (
            '{"task_id": "a", "messages": [{"role": "assistant", "tool_calls": [{"function": '
            '{"name": "f", "arguments": "{oops"}}]}]}',
            "messages[0].tool_calls[0].function.arguments: not valid JSON",
        ),
        (
            '{"task_id": "a", "messages": [{"role": "assistant", "tool_calls": [{"function": '
            '{"name": "f", "arguments": [1]}}]}]}',
            "messages[0].tool_calls[0].function.arguments: expected an object, got array",
        ),
        (
            '{"task_id": "a", "messages": [{"role": "user", "content": "\\ud800"}]}',
            "lone surrogate",
        ),
    ],
)
def test_a_bad_gold_record_is_a_clear_error(tmp_path: Path, record: str, message: str) -> None:
    path = _gold(tmp_path, record)
    with pytest.raises(UserInputError) as info:
        load_gold(path)
    assert str(info.value).startswith(f"{path}:1") and message in str(info.value)


def test_gold_keeps_text_with_a_line_separator_and_refuses_a_repeated_task(
    tmp_path: Path,
) -> None:
    ok = '{"task_id": "a", "messages": [{"role": "user", "content": "x\u2028y"}]}'
    assert load_gold(_gold(tmp_path, ok)) == {"a": [{"role": "user", "content": "x\u2028y"}]}
    with pytest.raises(UserInputError, match=r"gold.jsonl:2 \(id=a\): task_id: duplicate task id"):
        load_gold(_gold(tmp_path, ok, ok))


# ---------------------------------------------------------------------------------------------
# import


def test_import_refuses_a_lone_surrogate_instead_of_crashing_on_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = {
        "extra_info": {
            "original_index": "r1",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "messages": [{"role": "user", "content": "SURROGATE"}],
            "interaction_kwargs": {
                "checklist_list": [
                    [
                        [
                            {
                                "id": "C0",
                                "question": "q",
                                "focus_on": "assistant.content",
                                "pass_condition": "p",
                                "weight": 1,
                            }
                        ]
                    ]
                ]
            },
        }
    }
    src = tmp_path / "refs.json"
    src.write_text(json.dumps([record]).replace("SURROGATE", "\\ud800"), encoding="utf-8")
    out = tmp_path / "o.jsonl"
    code, _, err = run(capsys, "tasks", "import", str(src), "--out", str(out))
    assert code == 2 and "lone surrogate" in err and not out.exists()
