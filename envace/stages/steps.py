"""The stage functions: prepare, warm start, rollout, train (here, on local ranks, or as a
TrainJob). Each maps artifact URIs to artifact URIs."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from envace.config import Config
from envace.errors import UserInputError
from envace.evaluate.report import write_trajectories
from envace.policy.chat import ChatRenderer
from envace.rollout.grading import TaskGrader
from envace.rollout.io import read_rows, write_rows
from envace.run import (
    RunPaths,
    commit_from_ranks,
    init_model,
    load_splits,
    model_policy,
    prepare_tasks,
    require_data_parallel,
    rollout_policy,
    tool_results,
)
from envace.run import warm_start as run_warm_start
from envace.stages.checkpoint import (
    CheckpointMeta,
    _Checkpoint,
    _load_checkpoint,
    _policy_dir,
    _rl_start_policy,
    _saved_simulator,
)
from envace.stages.store import (
    CHECKPOINT_META,
    EPISODES,
    ROLLOUT_META,
    TRAIN_METRICS,
    StageError,
    _commit,
    _committed,
    _local_copy,
    _read_stored_json,
    _scratch,
    _write_json,
    config_digest,
    config_text,
    prepared_uri,
)
from envace.stages.trainjob import (
    Trained,
    TrainJobLaunch,
    _read_trained,
    _train_with_trainjob,
    train_step_args,
)
from envace.storage.uri import join_uri, parse_uri
from envace.train.adapters import save_hf_checkpoint
from envace.train.distributed import dist_info
from envace.train.learners import (
    TRAINER_STATE,
    Learner,
    build_learners,
    restore_learners,
    role_learners,
    trainer_state,
)
from envace.train.rl import RLTrainer

log = logging.getLogger(__name__)


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
        save_hf_checkpoint(ckpt.policy, out, ckpt.tokenizer)
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
        sources = tool_results(
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
                sources,
            )
            rows, metrics = trainer.collect(iteration)
        finally:
            policy.close()
        out = tmp / "out"
        write_rows(rows, out)
        if cfg.train.save_rollouts:  # the episodes themselves, beside the rows
            write_trajectories(trainer.last_trajectories, out / EPISODES, rows=True)
        meta = {"iteration": iteration, "checkpoint": checkpoint_uri, "tasks": tasks_uri}
        _write_json(out / ROLLOUT_META, {**meta, "metrics": metrics})
        return Rollout(_commit(out, out_uri), metrics)


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
        return Trained(
            commit_from_ranks(out, out_uri, cfg.train.deepspeed.collective_timeout_s), metrics
        )


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
