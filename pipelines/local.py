"""`envace pipeline run-local`: the whole pipeline with KFP's local SubprocessRunner (this
Python, no containers, no cluster), artifacts in a real store."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace.errors import EnvaceError, UserInputError

if TYPE_CHECKING:
    from pipelines.pipeline import PipelineOptions

__all__ = ["LocalRun", "run_local"]

log = logging.getLogger(__name__)


# --- run-local --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LocalRun:
    """What a local run produced: the final checkpoint, the evaluation (its metrics loaded) and
    the folder with KFP's own outputs."""

    checkpoint_uri: str
    evaluation_uri: str
    metrics: dict[str, Any]
    pipeline_root: Path


_LOCAL_NOOP_WARNINGS = (
    # Resources, images and Kubernetes settings mean nothing to a local subprocess.
    r".*have no effect in the current local runner.*",
    r".*non-Python base image.*",
)


@contextlib.contextmanager
def _local_environment() -> Iterator[None]:
    """Component subprocesses import this envace; KFP's notes about settings they ignore
    (resources, image, Kubernetes) are silenced."""
    import envace

    source_root = str(Path(envace.__file__).resolve().parents[1])
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, previous) if p)
    try:
        with warnings.catch_warnings():
            for pattern in _LOCAL_NOOP_WARNINGS:
                warnings.filterwarnings("ignore", message=pattern)
            yield
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def _check_store_reachable(store: str) -> None:
    """One request to a minio:// or s3:// store before any step starts: a wrong endpoint or
    credentials then fail here, in one line, instead of inside the first step's log."""
    from envace.storage.artifacts import open_store
    from envace.storage.manifest import MANIFEST_NAME
    from envace.storage.uri import join_key

    backend, prefix = open_store(store)
    backend.exists(join_key(prefix, MANIFEST_NAME))


def _local_endpoint(store: str, default: str) -> str:
    """The store endpoint the components get: this machine's ENVACE_S3_* settings."""
    from envace.storage.settings import S3Settings
    from envace.storage.uri import parse_uri

    if parse_uri(store).is_local:
        return default
    return S3Settings.from_env().require(store).endpoint_url


def run_local(options: PipelineOptions, store: str, pipeline_root: Path) -> LocalRun:
    """Run the whole pipeline with KFP's local SubprocessRunner (this Python, no containers).

    `pipeline_root` (a local folder) gets KFP's outputs (metrics, the report); the artifacts go
    to `store`, which the components read and write themselves.
    """
    from kfp import local

    from envace.storage.artifacts import fetch_dir
    from envace.storage.uri import parse_uri
    from pipelines.pipeline import build_pipeline

    if parse_uri(store).is_local:
        store = str(Path(parse_uri(store).path).resolve())
    else:
        _check_store_reachable(store)
    pipeline_root = pipeline_root.resolve()
    pipeline_root.mkdir(parents=True, exist_ok=True)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root))
    pipeline = build_pipeline(options)
    endpoint = _local_endpoint(store, options.store_endpoint)
    with _local_environment():
        try:
            task = pipeline(config=dict(options.config), store=store, store_endpoint=endpoint)
        except RuntimeError as exc:
            raise EnvaceError(
                f"the local pipeline run failed: {exc}; the failed step's log is above"
            ) from exc
    from envace.stages import artifact_uri

    outputs = task.outputs
    evaluation = artifact_uri(outputs["evaluation"])
    with tempfile.TemporaryDirectory(prefix="envace-eval-") as tmp:
        fetch_dir(evaluation, Path(tmp))
        metrics = json.loads((Path(tmp) / "metrics.json").read_text(encoding="utf-8"))
    return LocalRun(artifact_uri(outputs["checkpoint"]), evaluation, metrics, pipeline_root)


def _run_local(args: argparse.Namespace) -> int:
    from envace.config import load_config
    from envace.report import text_table
    from envace.stages import config_struct
    from pipelines.pipeline import PipelineOptions

    if args.rounds < 0:
        raise UserInputError(f"--rounds must be 0 or more, got {args.rounds}")
    cfg = load_config(args.config, args.overrides)
    options = PipelineOptions(config=config_struct(cfg), rounds=args.rounds)
    result = run_local(options, args.store, args.pipeline_root)
    keys = ("success_rate", "valid_call_rate", "rehearsal_fidelity", "n_tasks")
    print(text_table(["metric", "value"], [(k, result.metrics.get(k)) for k in keys]))
    print(f"final checkpoint: {result.checkpoint_uri}")
    print(f"evaluation:       {result.evaluation_uri}")
    print(f"KFP outputs:      {result.pipeline_root}")
    return 0
