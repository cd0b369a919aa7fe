"""A run's folders and store (`RunPaths`) and its task splits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.config import Config
from envace.tasks.model import Task


@dataclass(frozen=True)
class RunPaths:
    out: Path
    store: str  # URI every artifact directory is committed to (default: `out` itself)
    writes: bool = True  # False on ranks other than 0: `commit` only names the URI

    @property
    def tasks(self) -> Path:
        return self.out / "tasks"

    @property
    def checkpoints(self) -> Path:
        return self.out / "checkpoints"

    def store_uri(self, local: Path) -> str:
        from envace.storage.uri import join_uri

        return join_uri(self.store, local.relative_to(self.out).as_posix())

    def commit(self, local: Path) -> str:
        """Commit a finished artifact directory (manifest written last)."""
        from envace.storage.artifacts import commit_dir

        uri = self.store_uri(local)
        if self.writes:
            commit_dir(local, uri)
        return uri


@dataclass(frozen=True)
class TaskSplits:
    train: list[Task]
    test: list[Task]
    gold: dict[str, list[dict[str, Any]]]


def prepare_tasks(cfg: Config, paths: RunPaths) -> Path:
    """Generate the synthetic splits (or copy the configured files) into OUT/tasks, committed."""
    import shutil

    from envace.tasks.generate import write_splits

    t = cfg.tasks
    paths.tasks.mkdir(parents=True, exist_ok=True)
    if t.train_file is None:
        write_splits(paths.tasks, t.n_train, t.n_test, t.seed)
    else:
        for src, name in (
            (t.train_file, "train.jsonl"),
            (t.test_file, "test.jsonl"),
            (t.gold_file, "gold_train.jsonl"),
        ):
            if src is not None:
                shutil.copyfile(src, paths.tasks / name)
    paths.commit(paths.tasks)
    return paths.tasks


def load_splits(tasks_dir: Path) -> TaskSplits:
    from envace.tasks.loader import load_gold, load_tasks

    train = load_tasks(tasks_dir / "train.jsonl").tasks
    test_path = tasks_dir / "test.jsonl"
    test = load_tasks(test_path).tasks if test_path.exists() else []
    gold_path = tasks_dir / "gold_train.jsonl"
    gold = load_gold(gold_path) if gold_path.exists() else {}
    return TaskSplits(train, test, gold)


def copy_tensorboard(src: Path, dest: Path) -> None:
    """src/tensorboard (the event files so far, flushed after every iteration) into dest."""
    import shutil

    if (src / "tensorboard").is_dir():
        shutil.copytree(src / "tensorboard", dest / "tensorboard", dirs_exist_ok=True)


def commit_from_ranks(local: Path, uri: str, timeout_s: float, *, uploads: bool = True) -> str:
    """Commit `uri` from every rank of a training job: each rank that `uploads` stores the
    files of its `local` folder (its DeepSpeed shard; rank 0 also the weights and metadata),
    rank 0 writes the manifest over all of them once every rank is done (a copy rank 0 holds
    wins). Works across nodes: nothing needs a shared disk. Ranks that share one folder (the
    ranks of a node under one --out) let one of them upload it. In a world of one this is
    `commit_dir`."""
    from envace.storage.artifacts import uncommit, upload_files, write_manifest
    from envace.train.distributed import barrier, dist_info, gather_objects

    main = dist_info().is_main
    if main:
        uncommit(uri)
    barrier(f"uncommit {uri}", timeout_s)  # also: every rank has written its files
    parts = gather_objects(upload_files(local, uri) if uploads or main else [])
    if main:
        merged = {e.path: e for part in reversed(parts) for e in part}  # rank 0's copy wins
        write_manifest(uri, sorted(merged.values(), key=lambda e: e.path))
    barrier(f"commit {uri}", timeout_s)
    return uri
