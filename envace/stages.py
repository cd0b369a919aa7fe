"""Pipeline stages: functions of artifact URIs to artifact URIs.

The Kubeflow pipeline (pipelines/) is this loop, one component per call, with the round state in
the artifact store instead of in memory:

    prepared = prepare(cfg, store)                               # tasks + initial model; cacheable
    ckpt = warm_start(cfg, prepared.checkpoint_uri, prepared.tasks_uri, layout.warm_start)
    for it in range(rounds):
        rolled = rollout(cfg, ckpt, prepared.tasks_uri, it, layout.rollout(it))
        ckpt = train(cfg, ckpt, rolled.uri, layout.checkpoint(it), total_iterations=rounds).uri
    result = evaluate(cfg, ckpt, prepared.tasks_uri, layout.evaluation)

Every stage fetches its inputs into a scratch folder (checked against their manifests), and
commits what it writes with a manifest, so a step that dies leaves nothing a later step accepts.
One round is one RL iteration of `envace run`: the rollout step runs `RLTrainer.collect` with the
checkpoint of the previous round and stores the rows (rewards and advantages included, see
`envace.rollout.io`); the train step rebuilds the trainer from the same checkpoint, optimizer
state included (`trainer_state.pt`), runs `RLTrainer.update` on those rows and commits the next
checkpoint. Checkpoints use the layout of `envace run` (`policy/`, `simulator/` in noshare mode,
`trainer_state.pt`), plus `checkpoint.json` (iteration count, where RL started).

With `TrainJobLaunch(nodes > 1)` the train step runs as a Kubeflow Trainer TrainJob
(`envace pipeline train-step` under torchrun) and waits for it, surfacing its status and logs.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from envace.config import Config, load_config
from envace.errors import ConfigError, EnvaceError, UserInputError
from envace.evaluate.benchmarks import rehearsal_summary, rehearse_synthetic, write_memories
from envace.evaluate.rehearsal import (
    RehearsalConfig,
    RehearsalOutcome,
    parse_rehearsal,
    rehearsal_gain,
)
from envace.evaluate.report import trajectory_record
from envace.evaluate.runner import EvalResult, make_task_environment
from envace.policy.chat import ChatRenderer
from envace.report import fmt, markdown_table
from envace.rollout.grading import TaskGrader
from envace.rollout.io import read_rows, write_rows
from envace.storage.artifacts import (
    commit_dir,
    fetch_dir,
    open_store,
    uncommit,
    upload_files,
    verify,
    write_manifest,
)
from envace.storage.checkpoints import checkpoint_name
from envace.storage.errors import (
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    ObjectNotFoundError,
)
from envace.storage.manifest import MANIFEST_NAME
from envace.storage.uri import join_key, join_uri, parse_uri
from envace.train.distributed import dist_info
from envace.train.engine import TorchEngine, load_trainer_state
from envace.train.learners import (
    TRAINER_STATE,
    Learner,
    build_learners,
    restore_learners,
    role_learners,
    trainer_state,
    trains_simulator,
)
from envace.train.rl import RLTrainer
from envace.train.run import (
    RunPaths,
    close_policy,
    collective_timeout,
    evaluate_model,
    init_model,
    load_splits,
    model_policy,
    prepare_tasks,
    require_data_parallel,
    rollout_config,
    rollout_policy,
    simulator_policy,
)
from envace.train.run import warm_start as run_warm_start

__all__ = [
    "CHECKPOINT_META",
    "REHEARSAL_PREFIX",
    "ROLLOUT_META",
    "TRAIN_METRICS",
    "TRAIN_STEP_COMMAND",
    "CheckpointMeta",
    "Evaluation",
    "Prepared",
    "Rollout",
    "RunLayout",
    "StageError",
    "TrainJobLaunch",
    "Trained",
    "config_digest",
    "config_from_text",
    "config_json",
    "config_text",
    "evaluate",
    "evaluation_rehearsal",
    "evaluation_report",
    "log_kfp_metrics",
    "prepare",
    "prepared_uri",
    "rollout",
    "setup",
    "train",
    "train_step_args",
    "train_step_job_name",
    "warm_start",
]

log = logging.getLogger(__name__)

CHECKPOINT_META = "checkpoint.json"
ROLLOUT_META = "rollout.json"
TRAIN_METRICS = "train_metrics.json"
# What a TrainJob runs for one train step; Kubeflow Trainer supplies torchrun's rendezvous.
TRAIN_STEP_COMMAND = ("torchrun", "--no-python", "envace", "pipeline", "train-step")


class StageError(EnvaceError):
    """A stage cannot run on its inputs, or its TrainJob failed; the message says why and what next."""


# --- config and store -------------------------------------------------------------------------
def config_from_text(text: str) -> Config:
    """The validated config from YAML or JSON text (the pipeline's `config` parameter)."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise ConfigError(
            f"the pipeline parameter `config` is neither JSON nor YAML: {problem}{where}"
        ) from exc
    if data is not None and not isinstance(data, dict):
        raise ConfigError("the pipeline parameter `config` must be a mapping of config sections")
    with tempfile.TemporaryDirectory(prefix="envace-config-") as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(data or {}), encoding="utf-8")
        return load_config(path)


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
    return config_from_text(config)


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


