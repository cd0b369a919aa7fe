"""Checks `envace run` / `envace train` make before writing anything, and what they guard.

A run writes into `--out` (and commits to `--store`) from its first second: the config copy, the
task splits, a fresh metric history. So every input that can be checked cheaply is checked
first (the store URI, the task files, a local `model.path`, the output folder, vLLM and an
external simulator endpoint when the rollouts need them), and a folder that
already holds a run is never replaced by accident:

- without flags, a folder (or store) holding a run is refused, naming what was found;
- `--resume` continues the newest complete checkpoint, or starts fresh when there is none (so a
  restarted TrainJob pod works the same on its first and later attempts), and refuses settings
  that would not match the checkpoint (model, role sharing, engine, tasks);
- `--overwrite` removes the old run's reports and checkpoints (locally and in the store), only
  after every check above has passed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from envace.config import Config
from envace.errors import ConfigError, UserInputError

__all__ = [
    "RESUME_KEYS",
    "check_inputs",
    "check_resume_config",
    "clear_previous_run",
    "make_out_dir",
    "previous_run",
    "refuse_previous_run",
    "run_lock",
]

log = logging.getLogger(__name__)

# Files of a run's history in OUT; their presence (or a committed checkpoint) means "a run".
_HISTORY = ("summary.json", "metrics.jsonl", "stages.json")
_REPORTS = (*_HISTORY, "progress.png", "report", "tensorboard", "checkpoints")
# Settings a resumed run must share with its checkpoint: they fix the model's shape, which
# models exist, how they are trained, and the tasks (which a resume restores from the run).
RESUME_KEYS = (
    "model.path",
    "model.preset",
    "model.vocab_size",
    "algo.sharing",
    "train.engine",
    "train.trainable",
    "train.lora",
    "train.top_layers",
    "tasks.n_train",
    "tasks.n_test",
    "tasks.seed",
    "tasks.train_file",
    "tasks.test_file",
    "tasks.gold_file",
)


def _looks_local(path: str) -> bool:
    """A filesystem path rather than a Hugging Face hub id (`org/name`)."""
    return path.startswith(("/", ".", "~")) or Path(path).expanduser().exists()


def check_inputs(cfg: Config, out: Path, store: str | None) -> None:
    """Everything checkable before the first write: raises ConfigError / UserInputError."""
    from envace.config import validate
    from envace.storage.uri import parse_uri

    validate(cfg)  # a Config built in code gets the file's range checks too (seeds, sizes)

    if out.exists() and not out.is_dir():
        raise UserInputError(f"--out {out}: exists and is not a folder; choose a folder path")
    if store is not None:
        parse_uri(store)  # an unsupported scheme or bad bucket fails here, not after training
    path = cfg.model.path
    if path is not None and _looks_local(path) and not Path(path).expanduser().is_dir():
        raise ConfigError(
            f"model.path: {path}: no such checkpoint folder; give a Hugging Face checkpoint"
            " folder (config.json + weights + tokenizer) or a hub id such as Qwen/Qwen3-0.6B"
        )
    _check_task_files(cfg)
    _check_services(cfg)


# A service that does not answer a GET within this many seconds is refused before the run.
SERVICE_CHECK_TIMEOUT_S = 10.0


def _check_services(cfg: Config) -> None:
    """What the rollouts will need, present now rather than after the warm start: vLLM (in
    this interpreter or the configured worker's) and an external simulator endpoint."""
    import importlib.util
    import os

    r = cfg.rollout
    if r.backend == "vllm":
        python = (r.vllm or {}).get("python")
        if python is not None:
            if not (Path(python).is_file() and os.access(python, os.X_OK)):
                raise ConfigError(
                    f"rollout.vllm.python: {python}: no such interpreter; point it at the python"
                    " of an environment with vLLM (docs/scale.md: scripts/setup_vllm_cpu.sh)"
                )
        elif importlib.util.find_spec("vllm") is None:
            raise ConfigError(
                "rollout.backend: vllm, but vllm is not installed in this Python; install it,"
                " or set rollout.vllm.python to the interpreter of an environment that has it"
                " (docs/scale.md), or use rollout.backend: transformers"
            )
    if r.mode == "external" and r.external_endpoint:
        _check_endpoint(r.external_endpoint, "rollout.external_endpoint")


def _check_endpoint(base_url: str, key: str) -> None:
    """GET BASE/models: any HTTP answer (even 404) shows a server is there."""
    import httpx

    from envace.policy.openai_http import normalise_base_urls

    for url in normalise_base_urls(base_url):
        try:
            httpx.get(f"{url}/models", timeout=SERVICE_CHECK_TIMEOUT_S)
        except httpx.HTTPError as exc:
            reason = str(exc) or type(exc).__name__
            raise ConfigError(
                f"{key}: no answer from {url} within {SERVICE_CHECK_TIMEOUT_S:g} s ({reason});"
                " start the OpenAI-compatible server first, or fix the URL (e.g."
                " http://host:8000/v1)"
            ) from None


def _check_task_files(cfg: Config) -> None:
    from envace.tasks.loader import load_gold, load_tasks

    t = cfg.tasks
    if t.train_file is None:
        for key, value in (("tasks.test_file", t.test_file), ("tasks.gold_file", t.gold_file)):
            if value is not None:
                raise ConfigError(
                    f"{key} is set but tasks.train_file is not: task files replace the generated"
                    " tasks only together; set tasks.train_file too, or remove"
                    f" {key} to generate tasks"
                )
        return
    for key, value in (
        ("tasks.train_file", t.train_file),
        ("tasks.test_file", t.test_file),
        ("tasks.gold_file", t.gold_file),
    ):
        if value is not None and not Path(value).is_file():
            raise ConfigError(f"{key}: {value}: no such file")
    load_tasks(Path(t.train_file))  # errors name the user's file and line, not OUT's copy
    if t.test_file is not None:
        load_tasks(Path(t.test_file))
    if cfg.warm_start.enabled:
        if t.gold_file is None:
            raise ConfigError(
                "tasks.gold_file: not set, but the warm start trains on the gold conversations"
                " of the train tasks; set tasks.gold_file (docs/task_format.md) or"
                " warm_start.enabled=false"
            )
        if not load_gold(Path(t.gold_file)):
            raise ConfigError(f"tasks.gold_file: {t.gold_file}: holds no gold conversation")


LOCK_NAME = ".envace.lock"


def make_out_dir(out: Path) -> None:
    """Create `out` (and parents), or say why it cannot be."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserInputError(f"--out {out}: cannot create the folder ({exc.strerror})") from None


@contextlib.contextmanager
def run_lock(out: Path, *, enabled: bool = True) -> Iterator[None]:
    """Hold an exclusive lock on `out` for a run: two runs writing one folder interleave their
    metrics and checkpoints (or one deletes the other's files with --overwrite). The lock is
    an flock on `OUT/.envace.lock` (released by the kernel if the process dies) holding the
    pid, so the refusal can say who has it. `enabled=False` (ranks other than 0): no lock."""
    if not enabled:
        yield
        return
    import fcntl
    import os

    make_out_dir(out)
    path = out / LOCK_NAME
    with open(path, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            raise UserInputError(
                f"--out {out}: another envace run (pid {holder}) is using this folder; wait"
                " for it to finish, or choose another --out"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _committed_in_store(store: str) -> str | None:
    """URI of a committed checkpoint under `store`/checkpoints, if any."""
    from envace.storage.artifacts import open_store
    from envace.storage.manifest import MANIFEST_NAME
    from envace.storage.uri import join_uri

    backend, prefix = open_store(join_uri(store, "checkpoints"))
    for info in backend.list(prefix):
        if info.key.endswith("/" + MANIFEST_NAME):
            return backend.uri(info.key.rsplit("/", 1)[0])
    return None


def previous_run(out: Path, store: str | None) -> str | None:
    """What shows that `out` (or `store`, when it is elsewhere) already holds a run."""
    for name in _HISTORY:
        if (out / name).exists():
            return str(out / name)
    ckpts = out / "checkpoints"
    if ckpts.is_dir():
        found = next(iter(sorted(ckpts.rglob("MANIFEST.json"))), None)
        if found is not None:
            return str(found.parent)
    if store is not None and store != str(out):
        return _committed_in_store(store)
    return None


def refuse_previous_run(found: str, out: Path) -> None:
    raise UserInputError(
        f"--out {out} already holds a run ({found}). Pass --resume to continue it, --overwrite"
        " to replace it (its reports and checkpoints are deleted), or choose another --out"
    )


def clear_previous_run(out: Path, store: str | None) -> None:
    """`--overwrite`: delete the old run's reports and checkpoints, here and in the store."""
    from envace.storage.artifacts import open_store
    from envace.storage.uri import join_uri

    for name in _REPORTS:
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()
    if store is not None and store != str(out):
        backend, prefix = open_store(join_uri(store, "checkpoints"))
        removed = backend.delete_prefix(prefix)
        log.info("--overwrite: removed %d object(s) under %s/checkpoints", removed, store)
    log.warning("--overwrite: removed the previous run's reports and checkpoints in %s", out)


def _get(data: dict[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def check_resume_config(cfg: Config, saved: Path) -> None:
    """Refuse to resume with settings that differ from the run's (`saved`: its config.json)."""
    try:
        old = json.loads(saved.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        log.warning("--resume: %s is missing or unreadable; settings not compared", saved)
        return
    new = cfg.to_dict()
    for key in RESUME_KEYS:
        if _get(old, key) != _get(new, key):
            raise ConfigError(
                f"--resume: {key} is {_get(new, key)!r} but the run was started with"
                f" {_get(old, key)!r} ({saved}); resume with the same value, or start a new run"
                " in another --out"
            )
