"""Generation with a Hugging Face transformers model: the default backend (CPU and tests).

Prompts are token ids; outputs are the sampled ids with their log-probabilities under the
sampling distribution (after temperature / top-k / top-p), cut after the first end-of-turn id.
Prompts are sorted by length and left-padded in micro-batches, so padding waste stays small.

Two decoders: `static` (default where the model allows it) runs our own loop over a static KV
cache, its one-token step replayed as a CUDA graph on GPU (envace/policy/static_decode.py);
`generate` calls transformers' `model.generate`. With `generate`, the log-probabilities are
taken step by step by the last logits processor (`_LogprobRecorder`, after our own
temperature / top-k / top-p warpers), so only one (batch x vocabulary) row of scores exists at
a time: `output_scores` would keep all of them (20 GB at batch 256 x 128 new
tokens with a 151,936-token vocabulary).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch

from envace.errors import UserInputError
from envace.policy.static_decode import StaticDecoder, static_decode_supported
from envace.policy.types import Generation, GenerationBackend, SamplingParams, check_prompts

__all__ = [
    "BF16_MIN_SPEEDUP",
    "DecodeMode",
    "TransformersBackend",
    "auto_dtype",
    "bf16_native",
    "cpu_bf16_speedup",
    "load_model_and_tokenizer",
    "place_model",
    "resolve_decode",
    "resolve_device",
    "resolve_dtype",
]

DecodeMode = Literal["auto", "generate", "static"]

log = logging.getLogger(__name__)


_CHECKPOINT_FORMS = (
    "a Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer files) or a hub id "
    "(name or namespace/name)"
)
_DEFAULT_HINT = f"use {_CHECKPOINT_FORMS} (model.path in a run config)"


def bf16_native() -> bool:
    """Whether this machine computes bfloat16 natively: a CUDA GPU with bf16, or a CPU with
    AVX512-BF16 / AMX (oneDNN's own check)."""
    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


# `auto` on a CPU takes bfloat16 only when its matmuls are this much faster than float32's: a
# CPU with AVX512-BF16 but no AMX may convert and run no faster (seen on one of our hosts).
BF16_MIN_SPEEDUP = 1.2


def _matmul_seconds(dtype: torch.dtype, size: int = 768, repeats: int = 6) -> float:
    """Best wall time of one `size` x `size` matmul in `dtype` (the first run warms up)."""
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return best


@functools.cache
def cpu_bf16_speedup() -> float:
    """float32 over bfloat16 matmul time on this CPU (measured once per process, ~0.1 s)."""
    return _matmul_seconds(torch.float32) / max(_matmul_seconds(torch.bfloat16), 1e-9)


def auto_dtype() -> tuple[torch.dtype, str]:
    """What `model.dtype: auto` means here, and why: bfloat16 on a GPU that has it; on a CPU,
    bfloat16 when oneDNN supports it and it measures at least BF16_MIN_SPEEDUP x faster."""
    if not bf16_native():
        return torch.float32, "no native bf16 on this machine"
    if torch.cuda.is_available():
        return torch.bfloat16, "bf16 is native on this GPU"
    speedup = cpu_bf16_speedup()
    if speedup < BF16_MIN_SPEEDUP:
        return torch.float32, (
            f"bf16 matmuls measure only {speedup:.2f}x fp32's here (needs {BF16_MIN_SPEEDUP}x)"
        )
    return torch.bfloat16, f"bf16 matmuls measure {speedup:.2f}x fp32's here"


def resolve_dtype(name: str) -> torch.dtype:
    """`model.dtype` as a torch dtype; `auto` is bfloat16 where native, else float32."""
    if name == "auto":
        chosen, why = auto_dtype()
        log.info("model.dtype auto: %s (%s)", str(chosen).removeprefix("torch."), why)
        return chosen
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise UserInputError(f"model.dtype: {name!r} is not auto, float32, bfloat16 or float16")
    return dtypes[name]


def resolve_device(name: str = "auto") -> torch.device:
    """`model.device` as a torch device. auto: this process's GPU when CUDA is available
    (cuda:$LOCAL_RANK under torchrun, else the current one), else the CPU."""
    if name == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        rank = os.environ.get("LOCAL_RANK")
        return torch.device("cuda", int(rank) if rank else torch.cuda.current_device())
    if name == "cpu":
        return torch.device("cpu")
    if not name.startswith("cuda"):
        raise UserInputError(f"model.device: {name!r} is not auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UserInputError(
            f"model.device: {name!r} but CUDA is not available in this process (torch "
            f"{torch.__version__}); use model.device: auto or cpu, or a CUDA build of torch"
        )
    device = torch.device(name)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise UserInputError(
            f"model.device: {name!r} but this process sees {torch.cuda.device_count()} GPU(s);"
            f" use cuda:0..cuda:{torch.cuda.device_count() - 1} or auto"
        )
    return device


def place_model(model: Any, device: str = "auto") -> Any:
    """`model` moved to `model.device` (said in the log when that is a GPU)."""
    target = resolve_device(device)
    if target.type != "cpu":
        log.info("model.device %s: %s", device, target)
    return model.to(target)


def load_model_and_tokenizer(
    path: str | Path, dtype: str = "float32", *, device: str = "auto", hint: str | None = None
) -> tuple[Any, Any]:
    """Load a Hugging Face checkpoint (a local directory or a hub id) for generation/training,
    in `dtype` on `device` (`model.dtype`, `model.device`).

    A bad checkpoint is user input (`envace evaluate --policy`, `model.path` of `envace run`), so
    every way it can fail raises `UserInputError` naming the path, the reason and the fix instead
    of a transformers/safetensors traceback. `hint` (how to fix it: what the caller's option
    accepts) ends those messages; by default it names the checkpoint forms and `model.path`.
    """
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envace.policy.pretrained import ensure_gguf_checkpoint, is_gguf_path

    hint = hint or _DEFAULT_HINT
    if is_gguf_path(path):  # converted once into a cached, manifest-checked checkpoint
        path = ensure_gguf_checkpoint(Path(path).expanduser())
    source = _checked_checkpoint(str(path), hint)
    torch_dtype = resolve_dtype(dtype)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype)
    except (OSError, ValueError, SafetensorError) as exc:  # JSONDecodeError is a ValueError
        raise UserInputError(
            f"cannot load the checkpoint {path}: {_one_line(exc)}; re-download or re-commit the "
            f"checkpoint, or {hint}"
        ) from exc
    return place_model(model, device), tokenizer