def _commit_from_ranks(local: Path, uri: str, timeout_s: float) -> str:
    """Commit `uri` from every rank of a training job: each uploads its own files (its
    DeepSpeed shard; rank 0 also the weights and metadata), rank 0 writes the manifest over
    all of them once every rank is done. Works across nodes: nothing needs a shared disk. In a
    world of one this is `commit_dir`."""
    from envace.train.distributed import barrier, dist_info, gather_objects

    main = dist_info().is_main
    if main:
        uncommit(uri)
    barrier(f"uncommit {uri}", timeout_s)
    parts = gather_objects(upload_files(local, uri))
    if main:
        merged = {e.path: e for part in reversed(parts) for e in part}  # rank 0's copy wins
        write_manifest(uri, sorted(merged.values(), key=lambda e: e.path))
    barrier(f"commit {uri}", timeout_s)
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


# --- checkpoints ------------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointMeta:
    """A checkpoint's place in the run: RL iterations trained into it, and the checkpoint RL
    started from (the KL reference and the default frozen external simulator)."""

    iteration: int
    rl_start: str

    @classmethod
    def read(cls, folder: Path, uri: str) -> CheckpointMeta:
        path = folder / CHECKPOINT_META
        if not path.is_file():  # an initial or warm-start checkpoint: RL starts here
            return cls(0, uri)
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(int(data["iteration"]), str(data["rl_start"]))


@dataclass
class _Checkpoint:
    uri: str
    policy: Any
    tokenizer: Any
    simulator: Any | None  # noshare: the simulator's own model, once it has one
    state: dict[str, Any] | None  # trainer_state.pt: optimizer states, iteration, RNG
    meta: CheckpointMeta
    folder: Path | None = None  # the local copy (DeepSpeed state lives in <folder>/<model>/)


def _load_checkpoint(cfg: Config, uri: str, scratch: Path, with_state: bool) -> _Checkpoint:
    from transformers import AutoModelForCausalLM

    from envace.policy.hf_backend import load_model_and_tokenizer, resolve_dtype

    source = _model_dir(uri, scratch / hashlib.sha256(uri.encode()).hexdigest()[:12])
    folder = Path(source)
    if not (folder / "policy").is_dir():
        model, tokenizer = load_model_and_tokenizer(source, cfg.model.dtype)
        return _Checkpoint(uri, model, tokenizer, None, None, CheckpointMeta(0, uri), folder)
    model, tokenizer = load_model_and_tokenizer(folder / "policy", cfg.model.dtype)
    simulator = None
    if (folder / "simulator").is_dir():
        simulator = AutoModelForCausalLM.from_pretrained(
            folder / "simulator", dtype=resolve_dtype(cfg.model.dtype)
        )
    state = None
    if with_state and (folder / TRAINER_STATE).is_file():
        state = load_trainer_state(folder / TRAINER_STATE)
    meta = CheckpointMeta.read(folder, uri)
    return _Checkpoint(uri, model, tokenizer, simulator, state, meta, folder)


def _policy_dir(ckpt: _Checkpoint) -> Path | None:
    """The local Hugging Face folder of the checkpoint's policy (a vLLM engine loads it)."""
    if ckpt.folder is None or not ckpt.folder.is_dir():
        return None
    return ckpt.folder / "policy" if (ckpt.folder / "policy").is_dir() else ckpt.folder


def _rl_start_policy(cfg: Config, ckpt: _Checkpoint, scratch: Path) -> Any:
    """The policy as it was when RL started (a fresh copy when that is this checkpoint)."""
    if ckpt.meta.rl_start == ckpt.uri:
        return copy.deepcopy(ckpt.policy)
    return _load_checkpoint(cfg, ckpt.meta.rl_start, scratch, with_state=False).policy


def _saved_simulator(cfg: Config, ckpt: _Checkpoint) -> Any | None:
    """The simulator's own model when it trains: the checkpoint's, or the policy's copy."""
    if not trains_simulator(cfg):
        return None
    return ckpt.simulator if ckpt.simulator is not None else copy.deepcopy(ckpt.policy)


# --- prepare ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prepared:
    tasks_uri: str  # train.jsonl, test.jsonl, gold_train.jsonl
    checkpoint_uri: str  # the initial policy: the committed `model.preset` model, or `model.path`


