"""Starting real multi-process (torchrun) jobs from tests: the environment the ranks need on a
2-core CI machine, and the torchrun command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rank_env() -> dict[str, str]:
    """This environment plus: the venv's scripts on PATH (for `--no-python envace`), the repo
    importable, DeepSpeed's JIT builds cached in the repo and off, one thread per rank."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache" / "torch_extensions"))
    env["DS_BUILD_OPS"] = "0"
    env["OMP_NUM_THREADS"] = "1"  # two ranks on two cores
    return env


def torchrun(*args: str, nproc: int = 2) -> list[str]:
    """`torchrun --standalone --nproc_per_node N ARGS...` with this interpreter."""
    base = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    return [*base, str(nproc), *args]


def run_ranks(cmd: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=rank_env(), capture_output=True, text=True, timeout=timeout)
