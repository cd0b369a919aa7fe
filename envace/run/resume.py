"""`--resume`: the checkpoint to continue from (chosen by rank 0, fetched per node) and the run's
history restored beside it."""

from __future__ import annotations

from pathlib import Path

from envace.errors import UserInputError
from envace.run.layout import RunPaths, copy_tensorboard
from envace.train.distributed import DistInfo


def resume_point(paths: RunPaths, info: DistInfo) -> Path | None:
    """The local copy of the checkpoint to resume from: the newest one that is complete and
    verified (every sha256), damaged newer ones named in a warning and skipped; None when
    there is none. Rank 0 chooses and every rank takes its choice (a damaged download seen by
    one rank must not split the job); each node's first rank fetches it for its node."""
    from envace.storage.artifacts import fetch_dir
    from envace.storage.uri import join_uri
    from envace.train.distributed import gather_objects

    prefix = join_uri(paths.store, "checkpoints/rl")
    local_parent = paths.checkpoints / "rl"
    name, error = _choose_checkpoint(prefix, local_parent) if info.is_main else (None, None)
    name, error = gather_objects((name, error))[0]
    if error is not None:
        raise UserInputError(error)
    if name is None:
        return None
    local = local_parent / str(name)
    if info.local_rank == 0 and not info.is_main:
        fetch_dir(join_uri(prefix, str(name)), local)
    return local


def _choose_checkpoint(prefix: str, local_parent: Path) -> tuple[str | None, str | None]:
    """(name of the checkpoint fetched to resume from, None) or (None, why resuming is
    refused). No checkpoint at all: (None, None), a fresh start. Checkpoints that are all
    damaged are refused: starting fresh would replace the run's history."""
    from envace.storage.checkpoints import fetch_latest, list_checkpoints

    found = fetch_latest(prefix, local_parent)
    if found is not None:
        return found[1].name, None
    damaged = list_checkpoints(prefix)
    if not damaged:
        return None, None
    return None, (
        f"--resume: every checkpoint under {prefix} is damaged ({len(damaged)}, each named in"
        " a warning above), so there is nothing safe to resume from; restore one from a backup"
        " (`envace store verify --deep URI` checks it), or start over with --overwrite"
    )


def restore_history(paths: RunPaths, ckpt: Path) -> None:
    """On resume: the run's tasks and metric history, from the store when not here."""
    import shutil

    from envace.storage.artifacts import fetch_dir

    if not (paths.tasks / "train.jsonl").exists():
        fetch_dir(paths.store_uri(paths.tasks), paths.tasks)
    for name in ("metrics.jsonl", "stages.json"):
        if not (paths.out / name).exists() and (ckpt / name).exists():
            shutil.copyfile(ckpt / name, paths.out / name)
    if not (paths.out / "tensorboard").exists():  # a new pod: the events up to the checkpoint
        copy_tensorboard(ckpt, paths.out)