def prepare(cfg: Config, store: str) -> Prepared:
    """Tasks and the initial model into `<store>/prepared/<config digest>/`.

    Deterministic in the config, so outputs that already verify are reused: runs of one config
    share them, and a rerun never un-commits an artifact another run is reading.
    """
    root = prepared_uri(store, cfg)
    tasks_uri = join_uri(root, "tasks")
    init_uri = join_uri(root, "init") if cfg.model.path is None else cfg.model.path
    if _committed(tasks_uri) and (cfg.model.path is not None or _committed(init_uri)):
        log.info("reusing the prepared tasks and initial model at %s", root)
        return Prepared(tasks_uri, init_uri)
    with _scratch() as tmp:
        paths = RunPaths(tmp, root)
        prepare_tasks(cfg, paths)
        if cfg.model.path is None:
            init_model(cfg, load_splits(paths.tasks), tmp / "init")
            paths.commit(tmp / "init")
    return Prepared(tasks_uri, init_uri)


# --- warm start -------------------------------------------------------------------------------
def warm_start(cfg: Config, checkpoint_uri: str, tasks_uri: str, out_uri: str) -> str:
    """Supervised warm start of both roles on the gold conversations; returns the checkpoint URI
    (`checkpoint_uri` itself when `warm_start.enabled` is false)."""
    if not cfg.warm_start.enabled:
        log.info("warm_start.enabled is false: RL starts from %s", checkpoint_uri)
        return checkpoint_uri
    with _scratch() as tmp:
        splits = load_splits(_local_copy(tasks_uri, tmp / "tasks"))
        ckpt = _load_checkpoint(cfg, checkpoint_uri, tmp, with_state=False)
        stats = run_warm_start(cfg, ckpt.policy, ckpt.tokenizer, splits)
        out = tmp / "out"
        TorchEngine(ckpt.policy, 1.0).save_model(out, ckpt.tokenizer)
        _write_json(out / "warm_start.json", {"source": checkpoint_uri, **stats})
        return _commit(out, out_uri)


# --- rollout ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rollout:
    uri: str  # rows (parquet or JSONL) + rollout.json
    metrics: dict[str, Any]  # reward, success, rows per role, timings (RLTrainer.collect)


def rollout(
    cfg: Config, checkpoint_uri: str, tasks_uri: str, iteration: int, out_uri: str
) -> Rollout:
    """RL iteration `iteration` (from 0), first half: episodes with the checkpoint's policy,
    rewards and role-wise advantages, stored as training rows."""
    with _scratch() as tmp:
        splits = load_splits(_local_copy(tasks_uri, tmp / "tasks"))
        ckpt = _load_checkpoint(cfg, checkpoint_uri, tmp, with_state=False)
        if ckpt.meta.iteration != iteration:
            raise StageError(
                f"rollout of iteration {iteration + 1} got {checkpoint_uri}, trained for "
                f"{ckpt.meta.iteration} iteration(s): rollouts must use the checkpoint of the "
                "round before (check the pipeline wiring)"
            )
        sim_policy = simulator_policy(
            cfg,
            ckpt.tokenizer,
            _saved_simulator(cfg, ckpt),
            lambda: _rl_start_policy(cfg, ckpt, tmp),
        )
        policy = rollout_policy(cfg, ckpt.policy, ckpt.tokenizer, _policy_dir(ckpt))
        try:
            trainer = RLTrainer(
                cfg,
                splits.train,
                policy,
                [],
                TaskGrader(),
                simulator=sim_policy,
                make_env=make_task_environment if cfg.rollout.mode == "real" else None,
            )
            rows, metrics = trainer.collect(iteration)
        finally:
            close_policy(policy)
        out = tmp / "out"
        write_rows(rows, out)
        meta = {"iteration": iteration, "checkpoint": checkpoint_uri, "tasks": tasks_uri}
        _write_json(out / ROLLOUT_META, {**meta, "metrics": metrics})
        return Rollout(_commit(out, out_uri), metrics)


# --- train ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trained:
    uri: str  # the next checkpoint
    metrics: dict[str, Any]  # loss, clip fractions, grad norm per learner (RLTrainer.update)


@dataclass(frozen=True)
class TrainJobLaunch:
    """Where the train step runs. `nodes` > 1: as a Kubeflow Trainer TrainJob on the `runtime`
    that charts/envace installs, `gpus_per_node` GPUs per node (None or 0: the runtime's
    resources), in `namespace` (default: the pod's, or the kubeconfig context's)."""

    nodes: int = 1
    gpus_per_node: int | None = None
    runtime: str = "envace"
    image: str | None = None
    namespace: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    poll_interval_s: float = 15.0
    timeout_s: float | None = None
    log_lines: int = 50  # last lines of each node's log shown when the job ends


