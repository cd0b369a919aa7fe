"""Ranks, process groups and a local launcher for multi-process training.

Rendezvous is env:// everywhere: torchrun (and Kubeflow Trainer's torch-distributed runtime,
which runs torchrun) sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; a process
started without them is a world of one. Every collective a rank waits on has a deadline: the
process group's timeout bounds each collective, and `barrier` uses gloo's monitored barrier,
which names the ranks that did not arrive. A rank that fails therefore takes the others down
within that timeout instead of leaving them blocked forever.

`launch` is a small single-node torchrun for tests and benchmarks: it starts N copies of a
command with the rank variables set and, when one exits non-zero, stops the rest after a grace
period and reports every rank's exit code.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from envace.config import DeepSpeedSection
from envace.errors import EnvaceError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DistInfo",
    "LaunchResult",
    "RankFailure",
    "all_reduce_max",
    "all_reduce_mean",
    "all_reduce_sum",
    "barrier",
    "dist_info",
    "free_port",
    "gather_objects",
    "init_process_group",
    "is_main_process",
    "launch",
    "partition",
    "shard",
    "shutdown",
]

log = logging.getLogger(__name__)

# Long enough for a ZeRO-3 gather of an 8B model or a checkpoint upload between collectives,
# short enough that a dead peer is noticed within the hour a pod would otherwise sit idle.
DEFAULT_TIMEOUT_S: float = DeepSpeedSection.collective_timeout_s  # the config's default


class RankFailure(EnvaceError):
    """One or more ranks of a multi-process run failed or timed out."""


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job (from torchrun's environment variables)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = "127.0.0.1"
    master_port: int | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise EnvaceError(
            f"environment variable {name}={raw!r} is not an integer; it is set by torchrun "
            "(or the Kubeflow Trainer runtime) and should not be set by hand"
        ) from None


def dist_info(env: Mapping[str, str] | None = None) -> DistInfo:
    """This process's rank and world size: from an initialised process group, else from env."""
    e: Mapping[str, str] = os.environ if env is None else env
    if env is None and dist.is_available() and dist.is_initialized():
        return DistInfo(
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            local_rank=_env_int(e, "LOCAL_RANK", 0),
            local_world_size=_env_int(e, "LOCAL_WORLD_SIZE", 1),
            master_addr=e.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_env_int(e, "MASTER_PORT", 0) or None,
        )
    world = _env_int(e, "WORLD_SIZE", 1)
    rank = _env_int(e, "RANK", 0)
    if not 0 <= rank < world:
        raise EnvaceError(f"RANK={rank} is outside WORLD_SIZE={world}; check the launcher")
    return DistInfo(
        rank=rank,
        world_size=world,
        local_rank=_env_int(e, "LOCAL_RANK", 0),
        local_world_size=_env_int(e, "LOCAL_WORLD_SIZE", world),
        master_addr=e.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_env_int(e, "MASTER_PORT", 0) or None,
    )


