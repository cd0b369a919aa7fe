"""bench/checkpoint.py: the parts of an RL checkpoint, timed, on a micro model (DeepSpeed, CPU).

Run as a subprocess, as the bench is run (DeepSpeed's import-time deprecation warnings would be
errors under this suite's warning filter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_checkpoint_bench_times_each_part(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed", reason="the checkpoint is the DeepSpeed engine's")
    out = tmp_path / "ckpt.json"
    env = {
        **os.environ,
        "TORCH_EXTENSIONS_DIR": os.environ.get(
            "TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions")
        ),
        "DS_BUILD_OPS": "0",
    }
    cmd = [sys.executable, str(ROOT / "bench" / "checkpoint.py")]
    cmd += ["--shape", "test-micro", "--device", "cpu", "--out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-5000:]
    row = json.loads(out.read_text())["result"]
    parts = ("hf_weights", "deepspeed_state", "manifest")
    for k in parts:
        assert row[f"{k}_s"] > 0 and row[f"{k}_bytes"] > 0
    # the manifest covers exactly the files the two writes produced
    assert row["manifest_bytes"] == row["hf_weights_bytes"] + row["deepspeed_state_bytes"]
    assert row["total_s"] == pytest.approx(sum(row[f"{k}_s"] for k in parts), abs=0.01)
    assert "deepspeed_state" in proc.stdout and "GB/s" in proc.stdout