def train(
    cfg: Config,
    checkpoint_uri: str,
    trajectories_uri: str,
    out_uri: str,
    *,
    total_iterations: int | None = None,
    launch: TrainJobLaunch | None = None,
    emit: Callable[[str], None] | None = None,
    processes: int | None = None,
) -> Trained:
    """RL iteration, second half: PPO on the rollout's rows, from the checkpoint that generated
    them (optimizer state included), committed as the next checkpoint at `out_uri`.

    `total_iterations`: iterations the lr schedule spans (the pipeline's rounds; default
    `train.iterations`). With `launch.nodes > 1` the update runs as a TrainJob; `emit` receives
    its status lines and logs (default: the log). Otherwise it runs here: with `processes` > 1
    (default with `train.engine: deepspeed`: one per visible GPU) as that many local ranks
    under torchrun, so a pod with several GPUs uses all of them.
    """
    horizon = total_iterations if total_iterations is not None else cfg.train.iterations
    uris = (checkpoint_uri, trajectories_uri, out_uri)
    _check_train_output(*uris)
    earlier = _earlier_attempt(cfg, uris, horizon)  # refuses a foreign committed output
    if launch is not None and launch.nodes > 1:  # a retry follows the job it created before
        return _train_with_trainjob(cfg, uris, horizon, launch, emit or log.info)
    if earlier is not None:
        return earlier
    if processes is None:
        multi_gpu = cfg.train.engine == "deepspeed" and torch.cuda.device_count() > 1
        inside_job = "WORLD_SIZE" in os.environ
        processes = torch.cuda.device_count() if multi_gpu and not inside_job else 1
    if processes > 1:
        return _train_with_local_ranks(cfg, uris, horizon, processes, emit or log.info)
    return _train_here(cfg, checkpoint_uri, trajectories_uri, out_uri, horizon)


def _location(uri: str) -> tuple[str, ...]:
    """Where `uri` points, as path parts that compare across spellings: a local path resolved
    (`..`, symlinks), an object key with minio:// and s3:// alike (one endpoint serves both)."""
    parsed = parse_uri(uri)
    if parsed.is_local:
        return ("file", *Path(os.path.realpath(parsed.path)).parts)
    return ("object", parsed.bucket, *(parsed.key.split("/") if parsed.key else ()))


def _check_train_output(checkpoint_uri: str, trajectories_uri: str, out_uri: str) -> None:
    """Refuse an output that is, is inside or contains an input: committing it would un-commit
    that input and mix the new checkpoint's files into it."""
    out = _location(out_uri)
    for what, flag, uri in (
        ("input checkpoint", "--checkpoint", checkpoint_uri),
        ("rows", "--trajectories", trajectories_uri),
    ):
        where = _location(uri)
        shared = min(len(out), len(where))
        if out[:shared] != where[:shared]:
            continue
        if len(out) == len(where):
            relation = "is"
        else:
            relation = "is inside" if len(out) > len(where) else "contains"
        raise UserInputError(
            f"train: the output {out_uri} (--out) {relation} the {what} {uri} ({flag}); "
            "committing there would overwrite the input: give the next checkpoint a location "
            "of its own (the pipeline's is <store>/<run id>/checkpoints/rl/iter_NNNNNN)"
        )


def _step_inputs(
    cfg: Config, checkpoint_uri: str, trajectories_uri: str, horizon: int
) -> dict[str, Any]:
    """What a train step's result is a function of; its checkpoint.json records them."""
    return {
        "checkpoint": checkpoint_uri,
        "rows": trajectories_uri,
        "config_digest": config_digest(cfg),
        "total_iterations": horizon,
    }


def _earlier_attempt(cfg: Config, uris: tuple[str, str, str], horizon: int) -> Trained | None:
    """The checkpoint already committed at the output by an earlier attempt of this same step
    (KFP retries a failed task with the same output URI): returned as it is, never un-committed
    (the next step may be reading it). None when nothing is committed there. Anything else
    committed there is refused: a train step never replaces a committed artifact."""
    checkpoint_uri, trajectories_uri, out_uri = uris
    if not _committed(out_uri):
        return None
    meta = _read_stored_json(out_uri, CHECKPOINT_META)
    expected = _step_inputs(cfg, checkpoint_uri, trajectories_uri, horizon)
    if not isinstance(meta, dict) or {k: meta.get(k) for k in expected} != expected:
        what = "a checkpoint trained from other inputs" if isinstance(meta, dict) else "an artifact"
        raise UserInputError(
            f"train: the output {out_uri} (--out) already holds {what} (checkpoint, rows, config "
            "or total iterations differ); a train step never replaces a committed artifact: "
            "give the next checkpoint a new location, or delete that one first"
        )
    metrics = _read_stored_json(out_uri, TRAIN_METRICS)
    log.info("%s: committed by an earlier attempt of this step from the same inputs", out_uri)
    return Trained(out_uri, metrics if isinstance(metrics, dict) else {})