def is_main_process() -> bool:
    """True on rank 0 (and in a single-process run): the one rank that writes reports."""
    return dist_info().is_main


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now (for a local rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(
    backend: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S
) -> DistInfo:
    """Join the job's process group over env:// (idempotent).

    Without torchrun's variables this is a world of one on a free local port, so single-process
    code paths that need a process group (DeepSpeed always does) run unchanged.
    """
    if dist.is_initialized():
        return dist_info()
    if "WORLD_SIZE" not in os.environ:
        os.environ.update(
            {
                "RANK": "0",
                "WORLD_SIZE": "1",
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(free_port()),
            }
        )
    info = dist_info(os.environ)
    if info.distributed and info.master_port is None:
        raise EnvaceError(
            "WORLD_SIZE > 1 but MASTER_PORT is not set: start the job with torchrun "
            "(or `envace.train.distributed.launch`), which sets the rendezvous variables"
        )
    backend = backend or default_backend()
    if backend == "nccl":
        torch.cuda.set_device(info.local_rank)
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        rank=info.rank,
        world_size=info.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    log.info("rank %d/%d joined the %s process group", info.rank, info.world_size, backend)
    return info


def barrier(name: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Wait for every rank, at most `timeout_s`; raises naming the ranks that never arrived."""
    if not (dist.is_initialized() and dist.get_world_size() > 1):
        return
    if dist.get_backend() == "gloo":
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=timeout_s))
        except RuntimeError as exc:
            raise RankFailure(
                f"barrier {name!r}: not every rank arrived within {timeout_s:.0f} s ({exc}); "
                "another rank failed or is stuck: read its log"
            ) from exc
        return
    # NCCL: the process group's timeout (watchdog) bounds the wait.
    dist.barrier()


def _multi() -> bool:
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def _reduce(value: float, op: Any) -> float:
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return float(t.item())


def shutdown(timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """End of a successful job: wait for every rank, then destroy the process group, so no
    rank exits while a peer still talks to it and no communication thread outlives Python."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    barrier("shutdown", timeout_s)
    dist.destroy_process_group()


def all_reduce_mean(value: float) -> float:
    """Mean of `value` over all ranks (the value itself in a world of one)."""
    if not _multi():
        return float(value)
    return _reduce(value, dist.ReduceOp.SUM) / int(dist.get_world_size())


def all_reduce_sum(value: float) -> float:
    """Sum of `value` over all ranks."""
    return _reduce(value, dist.ReduceOp.SUM) if _multi() else float(value)


def all_reduce_max(value: float) -> float:
    """Largest `value` over all ranks."""
    return _reduce(value, dist.ReduceOp.MAX) if _multi() else float(value)


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj` (picklable), in rank order, on every rank; `[obj]` in a world of one."""
    if not _multi():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def partition(items: Sequence[Any], rank: int, world_size: int) -> list[Any]:
    """Rank `rank`'s round-robin share of `items`, nothing dropped (shares differ by <= 1)."""
    return list(items[rank::world_size])


def shard(items: Sequence[Any], rank: int, world_size: int) -> list[Any]:
    """Rank `rank`'s equal share of `items` (round-robin; the remainder past a multiple of
    `world_size` is dropped so every rank runs the same number of forward/backward passes,
    which ZeRO's per-micro-batch collectives require)."""
    usable = len(items) - len(items) % world_size
    return [items[i] for i in range(rank, usable, world_size)]


# --- a local launcher ------------------------------------------------------------------------
@dataclass(frozen=True)
class LaunchResult:
    """How each rank ended: its exit code (negative: killed by that signal) and whether the
    launcher had to stop it because another rank failed first."""

    returncodes: list[int]
    stopped: list[bool]
    wall_s: float

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes)


def _rank_env(base: Mapping[str, str], rank: int, nprocs: int, port: int) -> dict[str, str]:
    env = dict(base)
    env.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(nprocs),
            "LOCAL_WORLD_SIZE": str(nprocs),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    return env


def _stop(procs: Sequence[subprocess.Popen[bytes]], stopped: list[bool]) -> None:
    for i, p in enumerate(procs):
        if p.poll() is None:
            stopped[i] = True
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10.0
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(
    argv: Sequence[str],
    nprocs: int,
    *,
    timeout_s: float = 600.0,
    grace_s: float = 30.0,
    env: Mapping[str, str] | None = None,
    check: bool = True,
) -> LaunchResult:
    """Run `argv` as `nprocs` ranks on this machine (env:// rendezvous on a free port).

    When a rank exits non-zero the others get `grace_s` to fail on their own (their collective
    timeouts) and are then stopped; after `timeout_s` in all, every rank still running is
    stopped. With `check`, any non-zero exit raises `RankFailure` naming the ranks.
    """
    if nprocs < 1:
        raise ValueError(f"nprocs must be >= 1, got {nprocs}")
    port = free_port()
    base = dict(os.environ if env is None else env)
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(list(argv), env=_rank_env(base, r, nprocs, port)) for r in range(nprocs)
    ]
    stopped = [False] * nprocs
    first_failure: float | None = None
    try:
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if first_failure is None and any(p.poll() not in (None, 0) for p in procs):
                first_failure = now
            if now - t0 > timeout_s or (
                first_failure is not None and now - first_failure > grace_s
            ):
                _stop(procs, stopped)
                break
            time.sleep(0.05)
    finally:
        if any(p.poll() is None for p in procs):  # interrupted (e.g. KeyboardInterrupt)
            _stop(procs, stopped)
    result = LaunchResult([int(p.returncode) for p in procs], stopped, time.monotonic() - t0)
    if check and not result.ok:
        failed = [
            f"rank {r}: exit {rc}" + (" (stopped)" if result.stopped[r] else "")
            for r, rc in enumerate(result.returncodes)
            if rc != 0
        ]
        raise RankFailure(f"{' '.join(argv[:3])}...: {'; '.join(failed)}")
    return result
