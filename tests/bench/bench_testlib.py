"""Running a bench/ script as its users do: a subprocess (the DeepSpeed engine joins a process
group that must not outlive the benchmark inside the test process; DeepSpeed's import-time
deprecation warnings would be errors under this suite's warning filter)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python bench/<script> <args>` with DeepSpeed's ops built lazily into the repo's cache."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "TORCH_EXTENSIONS_DIR": os.environ.get(
            "TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions")
        ),
        "DS_BUILD_OPS": "0",
    }
    cmd = [sys.executable, str(ROOT / "bench" / script), *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=cwd)


def run_bench_report(
    script: str, args: list[str], cwd: Path, out: Path
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """`run_bench`, which must succeed, and the JSON report it wrote to `out`."""
    proc = run_bench(script, [*args, "--out", str(out)], cwd)
    assert proc.returncode == 0, proc.stderr[-5000:]
    report: dict[str, Any] = json.loads(out.read_text())
    return proc, report