def _train_with_local_ranks(
    cfg: Config,
    uris: tuple[str, str, str],
    horizon: int,
    processes: int,
    emit: Callable[[str], None],
) -> Trained:
    """The train step as `processes` local DeepSpeed ranks: the TrainJob's command under a
    single-node torchrun, its output passed to `emit`; fails with its last lines."""
    import subprocess
    import sys

    require_data_parallel(cfg, f"a train step on {processes} processes")
    with _scratch() as tmp:
        config = tmp / "config.yaml"
        config.write_text(config_text(cfg), encoding="utf-8")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        cmd += ["--nproc_per_node", str(processes), "-m", "envace", "pipeline", "train-step"]
        cmd += ["--config", str(config), *train_step_args(*uris, horizon)]
        emit(f"train step on {processes} local ranks: {' '.join(cmd[2:])}")
        tail: list[str] = []
        with subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                emit(line.rstrip("\n"))
                tail = [*tail[-49:], line.rstrip("\n")]
        if proc.returncode != 0:
            raise StageError(
                f"the train step's {processes} ranks failed (exit {proc.returncode}); last "
                "lines:\n" + "\n".join(tail)
            )
    return _read_trained(uris[2])


def _check_world(cfg: Config) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        require_data_parallel(cfg, f"WORLD_SIZE={world}")


def _read_rows_for(checkpoint_uri: str, trajectories_uri: str, dest: Path) -> list[Any]:
    folder = _local_copy(trajectories_uri, dest)
    produced = json.loads((folder / ROLLOUT_META).read_text(encoding="utf-8"))
    if produced["checkpoint"] != checkpoint_uri:
        raise StageError(
            f"{trajectories_uri} was generated by {produced['checkpoint']}, not by "
            f"{checkpoint_uri}: PPO must update the policy that sampled the rows (check the "
            "pipeline wiring)"
        )
    return read_rows(folder)


def _train_here(
    cfg: Config, checkpoint_uri: str, trajectories_uri: str, out_uri: str, horizon: int
) -> Trained:
    _check_world(cfg)
    with _scratch() as tmp:
        rows = _read_rows_for(checkpoint_uri, trajectories_uri, tmp / "rows")
        ckpt = _load_checkpoint(cfg, checkpoint_uri, tmp, with_state=True)
        learners = build_learners(cfg, ckpt.policy, ckpt.simulator, horizon)
        if ckpt.state is not None:
            assert ckpt.folder is not None
            restore_learners(learners, ckpt.state, ckpt.folder, checkpoint_uri)
        # The KL reference is the RL-start policy, not this round's (None: RLTrainer copies it).
        ref = None
        if cfg.algo.kl_coef > 0 and ckpt.meta.rl_start != checkpoint_uri:
            ref = _rl_start_policy(cfg, ckpt, tmp)
        trainer = RLTrainer(
            cfg,
            [],
            model_policy(ckpt.policy, ckpt.tokenizer, cfg),
            role_learners(learners, ChatRenderer(ckpt.tokenizer).pad_id),
            TaskGrader(),
            ref_model=ref,
        )
        metrics = trainer.update(rows)
        out = tmp / "out"
        iteration = ckpt.meta.iteration + 1
        for lr in learners:
            lr.engine.save_model(out / lr.name, ckpt.tokenizer)  # collective with DeepSpeed
        if dist_info().is_main:
            made_from = _step_inputs(cfg, checkpoint_uri, trajectories_uri, horizon)
            _write_train_outputs(out, learners, iteration, ckpt, made_from, metrics)
        out.mkdir(parents=True, exist_ok=True)  # a rank may have nothing else to write
        return Trained(_commit_from_ranks(out, out_uri, collective_timeout(cfg)), metrics)


def _write_train_outputs(
    out: Path,
    learners: Sequence[Learner],
    iteration: int,
    ckpt: _Checkpoint,
    made_from: Mapping[str, Any],
    metrics: Mapping[str, Any],
) -> None:
    """trainer_state.pt, checkpoint.json (with the step's inputs, `made_from`: a retry
    recognises its own output by them) and the train metrics beside the weights."""
    torch.save(trainer_state(iteration, learners), out / TRAINER_STATE)
    meta = CheckpointMeta(iteration, ckpt.meta.rl_start)
    _write_json(out / CHECKPOINT_META, {**dataclasses.asdict(meta), **made_from})
    _write_json(out / TRAIN_METRICS, metrics)


