"""Fuzz suites for the other task inputs: gold conversation files (the warm start's data) and
reference-layout files (`envace tasks import`).

Random mutations of valid records either are refused with the project's clear one-line error
naming the file (TaskFormatError, a UserInputError), or load into what the consumers rely on: gold
messages with a known role and text content (a tool result may be any JSON value: the loader and
the warm start show it as JSON), imported tasks that validate again after being written out and
read back.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envace.errors import UserInputError
from envace.tasks.generate import write_splits
from envace.tasks.importer import read_reference
from envace.tasks.io import task_to_dict, write_tasks_jsonl
from envace.tasks.loader import REFERENCE_ROLES, load_gold, load_tasks
from tests.helpers.mutations import FUZZ_SETTINGS, mutate

FIXTURES = Path(__file__).parents[1] / "tasks" / "fixtures"


def _gold_pool() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        written = write_splits(Path(folder), n_train=3, n_test=1, seed=11)
        text = written["gold_train"].read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


GOLD = _gold_pool()
REFERENCE = json.loads((FIXTURES / "reference_records.json").read_text("utf-8"))


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return path


def _clear_refusal(err: UserInputError, path: Path) -> None:
    message = str(err)
    assert "\n" not in message and message.startswith(str(path)), message


@pytest.mark.timeout(120)
@FUZZ_SETTINGS
@given(data=st.data())
def test_a_mutated_gold_file_is_refused_clearly_or_holds_chat_messages(
    tmp_path: Path, data: st.DataObject
) -> None:
    record = data.draw(st.sampled_from(GOLD))
    mutated = mutate(data.draw, copy.deepcopy(record))
    path = _write(tmp_path / "gold.jsonl", json.dumps(mutated) + "\n")
    try:
        gold = load_gold(path)
    except UserInputError as err:
        _clear_refusal(err, path)
        return
    for task_id, messages in gold.items():
        assert isinstance(task_id, str) and task_id
        for message in messages:
            assert message["role"] in REFERENCE_ROLES
            content = message.get("content", "")
            if message["role"] == "tool":  # a tool result may be any JSON value (shown as JSON)
                json.dumps(content, allow_nan=False)
            else:
                assert isinstance(content, str | type(None))


@pytest.mark.timeout(120)
@FUZZ_SETTINGS
@given(data=st.data())
def test_a_mutated_reference_file_is_refused_clearly_or_imports_valid_tasks(
    tmp_path: Path, data: st.DataObject
) -> None:
    records = mutate(data.draw, copy.deepcopy(REFERENCE))
    path = _write(tmp_path / "reference.json", json.dumps(records))
    try:
        tasks = read_reference(path).tasks
    except UserInputError as err:
        _clear_refusal(err, path)
        return
    write_tasks_jsonl(tmp_path / "imported.jsonl", tasks)
    again = load_tasks(tmp_path / "imported.jsonl").tasks  # what `tasks import` wrote validates
    assert [task_to_dict(t) for t in again] == [task_to_dict(t) for t in tasks]


def test_the_seeds_are_valid(tmp_path: Path) -> None:
    """The unmutated records load (else the suites would fuzz only refusals)."""
    path = _write(tmp_path / "gold.jsonl", "".join(json.dumps(r) + "\n" for r in GOLD))
    assert len(load_gold(path)) == len(GOLD) >= 3
    path = _write(tmp_path / "reference.json", json.dumps(REFERENCE))
    assert len(read_reference(path).tasks) == len(REFERENCE) >= 1
