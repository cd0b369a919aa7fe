"""envace.rollout.io: training rows survive the trip through parquet and JSON Lines exactly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.errors import UserInputError
from envace.rollout.io import ROW_FIELDS, default_format, read_rows, write_rows
from envace.rollout.types import Role, Row

ids = st.lists(st.integers(min_value=0, max_value=2**31 - 1), max_size=12)
floats = st.floats(allow_nan=False, allow_infinity=True, width=64)
rows = st.builds(
    Row,
    role=st.sampled_from(list(Role)),
    uid=st.text(max_size=8),
    traj_id=st.text(max_size=8),
    turn=st.integers(0, 50),
    step=st.integers(0, 50),
    prompt_ids=ids,
    response_ids=ids,
    logprobs=st.lists(floats, max_size=12),
    finish_reason=st.sampled_from(["stop", "length"]),
    trainable=st.booleans(),
    valid=st.booleans(),
    text=st.text(max_size=40),
    reward=st.none() | floats,
    advantage=st.none() | floats,
    fidelity=st.none() | floats,
)


def _row(**changes: object) -> Row:
    base: dict[str, object] = {
        "role": Role.SIMULATOR,
        "uid": "bank-3",
        "traj_id": "bank-3#1",
        "turn": 1,
        "step": 2,
        "prompt_ids": [5, 6, 7],
        "response_ids": [8, 9],
        "logprobs": [-0.1234567890123, -2.5],
        "finish_reason": "stop",
        "trainable": True,
        "valid": True,
        "text": '{"ok": true}',
        "reward": 0.75,
        "advantage": -0.125,
        "fidelity": 0.5,
    }
    return Row(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@settings(max_examples=25, deadline=None)
@given(batch=st.lists(rows, max_size=6))
def test_round_trip_is_exact(
    tmp_path_factory: pytest.TempPathFactory, fmt: str, batch: list[Row]
) -> None:
    out = tmp_path_factory.mktemp("rows")
    path = write_rows(batch, out, fmt)  # type: ignore[arg-type]
    assert path.name == f"rows.{fmt}"
    back = read_rows(out)
    assert back == batch
    assert all(isinstance(r.role, Role) for r in back)


def test_parquet_is_the_default_with_pyarrow_and_columnar(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    assert default_format() == "parquet"
    path = write_rows([_row(), _row(role=Role.CALLER, reward=None, advantage=None)], tmp_path)
    table = pq.read_table(path)
    assert tuple(table.column_names) == ROW_FIELDS
    assert str(table.schema.field("prompt_ids").type) == "list<element: int64>"
    assert str(table.schema.field("logprobs").type) == "list<element: double>"
    assert table.column("role").to_pylist() == ["simulator", "caller"]
    assert table.column("advantage").to_pylist() == [-0.125, None]


def test_jsonl_holds_one_readable_record_per_row(tmp_path: Path) -> None:
    path = write_rows([_row(logprobs=[-math.inf])], tmp_path, "jsonl")
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert record["role"] == "simulator" and record["response_ids"] == [8, 9]
    assert read_rows(path)[0].logprobs == [-math.inf]


def test_reading_a_folder_without_rows_names_the_files(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"rows\.parquet or rows\.jsonl"):
        read_rows(tmp_path)


def test_a_row_missing_fields_is_refused(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text(json.dumps({"role": "caller", "uid": "x"}) + "\n")
    with pytest.raises(UserInputError, match="lacks the field"):
        read_rows(tmp_path)


def test_unknown_format_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="'parquet' or 'jsonl'"):
        write_rows([_row()], tmp_path, "csv")  # type: ignore[arg-type]
