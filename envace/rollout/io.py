"""Training rows on disk: one row per generation, columnar (parquet) or JSON Lines.

The rollout step of a pipeline writes the rows it generated, with rewards and advantages, and the
train step reads them back, so the two can run in different pods. Every `Row` field is stored,
token ids and log-probabilities exactly (int64 / float64 columns in parquet, JSON numbers in
JSONL), so `read_rows(write_rows(rows))` equals `rows`.

    path = write_rows(rows, out_dir)          # out_dir/rows.parquet (rows.jsonl without pyarrow)
    rows = read_rows(out_dir)                 # either format, found by name

Parquet needs `pyarrow` (the `parquet` extra); without it the JSONL form is written and read.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from envace.errors import UserInputError
from envace.rollout.types import Role, Row

__all__ = ["ROW_FIELDS", "RowFormat", "default_format", "read_rows", "write_rows"]

RowFormat = Literal["parquet", "jsonl"]
ROW_FIELDS = tuple(f.name for f in dataclasses.fields(Row))
_FILE_NAMES: dict[RowFormat, str] = {"parquet": "rows.parquet", "jsonl": "rows.jsonl"}


def default_format() -> RowFormat:
    """Parquet when pyarrow is importable, else JSON Lines."""
    return "parquet" if importlib.util.find_spec("pyarrow") is not None else "jsonl"


def _record(row: Row) -> dict[str, Any]:
    record = dataclasses.asdict(row)
    record["role"] = str(row.role)
    return record


def _row(record: dict[str, Any], source: Path) -> Row:
    missing = [name for name in ROW_FIELDS if name not in record]
    if missing:
        raise UserInputError(
            f"{source}: a row lacks the field(s) {missing}; it was not written by "
            "envace.rollout.io.write_rows (re-run the rollout step)"
        )
    values = {name: record[name] for name in ROW_FIELDS}
    values["role"] = Role(values["role"])
    for name in ("prompt_ids", "response_ids"):
        values[name] = [int(v) for v in values[name]]
    values["logprobs"] = [float(v) for v in values["logprobs"]]
    return Row(**values)


def _parquet_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("role", pa.string()),
            ("uid", pa.string()),
            ("traj_id", pa.string()),
            ("turn", pa.int64()),
            ("step", pa.int64()),
            ("prompt_ids", pa.list_(pa.int64())),
            ("response_ids", pa.list_(pa.int64())),
            # float64: the sampling log-probabilities survive the round trip bit for bit.
            ("logprobs", pa.list_(pa.float64())),
            ("finish_reason", pa.string()),
            ("trainable", pa.bool_()),
            ("valid", pa.bool_()),
            ("text", pa.string()),
            ("reward", pa.float64()),
            ("advantage", pa.float64()),
            ("fidelity", pa.float64()),
        ]
    )


def _write_parquet(records: list[dict[str, Any]], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _parquet_schema()
    table = pa.Table.from_pylist(records, schema=schema)
    pq.write_table(table, path)


def _write_jsonl(records: list[dict[str, Any]], path: Path) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")


def write_rows(rows: Sequence[Row], out_dir: Path, fmt: RowFormat | None = None) -> Path:
    """Write `rows` into `out_dir` (rows.parquet or rows.jsonl); returns the file written."""
    chosen = fmt or default_format()
    if chosen not in _FILE_NAMES:
        raise UserInputError(f"row format {chosen!r}: use 'parquet' or 'jsonl'")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / _FILE_NAMES[chosen]
    records = [_record(r) for r in rows]
    if chosen == "parquet":
        _write_parquet(records, path)
    else:
        _write_jsonl(records, path)
    return path


def _rows_file(path: Path) -> Path:
    if path.is_file():
        return path
    for name in _FILE_NAMES.values():
        if (path / name).is_file():
            return path / name
    raise UserInputError(
        f"no training rows at {path}: expected {' or '.join(_FILE_NAMES.values())} "
        "(written by the rollout step)"
    )


def read_rows(path: Path) -> list[Row]:
    """Rows from a file written by `write_rows`, or from the folder holding it."""
    source = _rows_file(path)
    if source.suffix == ".parquet":
        import pyarrow.parquet as pq

        records = pq.read_table(source).to_pylist()
    else:
        with open(source, encoding="utf-8") as fh:
            records = [json.loads(line) for line in fh if line.strip()]
    return [_row(r, source) for r in records]