# --- train as a TrainJob ----------------------------------------------------------------------
def train_step_job_name(out_uri: str) -> str:
    """The TrainJob of the step writing `out_uri`: the same name when a step is retried, so the
    retry follows the job instead of starting a second one."""
    return f"envace-step-{hashlib.sha256(out_uri.encode()).hexdigest()[:12]}"


def train_step_args(
    checkpoint_uri: str, trajectories_uri: str, out_uri: str, total_iterations: int
) -> list[str]:
    """Arguments of `envace pipeline train-step` after `--config FILE`."""
    return [
        "--checkpoint",
        checkpoint_uri,
        "--trajectories",
        trajectories_uri,
        "--out",
        out_uri,
        "--total-iterations",
        str(total_iterations),
    ]


def _create_or_follow_existing(
    client: Any, spec: Any, text: str, emit: Callable[[str], None]
) -> None:
    """Create the TrainJob and its config ConfigMap; a TrainJob of that name already there is
    this step's, from an earlier attempt of it: follow that one."""
    from kubernetes.client.exceptions import ApiException

    from envace.cluster.submit import ClusterError

    try:
        client.create(spec, text)
    except ClusterError as exc:
        if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 409:
            where = f"{client.namespace}/{spec.name}"
            emit(f"{where}: exists already (an earlier attempt of this step); following it")
            return
        raise


def _emit_node_logs(client: Any, name: str, lines: int, emit: Callable[[str], None]) -> None:
    """The last `lines` lines of each node's log (best effort: the job's outcome stands)."""
    from envace.cluster.submit import ClusterError, api_errors

    selector = f"jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name=node"
    try:
        with api_errors(f"reading the logs of TrainJob {name}", client.host):
            pods = client.core.list_namespaced_pod(
                client.namespace, label_selector=selector, _request_timeout=30
            )
            for pod in pods.items:
                text = client.core.read_namespaced_pod_log(
                    pod.metadata.name,
                    client.namespace,
                    container="node",
                    tail_lines=lines,
                    _request_timeout=30,
                )
                emit(f"--- {pod.metadata.name}: last {lines} log lines ---")
                for line in str(text).splitlines():
                    emit(line)
    except ClusterError as exc:
        log.warning("the node logs of TrainJob %s are not available: %s", name, exc)


def _read_trained(out_uri: str) -> Trained:
    with _scratch() as tmp:
        folder = _local_copy(out_uri, tmp / "ckpt")
        metrics = json.loads((folder / TRAIN_METRICS).read_text(encoding="utf-8"))
    return Trained(out_uri, metrics)


def _train_with_trainjob(
    cfg: Config,
    uris: tuple[str, str, str],
    horizon: int,
    launch: TrainJobLaunch,
    emit: Callable[[str], None],
) -> Trained:
    from envace.cluster.submit import TrainJobClient, connect, follow
    from envace.cluster.trainjob import JOB_CONFIG_PATH, TrainJobSpec

    out_uri = uris[2]
    require_data_parallel(cfg, "train with nodes > 1 (one process per GPU)")
    if not _is_remote(out_uri):
        raise UserInputError(
            f"train with nodes > 1 writes {out_uri} from TrainJob pods, which cannot reach a "
            "local folder: use a minio:// or s3:// store"
        )
    api_client, namespace = connect(launch.kubeconfig, launch.context)
    client = TrainJobClient(api_client, launch.namespace or namespace)
    spec = TrainJobSpec(
        name=train_step_job_name(out_uri),
        namespace=client.namespace,
        nodes=launch.nodes,
        gpus_per_node=launch.gpus_per_node or None,
        runtime=launch.runtime,
        image=launch.image,
        store=out_uri,
        command=TRAIN_STEP_COMMAND,
        args=("--config", JOB_CONFIG_PATH, *train_step_args(*uris, horizon)),
    )
    _create_or_follow_existing(client, spec, config_text(cfg), emit)
    state = follow(
        client, spec.name, interval=launch.poll_interval_s, emit=emit, timeout=launch.timeout_s
    )
    _emit_node_logs(client, spec.name, launch.log_lines, emit)
    if not state.succeeded:
        raise StageError(
            f"TrainJob {client.namespace}/{spec.name} {state.phase.lower()}: "
            f"{state.message or state.describe()}. Its node logs are above; more with "
            f"`envace cluster status {spec.name} -n {client.namespace}` and `kubectl logs`"
        )
    return _read_trained(out_uri)


# --- evaluate ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Evaluation:
    uri: str  # metrics.json, trajectories.jsonl, report.md (+ rehearsal/ with test-time rehearsal)
    metrics: dict[str, Any]  # EvalMetrics.to_dict() (+ `rehearsal/*` with test-time rehearsal)
    report: str  # Markdown


