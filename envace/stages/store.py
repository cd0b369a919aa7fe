"""The pipeline's config passing and store layout: the config as a step parameter, the typed KFP
artifacts that point at store URIs, the run's URIs (`RunLayout`), scratch folders and committing
what a step wrote."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from envace.config import Config, config_from_mapping, config_from_text
from envace.errors import ConfigError, EnvaceError, UserInputError
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
from envace.train.tracking import (
    TRACKING_SECRET_DIR_ENV,
    MetricsLogger,
    MlflowTarget,
    TrackedRun,
    export_tracking_secrets,
)

log = logging.getLogger(__name__)


CHECKPOINT_META = "checkpoint.json"
ROLLOUT_META = "rollout.json"
EPISODES = "episodes.jsonl"  # a rollout's scored trajectories (train.save_rollouts)
TRAIN_METRICS = "train_metrics.json"


class StageError(EnvaceError):
    """A stage cannot run on its inputs, or its TrainJob failed; the message says why and what next."""


# --- config and store -------------------------------------------------------------------------
CONFIG_SOURCE = "the pipeline parameter `config`"


def pipeline_config(value: str | Mapping[str, Any]) -> Config:
    """The validated config from the pipeline's `config` parameter: a mapping (the run parameter
    is a KFP struct: the config's sections as a JSON object) or YAML / JSON text."""
    if isinstance(value, str):
        return config_from_text(value, CONFIG_SOURCE)
    return config_from_mapping(value, CONFIG_SOURCE)


def config_struct(cfg: Config) -> dict[str, Any]:
    """The pipeline's `config` parameter for `cfg` (a KFP struct): by section, the values that
    differ from the defaults, so the UI shows what a run changes; `pipeline_config` reads it
    back to `cfg`. KFP refuses null in a struct, so a setting turned off with null where its
    default is on (algo.dual_clip) cannot travel: ConfigError naming it."""
    changes = _changed(cfg.to_dict(), Config().to_dict(), Config)
    nulls = [path for path, value in _leaves(changes) if value is None]
    if nulls:
        raise ConfigError(
            f"{', '.join(nulls)}: null cannot be a value of the pipeline's `config` parameter"
            " (KFP refuses null in a struct parameter); keep the default for pipeline runs, or"
            " train with this setting through `envace run` or `envace cluster submit`"
        )
    if pipeline_config(changes).to_dict() != cfg.to_dict():  # a guard on _changed itself
        raise ConfigError("the config does not survive its conversion to a KFP struct")
    return changes


def _changed(values: dict[str, Any], defaults: dict[str, Any], cls: Any) -> dict[str, Any]:
    """The entries of `values` (a dataclass's `asdict`) that differ from `defaults`; nested
    config sections (dataclasses) by their changed fields, any other value whole."""
    hints = get_type_hints(cls)
    out: dict[str, Any] = {}
    for key, value in values.items():
        if is_dataclass(hints[key]):
            section = _changed(value, defaults[key], hints[key])
            if section:
                out[key] = section
        elif value != defaults[key]:
            out[key] = value
    return out


def _leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def config_text(cfg: Config) -> str:
    """Every key of `cfg` as YAML, in schema order (what a TrainJob's ConfigMap holds)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)


def config_digest(cfg: Config) -> str:
    """16 hex digits that change whenever any config value does."""
    canonical = json.dumps(cfg.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def setup(config: str | Mapping[str, Any], store_endpoint: str) -> Config:
    """What every pipeline component does first: log to stderr, point the S3 client at
    `store_endpoint` (credentials come from the Secret as ENVACE_S3_* variables), read the
    tracking Secret mounted at $ENVACE_TRACKING_SECRET_DIR (MLflow / W&B variables, one file
    each; absent: no tracking credentials), parse the config."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    os.environ["ENVACE_S3_ENDPOINT"] = store_endpoint
    tracking = os.environ.get(TRACKING_SECRET_DIR_ENV)
    if tracking:
        export_tracking_secrets(Path(tracking))
    return pipeline_config(config)


def _finite(values: Mapping[str, Any]) -> dict[str, float]:
    return {
        key: float(value)
        for key, value in values.items()
        if isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    }


def log_kfp_metrics(artifact: Any, values: Mapping[str, Any]) -> dict[str, float]:
    """Log the finite numbers of `values` on a KFP `Metrics` artifact; returns what was logged."""
    logged = _finite(values)
    for key, value in logged.items():
        artifact.log_metric(key, value)
    return logged


def track_metrics(cfg: Config, run_uri: str, step: int, values: Mapping[str, Any]) -> bool:
    """Mirror a step's finite metrics to the trackers `cfg` turns on (MLflow:
    mlflow_tracking_uri or $MLFLOW_TRACKING_URI; W&B: wandb_project) at `step`, the RL
    iteration. One tracker run per pipeline run, keyed by its store folder `run_uri`
    (`TrackedRun`): every step and every retry continues it, and a retry does not log a step's
    values twice. Returns whether any tracker is on. A tracker that cannot be reached fails
    the step (it retries; the step's committed output is kept)."""
    mlflow = MlflowTarget.from_config(cfg)
    if mlflow is None and not cfg.wandb_project:
        return False
    with _scratch() as tmp:
        logger = MetricsLogger(
            tmp,
            tensorboard=False,
            wandb_project=cfg.wandb_project,
            config=cfg.to_dict(),
            run=TrackedRun(run_uri),
            mlflow=mlflow,
        )
        try:
            logger.log({**_finite(values), "iteration": step})
        except BaseException:
            logger.close(failed=True)
            raise
        logger.close()
    return True


# --- typed artifacts ---------------------------------------------------------------------------
STORE_URI = "store_uri"  # the metadata key of an artifact that points at a store folder


def point_artifact(artifact: Any, uri: str) -> str:
    """Make the KFP output `artifact` (a Model, Dataset or Artifact) stand for the committed store
    folder `uri`: its metadata `store_uri` (shown in the UI, passed to the steps that read it)
    and its file, a one-line JSON pointer. The folder itself stays in the store: artifacts are
    passed by reference, so a checkpoint is never copied into KFP's pipeline root."""
    artifact.metadata[STORE_URI] = uri
    path = Path(artifact.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({STORE_URI: uri}) + "\n", encoding="utf-8")
    return uri


def artifact_uri(artifact: Any) -> str:
    """The store URI the KFP input `artifact` points at (`point_artifact`): its metadata, else its
    pointer file; StageError naming the artifact when it points nowhere."""
    uri = artifact.metadata.get(STORE_URI)
    if not uri:
        with suppress(OSError, ValueError, AttributeError, TypeError):
            uri = json.loads(Path(artifact.path).read_text(encoding="utf-8")).get(STORE_URI)
    if not isinstance(uri, str) or not uri:
        raise StageError(
            f"input artifact {artifact.name!r} ({artifact.uri}) has no {STORE_URI!r} metadata"
            " or pointer file: it was not written by an EnvACE step; connect the output of the"
            " step that produced it (prepare, warm start, rollout or train)"
        )
    return uri


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
