"""Running a bench/ script as its users do: a subprocess (the DeepSpeed engine joins a process
group that must not outlive the benchmark inside the test process; DeepSpeed's import-time
deprecation warnings would be errors under this suite's warning filter)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_bench(script: str, monkeypatch: pytest.MonkeyPatch | None = None) -> ModuleType:
    """`bench/<script>` imported in process as the module `bench_<stem>`; with `monkeypatch`, also
    entered in `sys.modules` for the test's duration (a script's dataclasses look it up there)."""
    name = "bench_" + Path(script).stem
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if monkeypatch is not None:
        monkeypatch.setitem(sys.modules, name, module)
    spec.loader.exec_module(module)
    return module


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
