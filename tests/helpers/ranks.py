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


def run_nodes(
    args_of: list[list[str]], timeout: float = 600
) -> list[subprocess.CompletedProcess[str]]:
    """One torchrun per "node" on this machine (`--nnodes N --node-rank R`, one process each,
    a static rendezvous on a free port), `args_of[R]` its command-line arguments: each node is
    given its own folders, as pods with their own disks are."""
    from envace.train.distributed import free_port

    port = free_port()
    n = len(args_of)
    procs = []
    for rank, args in enumerate(args_of):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(n)]
        cmd += ["--node-rank", str(rank), "--nproc-per-node", "1"]
        cmd += ["--master-addr", "127.0.0.1", "--master-port", str(port), *args]
        procs.append(
            subprocess.Popen(
                cmd, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    done = []
    for cmd_proc in procs:
        try:
            out, err = cmd_proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        done.append(subprocess.CompletedProcess(cmd_proc.args, cmd_proc.returncode, out, err))
    return done
