"""bench/checkpoint.py: the parts of an RL checkpoint, timed, on a micro model (DeepSpeed, CPU),
run as a subprocess (tests/bench/bench_testlib.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.bench_testlib import run_bench_report


@pytest.mark.slow
def test_checkpoint_bench_times_each_part(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed", reason="the checkpoint is the DeepSpeed engine's")
    args = ["--shape", "test-micro", "--device", "cpu"]
    proc, report = run_bench_report("checkpoint.py", args, tmp_path, tmp_path / "ckpt.json")
    row = report["result"]
    parts = ("hf_weights", "deepspeed_state", "manifest")
    for k in parts:
        assert row[f"{k}_s"] > 0 and row[f"{k}_bytes"] > 0
    # the manifest covers exactly the files the two writes produced
    assert row["manifest_bytes"] == row["hf_weights_bytes"] + row["deepspeed_state_bytes"]
    assert row["total_s"] == pytest.approx(sum(row[f"{k}_s"] for k in parts), abs=0.01)
    assert "deepspeed_state" in proc.stdout and "GB/s" in proc.stdout
