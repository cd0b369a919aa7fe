"""Bad input to the task commands: an unwritable --out, a missing source, hostile task ids,
over-long numbers and empty files all end in one clear message (exit 2), never a traceback,
and never damage a file that was already there."""

from __future__ import annotations

import errno
import importlib.util
import json
import os
from pathlib import Path

import pytest

from envace.errors import UserInputError
from envace.tasks import TaskFormatError, load_tasks
from envace.tasks.io import atomic_write_text
from envace.tasks.loader import show_text
from tests.helpers.task_cli import run, task

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = FIXTURES / "reference_records.json"
VALID = FIXTURES / "valid_tasks.jsonl"
HAS_PYARROW = importlib.util.find_spec("pyarrow") is not None


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# ---------------------------------------------------------------------------------------------
# --out that cannot be written


def test_import_out_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "folder"
    out.mkdir()
    code, _, err = run(capsys, "tasks", "import", str(REFERENCE), "--out", str(out))
    assert code == 2
    assert f"cannot write {out}: Is a directory; choose a writable file path" in err
    assert out.is_dir() and not any(out.iterdir()) and leftovers(tmp_path) == []


def test_import_out_below_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file.jsonl"
    blocker.write_text("keep me\n")
    out = blocker / "x.jsonl"
    code, _, err = run(capsys, "tasks", "import", str(REFERENCE), "--out", str(out))
    assert code == 2
    assert f"cannot write {out}: cannot create its folder {blocker}: a file is in the way" in err
    assert blocker.read_text() == "keep me\n"


def test_failed_write_keeps_the_old_file_and_removes_the_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "tasks.jsonl"
    target.write_text("old\n")

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(UserInputError, match="No space left on device; choose a writable"):
        atomic_write_text(target, "new\n")
    assert target.read_text() == "old\n" and leftovers(tmp_path) == []


def test_generate_out_that_cannot_be_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / "gen"
    argv = ("tasks", "generate", "--out", str(out), "--n-train", "1", "--n-test", "1")
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert f"cannot create the output folder {out}: Not a directory" in err


# ---------------------------------------------------------------------------------------------
# a parquet source that is not there


@pytest.mark.skipif(not HAS_PYARROW, reason="pyarrow is not installed (parquet support)")
def test_missing_parquet_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "missing.parquet"
    code, _, err = run(capsys, "tasks", "import", str(src), "--out", str(tmp_path / "o.jsonl"))
    assert code == 2
    assert f"{src}: cannot read the file: No such file or directory" in err
    (tmp_path / "dir.parquet").mkdir()
    code, _, err = run(
        capsys, "tasks", "import", str(tmp_path / "dir.parquet"), "--out", str(tmp_path / "o")
    )
    assert code == 2 and "cannot read the file: Is a directory" in err


# ---------------------------------------------------------------------------------------------
# task ids and names echoed in messages


def test_show_text_escapes_and_truncates() -> None:
    assert show_text("bank-3") == "bank-3"
    assert show_text("bank-3", quote=True) == "'bank-3'"
    assert show_text("a\nb\x1b[31m") == "a\\nb\\x1b[31m"
    assert show_text("é") == "\\xe9"
    long = show_text("x" * 10_000)
    assert long == "x" * 80 + "…"


def test_hostile_duplicate_id_is_shown_escaped_and_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hostile = "x\n\x1b[31mFAKE ERROR" + "y" * 200
    path = tmp_path / "t.jsonl"
    line = json.dumps(task(hostile))
    path.write_text(f"{line}\n{line}\n", encoding="utf-8")
    code, _, err = run(capsys, "tasks", "validate", str(path))
    assert code == 2
    message = err.splitlines()[0]
    assert err.count("\n") == 1 and "\x1b" not in err  # one line, no terminal codes
    assert "(id=x\\n\\x1b[31mFAKE ERRORyyy" in message
    assert "duplicate task id 'x\\n\\x1b[31mFAKE ERRORyyy" in message
    assert len(message) < 400


def test_huge_id_is_not_echoed_in_full(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(task("z" * 50_000)) + "\n", encoding="utf-8")
    with pytest.raises(TaskFormatError) as info:
        load_tasks(path)
    assert len(str(info.value)) < 400 and "at most 256 allowed" in str(info.value)


def test_unknown_tool_name_is_shown_escaped(tmp_path: Path) -> None:
    bad = task("t", turns=[{"user": "u", "expected_calls": [{"name": "p\x1b", "arguments": {}}]}])
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(TaskFormatError) as info:
        load_tasks(path)
    assert "no tool named 'p\\x1b' in this task (tools: ping)" in str(info.value)


# ---------------------------------------------------------------------------------------------
# numbers JSON allows but a task cannot hold


def test_over_long_integer_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    line = json.dumps(task("t", meta={"n": 0})).replace('"n": 0', '"n": ' + "9" * 5000)
    path.write_text(f"{json.dumps(task('ok'))}\n{line}\n", encoding="utf-8")
    with pytest.raises(TaskFormatError) as info:
        load_tasks(path)
    message = str(info.value)
    assert message.startswith(f"{path}:2: ")
    assert "a number with 5000 digits is too long (over 4300 digits)" in message
    assert "not a valid task value" in message and "set_int_max_str_digits" not in message


def test_overflowing_float_is_not_infinity(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(task("t", meta={"n": 0})).replace('"n": 0', '"n": 1e999') + "\n")
    with pytest.raises(TaskFormatError, match="the number 1e999 is too large"):
        load_tasks(path)


# ---------------------------------------------------------------------------------------------
# validate: an empty file is an error


@pytest.mark.parametrize("content", ["", "\n  \n"])
def test_validate_refuses_an_empty_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text(content)
    code, out, err = run(capsys, "tasks", "validate", str(empty), str(VALID))
    assert code == 2
    assert err == f"{empty}: no tasks (empty file)\n"
    assert out == "3 valid, 0 invalid, 1 empty file(s)\n"