def _looks_like_path(spec: str) -> bool:
    """A hub id is `name` or `namespace/name`; anything else with a separator is a path."""
    return spec.startswith(("/", ".", "~")) or "\\" in spec or spec.count("/") > 1


def _checked_checkpoint(spec: str, hint: str) -> str:
    """What to hand to `from_pretrained`: a checked local folder, or `spec` as a hub id.

    A committed folder (MANIFEST.json) is verified first, so a truncated file is named with its
    size instead of surfacing as a safetensors header error.
    """
    local = Path(spec).expanduser()
    if not local.exists():
        if _looks_like_path(spec):
            raise UserInputError(f"no such checkpoint directory: {spec}; {hint}")
        return spec
    if not (local / "config.json").is_file():
        raise UserInputError(
            f"{spec} is not a Hugging Face checkpoint (no config.json; `envace run` writes them "
            f"under …/checkpoints/…); {hint}"
        )
    if (local / "MANIFEST.json").is_file():
        from envace.storage.artifacts import verify

        verify(str(local))
    return str(local)


def _one_line(exc: BaseException) -> str:
    """The first line of an error, capped: transformers' messages run to paragraphs."""
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), type(exc).__name__)
    return text if len(text) <= 200 else text[:197] + "..."


def resolve_decode(mode: str, model: Any) -> str:
    """`generate` (transformers' `model.generate`) or `static` (our static-cache loop, the step
    a CUDA graph on CUDA; envace/policy/static_decode.py). `auto`: static where the model
    supports it (full-attention layers only), else generate. On the CPU the
    two sample the same tokens (static a little faster: docs/benchmarks.md)."""
    if mode not in ("auto", "generate", "static"):
        raise ValueError(f"decode mode {mode!r}: use auto, generate or static")
    why = static_decode_supported(model)
    if mode == "static" and why is not None:
        raise ValueError(f"decode: static is not available: {why}; use decode: generate")
    if mode == "auto":
        return "static" if why is None else "generate"
    return mode


class _LogprobRecorder:
    """Last logits processor: log-softmax of the final (warped) scores of each step, gathered at
    the token sampled from them (seen as the last input id of the next step, or in `finish`)."""

    def __init__(self) -> None:
        self.prev: torch.Tensor | None = None
        self.taken: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.taken.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self.prev = scores.float().log_softmax(dim=-1)
        return scores

    def finish(self, new_ids: torch.Tensor) -> torch.Tensor:
        """(B, T_new) log-probs of the sampled tokens `new_ids`."""
        if self.prev is not None and len(self.taken) < new_ids.shape[1]:
            self.taken.append(self.prev.gather(-1, new_ids[:, -1:]).squeeze(-1))
        self.prev = None
        if not self.taken:
            return new_ids.new_zeros(new_ids.shape, dtype=torch.float32)
        return torch.stack(self.taken, dim=1)


