"""The learning benchmark's CPU mode runs end to end on a micro model and reports every mode."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from tests.helpers.micro import MICRO

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_learning_bench_writes_a_table_and_plot(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("bench_learning", ROOT / "bench" / "learning.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n")
    args = [
        "--seeds",
        "0",
        "--modes",
        "warm_start_only",
        "rehearsal",
        "--out",
        str(tmp_path / "o"),
        "--doc",
        str(doc),
    ]
    for kv in [*MICRO, "train.iterations=1"]:
        args += ["--set", kv]
    assert bench.main(args) == 0
    text = doc.read_text()
    assert (
        "| warm_start_only |" in text
        and "| rehearsal |" in text
        and "Command: `python bench/learning.py" in text
    )
    assert (tmp_path / "img" / "learning.png").read_bytes()[:4] == b"\x89PNG"
    results = json.loads((tmp_path / "o" / "results.json").read_text())
    assert set(results[0]) == {"warm_start_only", "rehearsal"}
    assert 0.0 <= results[0]["rehearsal"]["success_rate"] <= 1.0