_REPORTED = (
    ("success_rate", "episodes that completed every turn and met the task's checks"),
    ("mean_reward", "mean episode reward"),
    ("per_turn_score", "mean score of a user turn"),
    ("valid_call_rate", "tool calls naming a tool with schema-valid arguments"),
    ("calls_per_task", "tool calls per episode"),
    ("rehearsal_fidelity", "rehearsed results equal to the real ones (exact JSON)"),
    ("rehearsal_field_fidelity", "top-level fields the rehearsal got right"),
    ("error_flag_recall", "real errors the rehearsal also predicted"),
    ("error_flag_false_rate", "real successes the rehearsal predicted as errors"),
    ("format_error_rate", "episodes ended by a malformed output"),
)

# Test-time rehearsal figures (`RehearsalGain` fields), reported as `rehearsal/<field>`.
_REHEARSAL_REPORTED = (
    ("success_without", "success per task of the committed execution without notes"),
    ("success_with", "success per task of the committed execution with the rehearsal notes"),
    ("gain", "success with - success without (a fraction)"),
    ("extra_tokens", "tokens the rehearsal generated: imagined attempts (both roles) + notes"),
    ("extra_tokens_per_task", "extra tokens per task"),
    ("extra_generations", "generations the rehearsal added (attempts + note writes)"),
    ("memory_tokens_per_task", "tokens of the final notes per task (the real context grows by)"),
)
REHEARSAL_PREFIX = "rehearsal/"


def evaluation_rehearsal(spec: str | None) -> RehearsalConfig | None:
    """The evaluate step's `rehearsal` parameter (the pipeline's `eval_rehearsal`) as a
    `RehearsalConfig`: `parallel:N` | `sequential:N` as `envace evaluate --rehearsal` takes it,
    the other settings at the CLI's defaults; empty or None: no test-time rehearsal."""
    text = (spec or "").strip()
    if not text:
        return None
    try:
        return parse_rehearsal(text)
    except UserInputError as exc:
        raise UserInputError(
            f"rehearsal {spec!r} (the evaluate step's `rehearsal`, the pipeline parameter "
            "`eval_rehearsal`): expected parallel:N or sequential:N with N >= 1 imagined attempts "
            "per task (e.g. parallel:4 or sequential:2), or empty for no test-time rehearsal"
        ) from exc


def _rehearsal_lines(metrics: Mapping[str, Any], rehearsal: RehearsalConfig | None) -> list[str]:
    if rehearsal is None:
        return [
            "Test-time rehearsal: none (committed execution only; the `rehearsal` parameter "
            "takes parallel:N or sequential:N).",
            "",
        ]
    config = {k: v for k, v in dataclasses.asdict(rehearsal).items() if k != "memory_prompt"}
    gain = {
        k.removeprefix(REHEARSAL_PREFIX): v
        for k, v in metrics.items()
        if k.startswith(REHEARSAL_PREFIX)
    }
    how = (
        "independent imagined attempts, condensed once"
        if rehearsal.mode == "parallel"
        else "imagined attempts one after another, each seeing the notes so far"
    )
    rows = [(REHEARSAL_PREFIX + k, gain.get(k), why) for k, why in _REHEARSAL_REPORTED]
    return [
        f"## Test-time rehearsal: {rehearsal.mode}:{rehearsal.n}",
        "",
        f"After the committed execution above, the policy rehearsed each task privately "
        f"({rehearsal.n} {how}; it wrote the tool results itself, nothing real ran), condensed "
        f"the attempts into notes of at most {rehearsal.memory_tokens} tokens and executed the "
        "task again in its real world with the notes in its system prompt (same tasks, seeds "
        "and sampling). That execution's metrics, episodes and the notes are in `rehearsal/` "
        "(metrics.json, trajectories.jsonl, memories.jsonl).",
        "",
        rehearsal_summary(config, gain),
        "",
        markdown_table(["metric", "value", "meaning"], rows),
        "",
    ]


