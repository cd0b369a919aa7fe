"""The pipeline's config passing and store layout: the config as a step parameter, the run's
URIs (`RunLayout`), scratch folders and committing what a step wrote."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from envace.config import Config, config_from_text
from envace.errors import EnvaceError, UserInputError
from envace.storage.artifacts import (
    commit_dir,
    fetch_dir,
    open_store,
    verify,
)
from envace.storage.checkpoints import checkpoint_name
from envace.storage.errors import (
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    ObjectNotFoundError,
)
from envace.storage.manifest import MANIFEST_NAME
from envace.storage.uri import join_key, join_uri, parse_uri

log = logging.getLogger(__name__)


CHECKPOINT_META = "checkpoint.json"
ROLLOUT_META = "rollout.json"
TRAIN_METRICS = "train_metrics.json"


class StageError(EnvaceError):
    """A stage cannot run on its inputs, or its TrainJob failed; the message says why and what next."""


# --- config and store -------------------------------------------------------------------------
def pipeline_config(text: str) -> Config:
    """The validated config from the pipeline's `config` parameter (YAML or JSON text)."""
    return config_from_text(text, "the pipeline parameter `config`")


def config_json(cfg: Config) -> str:
    """Every key of `cfg` as one line of JSON (a pipeline's `config` parameter)."""
    return json.dumps(cfg.to_dict())


def config_text(cfg: Config) -> str:
    """Every key of `cfg` as YAML, in schema order (what a TrainJob's ConfigMap holds)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def config_digest(cfg: Config) -> str:
    """16 hex digits that change whenever any config value does."""
    canonical = json.dumps(cfg.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def setup(config: str, store_endpoint: str) -> Config:
    """What every pipeline component does first: log to stderr, point the S3 client at
    `store_endpoint` (credentials come from the Secret as ENVACE_S3_* variables), parse the config.
    """
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    os.environ["ENVACE_S3_ENDPOINT"] = store_endpoint
    return pipeline_config(config)


def log_kfp_metrics(artifact: Any, values: Mapping[str, Any]) -> dict[str, float]:
    """Log the finite numbers of `values` on a KFP `Metrics` artifact; returns what was logged."""
    logged = {
        key: float(value)
        for key, value in values.items()
        if isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    }
    for key, value in logged.items():
        artifact.log_metric(key, value)
    return logged


def prepared_uri(store: str, cfg: Config) -> str:
    """Where `prepare` puts its outputs: shared by every run of the same config."""
    return join_uri(store, "prepared", config_digest(cfg))


@dataclass(frozen=True)
class RunLayout:
    """Where one pipeline run's artifacts live under the store root `store`.

        <store>/prepared/<config digest>/{tasks,init}   prepare (shared by runs of one config)
        <store>/<run id>/checkpoints/warm_start
        <store>/<run id>/rollouts/iter_000001          rows of RL iteration 1
        <store>/<run id>/checkpoints/rl/iter_000001    the checkpoint after iteration 1
        <store>/<run id>/evaluation                    metrics.json, report.md, trajectories

    Iterations are counted from 0 in code and named from 1 in the store, as in `envace run`.
    """

    store: str
    run_id: str

    def __post_init__(self) -> None:
        if not self.run_id or "/" in self.run_id or self.run_id in (".", ".."):
            raise UserInputError(f"run id {self.run_id!r} must be one non-empty path segment")

    @property
    def run_uri(self) -> str:
        return join_uri(self.store, self.run_id)

    @property
    def warm_start(self) -> str:
        return join_uri(self.run_uri, "checkpoints", "warm_start")

    def rollout(self, iteration: int) -> str:
        return join_uri(self.run_uri, "rollouts", checkpoint_name(iteration + 1))

    def checkpoint(self, iteration: int) -> str:
        return join_uri(self.run_uri, "checkpoints", "rl", checkpoint_name(iteration + 1))

    @property
    def evaluation(self) -> str:
        return join_uri(self.run_uri, "evaluation")


# --- artifacts --------------------------------------------------------------------------------
@contextmanager
def _scratch() -> Iterator[Path]:
    """A private working folder, removed afterwards (honours TMPDIR)."""
    with tempfile.TemporaryDirectory(prefix="envace-stage-") as tmp:
        yield Path(tmp)


def _is_remote(uri: str) -> bool:
    return not parse_uri(uri).is_local


def _local_copy(uri: str, dest: Path) -> Path:
    """A local folder holding the committed artifact at `uri`: checked in place when local,
    fetched (and checked) into `dest` when remote."""
    if _is_remote(uri):
        fetch_dir(uri, dest)
        return dest
    verify(uri)
    return Path(parse_uri(uri).path)


def _model_dir(uri: str, dest: Path) -> str:
    """A loadable model location: a committed artifact (fetched when remote), or, for the
    initial model, `model.path` as configured (a plain Hugging Face folder or a hub id)."""
    if _is_remote(uri):
        return str(_local_copy(uri, dest))
    local = Path(parse_uri(uri).path)
    if (local / MANIFEST_NAME).is_file():
        return str(_local_copy(uri, dest))
    return uri


def _commit(local: Path, uri: str) -> str:
    commit_dir(local, uri)
    return uri


def _committed(uri: str) -> bool:
    try:
        verify(uri)
    except (ArtifactNotFoundError, ArtifactIntegrityError):
        return False
    return True


def _read_stored_json(uri: str, name: str) -> Any | None:
    """The JSON file `name` of the artifact at `uri`, read alone (not the whole artifact);
    None when it is missing or not JSON."""
    store, prefix = open_store(uri)
    try:
        return json.loads(store.get_bytes(join_key(prefix, name)))
    except (ObjectNotFoundError, ValueError):
        return None


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
