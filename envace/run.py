"""`envace run`: the whole method on one machine.

generate tasks -> build (or load) the model -> evaluate untrained -> warm start -> evaluate ->
RL with world rehearsal -> evaluate, with a progress bar per stage, a final comparison table,
metrics.jsonl / summary.json / a PNG plot / TensorBoard events, and checkpoints committed to the
artifact store (a local folder by default) with manifests, so `--resume` continues from the
newest complete one.

Started by torchrun with several processes (`train.engine: deepspeed`), every rank runs this
same function: rank 0 alone writes reports, metrics and commits; the first process of each node
prepares the tasks and the initial checkpoint on its disk while the others wait at a barrier;
the warm start runs on every rank and rank 0's weights are broadcast so the replicas are
identical; RL is data parallel (`envace.train.rl`); evaluations run on rank 0 with the weights
gathered (`generation_context`) while the other ranks wait at a barrier. Checkpoints of a
multi-node job need `--out` on a filesystem every node shares (each rank writes its DeepSpeed
shard there and rank 0 commits the directory).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from envace.config import Config
from envace.errors import ConfigError, UserInputError
from envace.evaluate.runner import EvalResult, evaluate_policy, make_task_environment
from envace.policy.chat import ChatRenderer
from envace.policy.hf_backend import TransformersBackend, resolve_dtype
from envace.report import text_table
from envace.rollout.engine import RolloutConfig
from envace.rollout.grading import TaskGrader
from envace.rollout.policies import ModelPolicy
from envace.rollout.sources import ToolResults
from envace.tasks.io import atomic_write_text
from envace.tasks.model import Task
from envace.train.adapters import Trainable
from envace.train.batch import TrainRow
from envace.train.distributed import (
    DistInfo,
    barrier,
    dist_info,
    init_process_group,
    shutdown,
)
from envace.train.engine import (
    TorchEngine,
    TrainingEngine,
    load_trainer_state,
    require_finite_weights,
)
from envace.train.learners import (
    TRAINER_STATE,
    Learner,
    build_learners,
    restore_learners,
    role_learners,
    trainer_state,
    trains_simulator,
)
from envace.train.rl import RLTrainer, generation_ready
from envace.train.sft import build_sft_rows, run_sft, sft_steps
from envace.train.tracking import MetricsLogger, NullLogger, TrackedRun, plot_progress

__all__ = ["RunPaths", "TaskSplits", "load_splits", "prepare_tasks", "run_main"]

log = logging.getLogger(__name__)

STAGE_NAMES = ("untrained", "warm_start", "rl")


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


# --- tasks ------------------------------------------------------------------------------------
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


# --- model ------------------------------------------------------------------------------------
def tokenizer_corpus(cfg: Config, splits: TaskSplits) -> list[str]:
    """Texts the tiny tokenizer is trained on: every warm-start prompt and response, rendered."""
    from envace.policy.tiny import build_tokenizer

    bootstrap = ChatRenderer(build_tokenizer(["<|im_start|>"], vocab_size=300))
    roomy = dataclasses.replace(
        RolloutConfig.from_config(cfg), max_context_tokens=10**6, max_sim_prompt_tokens=10**6
    )
    rows, _ = build_sft_rows(splits.train, splits.gold, bootstrap, roomy, 0.5, cfg.seed)
    tok = bootstrap.tokenizer
    return [tok.decode(r.prompt_ids + r.response_ids) for r in rows]


def init_model(cfg: Config, splits: TaskSplits, out_dir: Path) -> tuple[Any, Any]:
    """The configured checkpoint (`model.path`), else the `model.preset` model, saved to
    `out_dir`: SmolLM2 from its cached conversion, or a tiny model with a tokenizer trained here."""
    from envace.policy.hf_backend import load_model_and_tokenizer
    from envace.policy.tiny import (
        build_tiny_model,
        build_tokenizer,
        corpus_min_frequency,
        save_checkpoint,
    )

    if cfg.model.path is not None:
        return load_model_and_tokenizer(cfg.model.path, cfg.model.dtype)
    if cfg.model.preset == "smollm2-135m":
        from envace.policy.pretrained import describe, ensure_smollm2

        model, tokenizer = load_model_and_tokenizer(ensure_smollm2(), cfg.model.dtype)
        log.info("model: SmolLM2-135M-Instruct (%s)", describe(model))
        save_checkpoint(model, tokenizer, out_dir)
        return model, tokenizer
    corpus = tokenizer_corpus(cfg, splits)
    tokenizer = build_tokenizer(corpus, cfg.model.vocab_size, corpus_min_frequency(len(corpus)))
    # model.dtype applies to every model source (a resumed run reloads in it)
    model = build_tiny_model(tokenizer, cfg.model.preset, seed=cfg.seed)
    model = model.to(resolve_dtype(cfg.model.dtype))
    save_checkpoint(model, tokenizer, out_dir)
    return model, tokenizer


def model_policy(model: Any, tokenizer: Any, cfg: Config, trainable: bool = True) -> ModelPolicy:
    backend = TransformersBackend(
        model,
        tokenizer,
        max_batch_size=cfg.rollout.max_batch_size,
        decode=cfg.rollout.decode,
        prefix_cache=cfg.rollout.prefix_cache,
        compile_decode=cfg.rollout.compile_decode,
    )
    return ModelPolicy(backend, ChatRenderer(tokenizer, cfg.model.enable_thinking), trainable)


def rollout_policy(
    cfg: Config, model: Any, tokenizer: Any, checkpoint_dir: Path | None
) -> ModelPolicy:
    """The trainable policy that rolls out: transformers over `model` itself, or
    (`rollout.backend: vllm`) a vLLM engine loaded from `checkpoint_dir` (close it when done)."""
    if cfg.rollout.backend == "transformers":
        return model_policy(model, tokenizer, cfg)
    from envace.policy.vllm_backend import VLLMBackend, VLLMOptions

    if checkpoint_dir is None:
        raise ConfigError("rollout.backend: vllm needs a checkpoint folder to start from")
    backend = VLLMBackend(checkpoint_dir, VLLMOptions.from_mapping(cfg.rollout.vllm))
    return ModelPolicy(backend, ChatRenderer(tokenizer, cfg.model.enable_thinking), True)


def push_weights(policy: ModelPolicy, engine: TrainingEngine) -> float:
    """After an update: a backend with its own copy of the weights (vLLM) loads the trained
    ones in place (a transformers policy already generates with them); the seconds it took."""
    if policy.backend.shares_trainer_weights:
        return 0.0
    t0 = time.perf_counter()
    state = engine.full_state_dict()
    if state is not None:
        policy.backend.load_weights(state.items())
    return time.perf_counter() - t0


def evaluate_model(
    model: Any, tokenizer: Any, cfg: Config, tasks: Sequence[Task], desc: str
) -> EvalResult:
    subset = list(tasks[: cfg.eval.max_tasks] if cfg.eval.max_tasks else tasks)
    torch.manual_seed(cfg.seed)
    log.info("evaluating %s on %d held-out tasks", desc, len(subset))
    return evaluate_policy(
        model_policy(model, tokenizer, cfg, trainable=False),
        subset,
        RolloutConfig.from_config(cfg, eval_mode=True),
        probe_fidelity=cfg.eval.probe_fidelity,
        n=cfg.eval.n,
        progress=True,
    )


# --- stages -----------------------------------------------------------------------------------
def warm_start_rows(
    cfg: Config, renderer: ChatRenderer, splits: TaskSplits
) -> tuple[list[TrainRow], int]:
    """The warm start's rows (caller turns packed) of at most `warm_start.max_tokens` tokens,
    and the number of gold conversations that did not replay; a clear error when none is left."""
    w = cfg.warm_start
    rows, broken = build_sft_rows(
        splits.train,
        splits.gold,
        renderer,
        RolloutConfig.from_config(cfg),
        w.grounding_dropout,
        cfg.seed,
    )
    kept = [r for r in rows if r.length <= w.max_tokens]
    if not kept:
        raise UserInputError(
            f"no warm-start rows: {len(splits.gold)} gold conversation(s) for"
            f" {len(splits.train)} train task(s) gave {len(rows)} row(s) ({broken} gold"
            f" conversation(s) skipped as broken), {len(rows) - len(kept)} longer than"
            f" warm_start.max_tokens={w.max_tokens}. A gold conversation does not replay when a"
            " reply is longer than rollout.caller_max_new_tokens /"
            " rollout.simulator_max_new_tokens or the conversation outgrows"
            " rollout.max_context_tokens; check that tasks.gold_file matches the train tasks'"
            " ids, raise those limits, or set warm_start.enabled=false"
        )
    return kept, broken


def warm_start(cfg: Config, model: Any, tokenizer: Any, splits: TaskSplits) -> dict[str, Any]:
    renderer = ChatRenderer(tokenizer, cfg.model.enable_thinking)
    w = cfg.warm_start
    rows, broken = warm_start_rows(cfg, renderer, splits)
    steps = sft_steps(len(rows), w.epochs, w.batch_rows)
    if steps == 0:  # warm_start.epochs: 0 trains nothing
        return {"rows": len(rows), "steps": 0, "final_loss": None, "skipped_gold": broken}
    engine = TorchEngine(
        model,
        w.lr,
        cfg.train.weight_decay,
        cfg.train.grad_clip,
        "cosine",
        min(20, steps // 10),
        steps,
        trainable=Trainable.from_config(cfg),
    )
    stats = run_sft(
        engine,
        rows,
        epochs=w.epochs,
        batch_rows=w.batch_rows,
        pad_id=renderer.pad_id,
        seed=cfg.seed,
        micro_batch_tokens=w.micro_batch_tokens,
    )
    return {
        "rows": stats.rows,
        "steps": stats.steps,
        "final_loss": stats.final_loss,
        "skipped_gold": broken,
    }


def tool_results(
    cfg: Config, tokenizer: Any, sim_model: Any | None, rl_start: Callable[[], Any]
) -> ToolResults:
    """The run's tool-result source, the one place `rollout.mode` is read for it.

    real: the task worlds (`make_task_environment`). external: an endpoint, another
    checkpoint, or (neither given) a frozen copy of the policy as RL starts (`rl_start()`,
    called now). rehearsal: the policy, or with noshare `sim_model`, the simulator's own
    trained model (`envace.train.learners.trains_simulator`)."""
    r = cfg.rollout
    if r.mode == "real":
        return ToolResults("real", make_env=make_task_environment)
    if r.mode == "external":
        if r.external_endpoint:
            from envace.policy.openai_http import OpenAIChatClient
            from envace.rollout.policies import ChatPolicy

            client = OpenAIChatClient(r.external_endpoint, r.external_endpoint_model)
            return ToolResults("external", ChatPolicy(client))
        if r.external_model:
            from envace.policy.hf_backend import load_model_and_tokenizer

            m, t = load_model_and_tokenizer(r.external_model)
            return ToolResults("external", model_policy(m, t, cfg, trainable=False))
        frozen = model_policy(rl_start().eval(), tokenizer, cfg, trainable=False)
        return ToolResults("external", frozen)
    if sim_model is not None:
        return ToolResults("rehearsal", model_policy(sim_model, tokenizer, cfg, trainable=True))
    return ToolResults("rehearsal")


def _rl_start_model(cfg: Config, paths: RunPaths, model: Any, resume_from: Path | None) -> Any:
    """The policy as RL started (an external simulator's frozen copy): `model` itself, copied,
    on a fresh start (no update yet); on resume the checkpoint RL started from, as the
    pipeline's stages read it from `rl_start`: the warm start's, else the initial one."""
    if resume_from is None:
        return copy.deepcopy(model)
    from envace.policy.hf_backend import load_model_and_tokenizer

    if not cfg.warm_start.enabled and cfg.model.path is not None:
        return load_model_and_tokenizer(cfg.model.path, cfg.model.dtype)[0]
    start = paths.checkpoints / ("warm_start" if cfg.warm_start.enabled else "init")
    if not (start / "MANIFEST.json").is_file():  # a new pod: from the store
        from envace.storage.artifacts import fetch_dir

        fetch_dir(paths.store_uri(start), start)
    return load_model_and_tokenizer(start, cfg.model.dtype)[0]


def _save_rl_checkpoint(
    paths: RunPaths, it: int, learners: Sequence[Learner], tokenizer: Any
) -> str:
    from envace.storage.checkpoints import checkpoint_name

    ckpt = paths.checkpoints / "rl" / checkpoint_name(it)
    for lr in learners:
        require_finite_weights(
            lr.model, f"the weights to save as checkpoints/rl/{ckpt.name}/{lr.name}"
        )
    for lr in learners:
        lr.engine.save_model(ckpt / lr.name, tokenizer)
    if not paths.writes:  # rank 0 writes the trainer state and commits
        return paths.store_uri(ckpt)
    torch.save(trainer_state(it, learners), ckpt / TRAINER_STATE)
    import shutil

    for name in ("metrics.jsonl", "stages.json", "config.json"):  # a resume elsewhere keeps them
        if (paths.out / name).exists():
            shutil.copyfile(paths.out / name, ckpt / name)
    _copy_tensorboard(paths.out, ckpt)
    return paths.commit(ckpt)


def _copy_tensorboard(src: Path, dest: Path) -> None:
    """src/tensorboard (the event files so far, flushed after every iteration) into dest."""
    import shutil

    if (src / "tensorboard").is_dir():
        shutil.copytree(src / "tensorboard", dest / "tensorboard", dirs_exist_ok=True)


def _resume_point(paths: RunPaths, info: DistInfo) -> Path | None:
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


def _restore_history(paths: RunPaths, ckpt: Path) -> None:
    """On resume: the run's tasks and metric history, from the store when not here."""
    import shutil

    from envace.storage.artifacts import fetch_dir

    if not (paths.tasks / "train.jsonl").exists():
        fetch_dir(paths.store_uri(paths.tasks), paths.tasks)
    for name in ("metrics.jsonl", "stages.json"):
        if not (paths.out / name).exists() and (ckpt / name).exists():
            shutil.copyfile(ckpt / name, paths.out / name)
    if not (paths.out / "tensorboard").exists():  # a new pod: the events up to the checkpoint
        _copy_tensorboard(ckpt, paths.out)


@dataclass
class RunContext:
    """One run's inputs, read once and passed down: the config, the run's folders and store
    (`paths`), the tasks, the model RL starts from (on resume the checkpoint's, loaded in
    `model.dtype`) and its tokenizer, the checkpoint resumed from, the stage figures so far."""

    cfg: Config
    paths: RunPaths
    splits: TaskSplits
    model: Any
    tokenizer: Any
    resume_from: Path | None = None
    stages: dict[str, Any] = field(default_factory=dict)


@dataclass
class _RLSetup:
    """What `rl_stage` builds for the loop."""

    learners: list[Learner]
    policy: ModelPolicy  # the caller (and, sharing, the simulator)
    sources: ToolResults
    start: int  # iterations already done (a resume)


def rl_stage(
    ctx: RunContext,
    logger: MetricsLogger | NullLogger,
    eval_hook: Callable[[Any], float] | None = None,
) -> tuple[Any, list[dict[str, Any]], TrainingEngine]:
    """RL iterations on `ctx.model`; returns the trained policy model, the per-iteration
    records and the policy's engine. `eval_hook` runs on rank 0 (weights gathered on every
    rank). On resume the simulator, when it has its own model, loads from the same checkpoint."""
    cfg, paths, model, resume_from = ctx.cfg, ctx.paths, ctx.model, ctx.resume_from
    start = 0
    saved_sim = None
    if resume_from is not None and trains_simulator(cfg):
        from envace.policy.hf_backend import load_model_and_tokenizer

        saved_sim, _ = load_model_and_tokenizer(resume_from / "simulator", cfg.model.dtype)
    learners = build_learners(cfg, model, saved_sim, cfg.train.iterations)
    sim = next((lr.model for lr in learners if lr.name == "simulator"), None)
    sources = tool_results(
        cfg, ctx.tokenizer, sim, lambda: _rl_start_model(cfg, paths, model, resume_from)
    )
    vllm_dir = None
    if cfg.rollout.backend == "vllm":
        if dist_info().distributed:
            raise ConfigError(
                "rollout.backend: vllm runs with one training process (each rank would need "
                "its own engine and the gathered weights); use rollout.backend: transformers "
                "for multi-process runs"
            )
        vllm_dir = paths.checkpoints / "rollout_start"  # the engine's first weights
        TorchEngine(model, 1.0).save_model(vllm_dir, ctx.tokenizer)
    if resume_from is not None:
        state = load_trainer_state(resume_from / TRAINER_STATE)
        start = restore_learners(learners, state, resume_from, str(resume_from))
        logger.truncate_after(start)
        log.info("resumed RL from %s at iteration %d", resume_from, start)
    policy = rollout_policy(cfg, model, ctx.tokenizer, vllm_dir)
    try:
        return _rl_loop(ctx, _RLSetup(learners, policy, sources, start), logger, eval_hook)
    finally:
        policy.close()


def _rl_loop(
    ctx: RunContext,
    setup: _RLSetup,
    logger: MetricsLogger | NullLogger,
    eval_hook: Callable[[Any], float] | None,
) -> tuple[Any, list[dict[str, Any]], TrainingEngine]:
    cfg, learners, policy = ctx.cfg, setup.learners, setup.policy
    info = dist_info()
    trainer = RLTrainer(
        cfg,
        ctx.splits.train,
        policy,
        role_learners(learners, ChatRenderer(ctx.tokenizer).pad_id),
        TaskGrader(),
        setup.sources,
    )
    records: list[dict[str, Any]] = []
    from tqdm import tqdm

    t = cfg.train
    bar = tqdm(
        range(setup.start, t.iterations),
        desc="RL",
        unit="it",
        initial=setup.start,
        total=t.iterations,
        disable=not info.is_main,
    )
    for it in bar:
        rec = trainer.iteration(it)
        rec["time/weight_sync_s"] = push_weights(policy, learners[0].engine)
        if eval_hook is not None and t.eval_every and (it + 1) % t.eval_every == 0:
            with trainer.generation_ready():
                if info.is_main:
                    rec["eval/success_rate"] = eval_hook(ctx.model)
            _wait_for_all(cfg, "evaluation during RL")
        logger.log(rec)
        records.append(rec)
        bar.set_postfix(
            reward=f"{rec['reward/mean']:.2f}", success=f"{rec['reward/success_rate']:.2f}"
        )
        if (it + 1) % t.save_every == 0 or it + 1 == t.iterations:
            _save_rl_checkpoint(ctx.paths, it + 1, learners, ctx.tokenizer)
    return ctx.model, records, learners[0].engine


# --- the main job -----------------------------------------------------------------------------
def _stage_metrics(result: EvalResult) -> dict[str, Any]:
    m = result.metrics
    return {
        "success_rate": m.success_rate,
        "valid_call_rate": m.valid_call_rate,
        "rehearsal_fidelity": m.rehearsal_fidelity,
        "per_turn_score": m.per_turn_score,
        "rehearsal_field_fidelity": m.rehearsal_field_fidelity,
        "error_flag_recall": m.error_flag_recall,
        "n_tasks": m.n_tasks,
    }


def require_data_parallel(cfg: Config, where: str) -> None:
    """Several processes need the DeepSpeed engine: the torch engine trains one."""
    if cfg.train.engine != "deepspeed":
        raise ConfigError(
            f"{where} needs train.engine: deepspeed ({cfg.train.engine!r} trains one process); "
            "set train.engine: deepspeed, or start one process"
        )


def _join_job(cfg: Config) -> DistInfo:
    """This process's place in a torchrun job; joins the process group when there are ranks."""
    info = dist_info()
    if not info.distributed:
        return info
    require_data_parallel(cfg, f"WORLD_SIZE={info.world_size}")
    return init_process_group(timeout_s=cfg.train.deepspeed.collective_timeout_s)


def leave_job(cfg: Config) -> None:
    """A finished job leaves its process group cleanly (every rank, after the last one)."""
    shutdown(cfg.train.deepspeed.collective_timeout_s)


def _wait_for_all(cfg: Config, what: str) -> None:
    barrier(what, cfg.train.deepspeed.collective_timeout_s)


def _broadcast_weights(model: Any) -> None:
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


def _initial_model(
    cfg: Config, paths: RunPaths, splits: TaskSplits, info: DistInfo
) -> tuple[Any, Any]:
    """The configured or preset model; a node's first process builds and saves the preset one."""
    from envace.policy.hf_backend import load_model_and_tokenizer

    init_dir = paths.checkpoints / "init"
    builds = cfg.model.path is not None or info.local_rank == 0
    if builds:
        model, tokenizer = init_model(cfg, splits, init_dir)
    _wait_for_all(cfg, "initial checkpoint")
    if not builds:
        model, tokenizer = load_model_and_tokenizer(init_dir, cfg.model.dtype)
    if init_dir.is_dir():
        paths.commit(init_dir)
    return model, tokenizer


def _start(
    cfg: Config, out: Path, store: str | None, resume: bool, info: DistInfo, overwrite: bool
) -> RunContext:
    """Tasks, resume point and the starting model, on every rank.

    Nothing is written before the resume point is known and the folder may be used (the inputs
    were checked by `run_main`): a refused folder leaves `out` as it was.
    """
    from envace.train import preflight

    if info.is_main and not resume:
        found = preflight.previous_run(out, store)
        if found is not None:
            if not overwrite:
                preflight.refuse_previous_run(found, out)
            preflight.clear_previous_run(out, store)
    _wait_for_all(cfg, "pre-flight checks")
    preflight.make_out_dir(out)  # rank 0 made it under the run lock; the other ranks here
    paths = RunPaths(out, store or str(out), writes=info.is_main)
    stages_path = out / "stages.json"
    first_on_node = info.local_rank == 0
    resume_from = _resume_point(paths, info) if resume else None
    if resume and resume_from is None and info.is_main:
        log.warning(
            "--resume: no complete checkpoint under %s/checkpoints/rl; starting a fresh run",
            paths.store,
        )
    if resume_from is not None:
        saved = resume_from / "config.json"
        preflight.check_resume_config(cfg, saved if saved.exists() else out / "config.json")
    if info.is_main:
        atomic_write_text(out / "config.json", json.dumps(cfg.to_dict(), indent=2) + "\n")
    if resume_from is not None and first_on_node:
        _restore_history(paths, resume_from)
    if resume_from is None and first_on_node:
        prepare_tasks(cfg, paths)
    if resume_from is None and info.is_main:  # a fresh run starts a fresh metric history
        (out / "metrics.jsonl").unlink(missing_ok=True)
    _wait_for_all(cfg, "tasks and resume point")
    splits = load_splits(paths.tasks)
    if resume_from is None:
        model, tokenizer = _initial_model(cfg, paths, splits, info)
        return RunContext(cfg, paths, splits, model, tokenizer)
    from envace.policy.hf_backend import load_model_and_tokenizer

    stages = json.loads(stages_path.read_text()) if stages_path.exists() else {}
    model, tokenizer = load_model_and_tokenizer(resume_from / "policy", cfg.model.dtype)
    return RunContext(cfg, paths, splits, model, tokenizer, resume_from, stages)


def run_main(
    cfg: Config,
    out: Path,
    store: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run the whole method; returns the summary written to OUT/summary.json (on rank 0; the
    other ranks of a multi-process run return `{"rank": r}`).

    A folder that already holds a run needs `resume` (continue it) or `overwrite` (replace it);
    a folder another run is using is refused (rank 0 holds `OUT/.envace.lock` while it runs).
    """
    from envace.train import preflight

    t0 = time.perf_counter()
    info = _join_job(cfg)
    preflight.check_inputs(cfg, out, store)
    with preflight.run_lock(out, enabled=info.is_main):
        return _run_locked(cfg, out, store, resume, overwrite, info, t0)


def _run_locked(
    cfg: Config,
    out: Path,
    store: str | None,
    resume: bool,
    overwrite: bool,
    info: DistInfo,
    t0: float,
) -> dict[str, Any]:
    main = info.is_main
    st = _start(cfg, out, store, resume, info, overwrite)
    paths, stages, splits, tokenizer = st.paths, st.stages, st.splits, st.tokenizer

    def record(name: str, model: Any, label: str) -> None:
        stages[name] = _stage_metrics(evaluate_model(model, tokenizer, cfg, splits.test, label))
        atomic_write_text(out / "stages.json", json.dumps(stages, indent=2) + "\n")

    def eval_hook(m: Any) -> float:
        return (
            evaluate_model(m, tokenizer, cfg, splits.test, "during RL").metrics.success_rate or 0.0
        )

    # Opened before the first evaluation: a tracker that cannot start (a wrong MLflow URI or
    # credential) stops the run in seconds, not after the warm start.
    logger: MetricsLogger | NullLogger = _metrics_logger(cfg, paths) if main else NullLogger()
    try:
        if "untrained" not in stages and main:
            record("untrained", st.model, "untrained")
        if st.resume_from is None and cfg.warm_start.enabled:
            stages["warm_start_training"] = warm_start(cfg, st.model, tokenizer, splits)
            if info.distributed:
                _broadcast_weights(st.model)
            if main:
                ws_dir = paths.checkpoints / "warm_start"
                require_finite_weights(st.model, "the weights to save as checkpoints/warm_start")
                TorchEngine(st.model, 1.0).save_model(ws_dir, tokenizer)
                paths.commit(ws_dir)
                record("warm_start", st.model, "warm start")
        _wait_for_all(cfg, "evaluations before RL")
        model, records, engine = rl_stage(st, logger, eval_hook)
    except BaseException:
        logger.close(failed=True)  # MLflow: FAILED; a resume sets it RUNNING again
        raise
    logger.close()
    if cfg.train.iterations > 0:
        with generation_ready([engine]):
            if main:
                record("rl", model, "after RL")
        _wait_for_all(cfg, "evaluation after RL")
    final = paths.checkpoints / "final"
    require_finite_weights(model, "the weights to save as checkpoints/final")
    engine.save_weights(final, tokenizer)  # collective under ZeRO-3 (gathers the shards)
    if not main:
        return {"rank": info.rank}
    paths.commit(final)
    return _finish(paths, stages, records, st.resume_from, time.perf_counter() - t0, info)


def _metrics_logger(cfg: Config, paths: RunPaths) -> MetricsLogger:
    """metrics.jsonl and the trackers the config asks for, keyed by this run (`TrackedRun`):
    its store URI and the commit time of its tasks, which a fresh start (also --overwrite)
    renews and a resume keeps, so a restarted or resumed run continues its MLflow / W&B run."""
    from envace.storage.artifacts import read_manifest
    from envace.storage.uri import parse_uri

    started = read_manifest(paths.store_uri(paths.tasks)).created
    run = TrackedRun(str(parse_uri(paths.store)), started)
    return MetricsLogger.from_config(paths.out, cfg, run)


def _finish(
    paths: RunPaths,
    stages: dict[str, Any],
    records: list[dict[str, Any]],
    resume_from: Path | None,
    wall_s: float,
    info: DistInfo,
) -> dict[str, Any]:
    """Plot, summary.json and the committed report (rank 0)."""
    out = paths.out
    all_records = (
        [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
        if (out / "metrics.jsonl").exists()
        else records
    )
    evals = {
        k: v["success_rate"]
        for k, v in stages.items()
        if k in STAGE_NAMES and v.get("success_rate") is not None
    }
    plot = plot_progress(all_records, evals, out / "progress.png")
    summary: dict[str, Any] = {
        "stages": {k: v for k, v in stages.items() if k in STAGE_NAMES},
        "warm_start_training": stages.get("warm_start_training"),
        "wall_seconds": wall_s,
        "resumed_from": str(resume_from) if resume_from else None,
        "ranks": info.world_size,
        "artifacts": {
            "metrics": str(out / "metrics.jsonl"),
            "summary": str(out / "summary.json"),
            "plot": str(plot),
            "tensorboard": str(out / "tensorboard"),
            "final_checkpoint": paths.store_uri(paths.checkpoints / "final"),
            "store": paths.store,
        },
    }
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    summary["artifacts"]["report"] = _commit_report(paths)
    _print_summary(summary)
    return summary


def _commit_report(paths: RunPaths) -> str:
    """summary, metrics, plot, config and TensorBoard events as one committed artifact
    (`report/`)."""
    import shutil

    report = paths.out / "report"
    report.mkdir(exist_ok=True)
    for name in ("summary.json", "metrics.jsonl", "stages.json", "config.json", "progress.png"):
        if (paths.out / name).exists():
            shutil.copyfile(paths.out / name, report / name)
    _copy_tensorboard(paths.out, report)
    return paths.commit(report)


def _print_summary(summary: dict[str, Any]) -> None:
    rows = [
        (name, s.get("success_rate"), s.get("valid_call_rate"), s.get("rehearsal_fidelity"))
        for name, s in summary["stages"].items()
    ]
    print()
    print(text_table(["stage", "success_rate", "valid_call_rate", "rehearsal_fidelity"], rows))
    print(f"\nwall time: {summary['wall_seconds']:.0f} s")
    for k, v in summary["artifacts"].items():
        print(f"{k:>17}: {v}")