def evaluation_report(
    metrics: Mapping[str, Any],
    checkpoint_uri: str,
    meta: CheckpointMeta,
    uris: Sequence[str],
    rehearsal: RehearsalConfig | None = None,
) -> str:
    """The Markdown report of an evaluation (`uris`: tasks, results); with `rehearsal`, a section
    on the test-time rehearsal from the `rehearsal/*` entries of `metrics`."""
    tasks_uri, out_uri = uris
    results = "metrics.json, trajectories.jsonl, report.md" + (", rehearsal/" if rehearsal else "")
    rows = [(name, metrics.get(name), why) for name, why in _REPORTED]
    ends = ", ".join(f"{k}: {v}" for k, v in sorted(metrics.get("end_reasons", {}).items()))
    lines = [
        "# EnvACE evaluation",
        "",
        f"Committed execution in the tasks' real worlds: {metrics.get('n_tasks')} held-out "
        f"task(s), {metrics.get('n_episodes')} episode(s); before each real call the policy "
        "also rehearsed its result (fidelity rows; n/a when `eval.probe_fidelity` is off).",
        "",
        markdown_table(["metric", "value", "meaning"], rows),
        "",
        f"End reasons: {ends or 'none'}. Unscored episodes: {fmt(metrics.get('unscored'))}.",
        "",
        *_rehearsal_lines(metrics, rehearsal),
        markdown_table(
            ["artifact", "URI"],
            [
                ("checkpoint", f"`{checkpoint_uri}` ({meta.iteration} RL iteration(s))"),
                ("RL started from", f"`{meta.rl_start}`"),
                ("tasks", f"`{tasks_uri}`"),
                ("results", f"`{out_uri}` ({results})"),
            ],
        ),
        "",
    ]
    return "\n".join(lines)


def _rehearse(
    cfg: Config, ckpt: _Checkpoint, baseline: EvalResult, rehearsal: RehearsalConfig
) -> tuple[RehearsalOutcome, EvalResult]:
    """Test-time rehearsal of the tasks `baseline` executed, then their execution with the
    notes, as `envace evaluate --rehearsal` does, with the baseline's policy and settings."""
    tasks = list({t.uid: t.task for t in baseline.trajectories}.values())
    return rehearse_synthetic(
        model_policy(ckpt.policy, ckpt.tokenizer, cfg, trainable=False),
        tasks,
        rollout_config(cfg, eval_mode=True),
        rehearsal,
        probe_fidelity=cfg.eval.probe_fidelity,
        n=cfg.eval.n,
        seed=cfg.seed,
        progress=True,
    )


def _write_rehearsal(
    folder: Path, rehearsal: RehearsalConfig, outcome: RehearsalOutcome, rehearsed: EvalResult
) -> None:
    """rehearsal/: the execution with notes (metrics.json, trajectories.jsonl) and the notes."""
    config = {k: v for k, v in dataclasses.asdict(rehearsal).items() if k != "memory_prompt"}
    _write_json(folder / "metrics.json", {**rehearsed.metrics.to_dict(), "config": config})
    lines = "".join(json.dumps(trajectory_record(t)) + "\n" for t in rehearsed.trajectories)
    (folder / "trajectories.jsonl").write_text(lines, encoding="utf-8")
    write_memories(outcome, folder / "memories.jsonl")


def evaluate(
    cfg: Config,
    checkpoint_uri: str,
    tasks_uri: str,
    out_uri: str,
    *,
    rehearsal: str | None = None,
) -> Evaluation:
    """Held-out evaluation of the checkpoint's policy by committed execution in the real worlds
    (with rehearsal-fidelity probes when `eval.probe_fidelity`).

    `rehearsal` (`parallel:N` | `sequential:N`, as `envace evaluate --rehearsal`): then the
    policy also rehearses each task privately and executes it again with its notes; the metrics
    gain `rehearsal/*` (success without and with, gain, extra tokens), the report a section
    naming the mode, the results a `rehearsal/` folder. Empty or None: committed execution only.
    """
    rcfg = evaluation_rehearsal(rehearsal)  # a bad spec fails before anything loads
    with _scratch() as tmp:
        splits = load_splits(_local_copy(tasks_uri, tmp / "tasks"))
        if not splits.test:
            raise StageError(f"{tasks_uri} holds no held-out tasks (test.jsonl) to evaluate on")
        ckpt = _load_checkpoint(cfg, checkpoint_uri, tmp, with_state=False)
        result = evaluate_model(ckpt.policy, ckpt.tokenizer, cfg, splits.test, "pipeline")
        metrics = result.metrics.to_dict()
        out = tmp / "out"
        if rcfg is not None:
            outcome, rehearsed = _rehearse(cfg, ckpt, result, rcfg)
            gain = rehearsal_gain(result.trajectories, rehearsed.trajectories, outcome)
            metrics.update({REHEARSAL_PREFIX + k: v for k, v in gain.to_dict().items()})
            _write_rehearsal(out / "rehearsal", rcfg, outcome, rehearsed)
        report = evaluation_report(
            metrics, checkpoint_uri, ckpt.meta, (tasks_uri, out_uri), rehearsal=rcfg
        )
        _write_json(out / "metrics.json", {**metrics, "checkpoint": checkpoint_uri})
        (out / "report.md").write_text(report, encoding="utf-8")
        lines = "".join(json.dumps(trajectory_record(t)) + "\n" for t in result.trajectories)
        (out / "trajectories.jsonl").write_text(lines, encoding="utf-8")
        return Evaluation(_commit(out, out_uri), metrics, report)
