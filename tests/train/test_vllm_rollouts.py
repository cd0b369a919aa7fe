"""`rollout.backend: vllm` for real (vLLM's CPU build in its own venv, as in
tests/policy/test_vllm_backend.py; skipped, saying why, where that venv is not built).

The check that the engine follows training: the trainer's `rollout_logprob_diff` (mean |log p
under the trained weights - log p the sampler reported|). With the weights pushed after every
update it stays at float noise (~1e-7); with a stale engine and this learning rate it is
~7e-5 after one update (measured), so the 1e-5 bound fails when the push is missing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from envace import stages
from envace.config import load_config
from tests.helpers.micro import MICRO
from tests.helpers.ranks import ROOT
from tests.policy.test_vllm_backend import KV_CACHE_BYTES, VLLM_PYTHON, needs_vllm

VLLM = {
    "python": VLLM_PYTHON,
    "dtype": "float32",
    "max_model_len": 2048,
    "enforce_eager": True,
    "kv_cache_memory_bytes": KV_CACHE_BYTES,  # fixed: starts however busy the machine is
    "env": {"OMP_NUM_THREADS": "1"},
    "start_timeout_s": 300,
    "request_timeout_s": 120,
}
SETS = [*MICRO, "warm_start.enabled=false", "train.lr=5e-2"]
TOLERANCE = 1e-5


@pytest.mark.slow
@needs_vllm
def test_envace_run_rolls_out_with_vllm_on_the_trained_weights(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "envace", "run", "--out", str(out)]
    for kv in [*SETS, "train.iterations=2", "rollout.backend=vllm"]:
        cmd += ["--set", kv]
    cmd += ["--set", f"rollout.vllm={json.dumps(VLLM)}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "vLLM engine up" in proc.stderr
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [1, 2]
    for r in records:
        assert r["throughput/generated_tokens"] > 0
        assert r["time/weight_sync_s"] > 0  # weights pushed into the engine after the update
        assert r["policy/rollout_logprob_diff"] < TOLERANCE, r["policy/rollout_logprob_diff"]


@pytest.mark.slow
@needs_vllm
def test_pipeline_rollout_step_samples_with_vllm_from_the_checkpoint(
    tmp_path: Path,
) -> None:
    """The rollout step loads its engine from the checkpoint in the store; the train step on
    those rows (transformers weights) sees the same log-probs the engine reported."""
    store = str(tmp_path / "store")
    base = load_config(None, SETS)
    prepared = stages.prepare(base, store)
    cfg: Any = load_config(None, [*SETS, "rollout.backend=vllm"])
    cfg.rollout.vllm = dict(VLLM)
    layout = stages.RunLayout(store, "vllm")
    result = stages.rollout(cfg, prepared.checkpoint_uri, prepared.tasks_uri, 0, layout.rollout(0))
    assert result.metrics["throughput/generated_tokens"] > 0
    trained = stages.train(base, prepared.checkpoint_uri, result.uri, layout.checkpoint(0))
    assert trained.metrics["policy/rows"] > 0
    assert trained.metrics["policy/rollout_logprob_diff"] < TOLERANCE


def test_vllm_options_are_checked_with_their_key_path() -> None:
    from envace.errors import ConfigError
    from envace.policy.vllm_backend import VLLMBackend, VLLMError, VLLMOptions

    with pytest.raises(ConfigError, match=r"rollout\.vllm\.bogus: unknown key; known: .*dtype"):
        load_config(None, ['rollout.vllm={"bogus": 1}'])
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.gpu_memory_utilization: 2"):
        load_config(None, ['rollout.vllm={"gpu_memory_utilization": 2}'])
    with pytest.raises(VLLMError, match=r"rollout\.vllm\.python: '/nowhere/python' is not a file"):
        VLLMBackend(ROOT, VLLMOptions(python="/nowhere/python"))
