"""A torchrun job as `envace run` sees it: joining and leaving the process group, waiting for
every rank, and rank 0's weights sent to the others."""

from __future__ import annotations

from typing import Any

import torch

from envace.config import Config
from envace.errors import ConfigError
from envace.train.distributed import DistInfo, barrier, dist_info, init_process_group, shutdown


def require_data_parallel(cfg: Config, where: str) -> None:
    """Several processes need the DeepSpeed engine: the torch engine trains one."""
    if cfg.train.engine != "deepspeed":
        raise ConfigError(
            f"{where} needs train.engine: deepspeed ({cfg.train.engine!r} trains one process); "
            "set train.engine: deepspeed, or start one process"
        )


def join_job(cfg: Config) -> DistInfo:
    """This process's place in a torchrun job; joins the process group when there are ranks."""
    info = dist_info()
    if not info.distributed:
        return info
    require_data_parallel(cfg, f"WORLD_SIZE={info.world_size}")
    return init_process_group(timeout_s=cfg.train.deepspeed.collective_timeout_s)


def leave_job(cfg: Config) -> None:
    """A finished job leaves its process group cleanly (every rank, after the last one)."""
    shutdown(cfg.train.deepspeed.collective_timeout_s)


def wait_for_all(cfg: Config, what: str) -> None:
    barrier(what, cfg.train.deepspeed.collective_timeout_s)


def broadcast_weights(model: Any) -> None:
    """Rank 0's weights to every rank (replicas identical after a per-rank warm start)."""
    import torch.distributed as dist

    device = (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else None
    )
    for tensor in model.state_dict().values():
        if device is None or tensor.device == device:
            dist.broadcast(tensor, src=0)
        else:  # NCCL moves device tensors only
            moved = tensor.to(device)
            dist.broadcast(moved, src=0)
            tensor.copy_(moved)