def _processors(params: SamplingParams, recorder: Any = None) -> Any:
    """Temperature, top-k, top-p in transformers' order, then the recorder if any. Ours, so
    that the recorder runs last (transformers appends its own warpers after custom processors).
    Greedy (temperature <= 0) keeps the raw scores."""
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    out: list[Any] = []
    if params.temperature > 0:
        if params.temperature != 1.0:
            out.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k > 0:
            out.append(TopKLogitsWarper(top_k=params.top_k))
        if params.top_p < 1.0:
            out.append(TopPLogitsWarper(top_p=params.top_p))
    return LogitsProcessorList([*out, recorder] if recorder is not None else out)


class TransformersBackend(GenerationBackend):
    """`GenerationBackend` over a causal LM already in memory (shared with the trainer)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_batch_size: int = 64,
        decode: DecodeMode = "auto",
        prefix_cache: bool = True,
        compile_decode: bool = False,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_id: int = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        pad = tokenizer.pad_token_id
        self.pad_id: int = int(pad) if pad is not None else self.eos_id
        self.max_batch_size = max_batch_size
        self.generated_tokens = 0  # running counter for throughput metrics
        self.decode = resolve_decode(decode, model)
        self.static: StaticDecoder | None = None
        if self.decode == "static":
            self.static = StaticDecoder(
                model,
                self.eos_id,
                self.pad_id,
                prefix_cache=prefix_cache,
                compile_step=compile_decode,
            )
        elif compile_decode:
            raise ValueError(
                "compile_decode compiles the static decoder's step, and this backend decodes "
                "with model.generate: set rollout.decode: static (or auto on a full-attention "
                "model), or rollout.compile_decode: false"
            )

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        if not check_prompts(prompts):
            return []
        if params.seed is not None:
            torch.manual_seed(params.seed)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[Generation | None] = [None] * len(prompts)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            gens = self._generate_batch([prompts[i] for i in chunk], params)
            for i, gen in zip(chunk, gens, strict=True):
                out[i] = gen
        return [g for g in out if g is not None]

    def release(self) -> None:
        """Free what decoding keeps between calls (the static decoder's caches and graphs)."""
        if self.static is not None:
            self.static.release()

    def _generate_batch(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        if self.static is not None:
            return self._generate_static(prompts, params)
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding: generation continues at the right edge
            ids[row, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[row, width - len(p) :] = 1
        ids, mask = ids.to(self.model.device), mask.to(self.model.device)
        greedy = params.temperature <= 0
        recorder = _LogprobRecorder()
        # the warpers are our own processors; neutral values keep transformers' (and the
        # checkpoint's generation_config defaults) out
        neutral = (
            {"temperature": None, "top_p": None, "top_k": None}
            if greedy
            else {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
        )
        with self._decoding():
            seqs = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=params.max_new_tokens,
                do_sample=not greedy,
                eos_token_id=self.eos_id,
                pad_token_id=self.pad_id,
                logits_processor=_processors(params, recorder),
                **neutral,
            )
            seqs = seqs[:, width:]  # (B, T_new)
            tok_logp = recorder.finish(seqs)
        return [
            self.sampled(seqs[b].cpu().tolist(), tok_logp[b].tolist()) for b in range(len(prompts))
        ]

    def _generate_static(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        assert self.static is not None
        plan = self.static.plan(prompts)
        length = plan.width + params.max_new_tokens
        if not self.static.fits(len(prompts), length):
            del plan  # it refers to our caches
            self.static.release()  # free them for the smaller calls (fits counted them)
            if len(prompts) > 1:  # halves until the cache fits
                half = len(prompts) // 2
                return self._generate_static(prompts[:half], params) + self._generate_static(
                    prompts[half:], params
                )
            need = self.static.cache_bytes(1, length)
            raise MemoryError(
                f"the static KV cache for one sequence of {len(prompts[0])} + "
                f"{params.max_new_tokens} tokens needs {need / 2**30:.2f} GiB, more than the "
                f"{(self.static.budget() or 0) / 2**30:.2f} GiB available; lower "
                "rollout.max_context_tokens / the max new tokens, or set rollout.decode: generate"
            )
        warpers = _processors(params)
        with self._decoding():
            seqs, tok_logp = self.static.generate(plan, params, lambda s: warpers(None, s))
        return [
            self.sampled(seqs[b].cpu().tolist(), tok_logp[b].tolist()) for b in range(len(prompts))
        ]

    @contextlib.contextmanager
    def _decoding(self) -> Iterator[None]:
        """Eval mode, no autograd; layers compiled for training (compile_layers) would
        recompile per cache state and shape here, so decoding runs them eagerly."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode(), torch.compiler.set_stance("force_eager"):
                yield
        finally:
            self.model.train(was_training)
