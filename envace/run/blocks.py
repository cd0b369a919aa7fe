"""The building blocks both orchestrators compose (`envace run` in `envace.run.main`, the
pipeline's steps in `envace.stages`): the initial model, policies over a model, evaluation, the
warm start and the tool-result source."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from envace.config import Config
from envace.errors import ConfigError, UserInputError
from envace.evaluate.runner import EvalResult, evaluate_policy, make_task_environment
from envace.policy.chat import ChatRenderer
from envace.policy.hf_backend import TransformersBackend, place_model, resolve_dtype
from envace.rollout.engine import RolloutConfig
from envace.rollout.policies import ModelPolicy
from envace.rollout.sources import ToolResults
from envace.run.layout import TaskSplits
from envace.tasks.model import Task
from envace.train.adapters import Trainable
from envace.train.batch import TrainRow
from envace.train.engine import TorchEngine, TrainingEngine
from envace.train.sft import build_sft_rows, run_sft, sft_steps

log = logging.getLogger(__name__)


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
        return load_model_and_tokenizer(cfg.model.path, cfg.model.dtype, device=cfg.model.device)
    if cfg.model.preset == "smollm2-135m":
        from envace.policy.pretrained import describe, ensure_smollm2

        model, tokenizer = load_model_and_tokenizer(
            ensure_smollm2(), cfg.model.dtype, device=cfg.model.device
        )
        log.info("model: SmolLM2-135M-Instruct (%s)", describe(model))
        save_checkpoint(model, tokenizer, out_dir)
        return model, tokenizer
    corpus = tokenizer_corpus(cfg, splits)
    tokenizer = build_tokenizer(corpus, cfg.model.vocab_size, corpus_min_frequency(len(corpus)))
    # model.dtype applies to every model source (a resumed run reloads in it)
    model = build_tiny_model(tokenizer, cfg.model.preset, seed=cfg.seed)
    model = place_model(model.to(resolve_dtype(cfg.model.dtype)), cfg.model.device)
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
        master_weights=cfg.train.master_weights,
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

            m, t = load_model_and_tokenizer(r.external_model, device=cfg.model.device)
            return ToolResults("external", model_policy(m, t, cfg, trainable=False))
        frozen = model_policy(rl_start().eval(), tokenizer, cfg, trainable=False)
        return ToolResults("external", frozen)
    if sim_model is not None:
        return ToolResults("rehearsal", model_policy(sim_model, tokenizer, cfg, trainable=True))
    return ToolResults("rehearsal")
