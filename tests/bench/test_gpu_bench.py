"""bench/gpu.py's quick CPU mode end to end: training (torch and DeepSpeed engines), decoding,
one RL iteration by stage; a table on stdout and a JSON report.

Run in a subprocess: the DeepSpeed engine joins a process group, which must not outlive the
benchmark inside the test process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.bench_testlib import run_bench_report


@pytest.mark.slow
def test_quick_mode_reports_training_decoding_and_an_rl_iteration(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed", reason="the training rows use the DeepSpeed engine")
    args = ["--mode", "quick", "--no-vllm", "--profile"]
    proc, report = run_bench_report("gpu.py", args, tmp_path, tmp_path / "bench.json")
    assert report["mode"] == "quick" and report["measured_gemm_tflops"] > 0
    train = [r for r in report["results"] if r["what"] == "train"]
    assert {r["engine"] for r in train} == {"torch", "deepspeed"}
    for r in train:
        assert r["status"] == "ok" and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * r["seq"] / r["step_s"], rel=0.01)
    decode = {r["backend"]: r for r in report["results"] if r["what"] == "decode"}
    assert decode["hf generate"]["tokens_per_s"] > 0
    for mode in ("static", "static-compiled", "static-sdpa", "generate"):
        row = decode[f"EnvACE transformers ({mode})"]
        assert row["generated"] > 0 and row["tokens_per_s"] > 0
        assert row["max_logprob_gap"] < 1e-3  # fp32: the returned log-probs are the model's
    assert "EnvACE vLLM" not in decode  # --no-vllm
    static = decode["EnvACE transformers (static)"]
    wall = static["ms_per_step"] * static["new"] / 1000
    assert 0 < sum(static["phases"].values()) <= wall * 1.05 + 0.01  # phases within the call
    assert static["phases"]["capture_s"] == 0  # no CUDA graph on the CPU
    # the timed call's prompts are new: its whole prefill is computed (no prefix-cache hit)
    assert static["prompt_tokens_computed"] == static["batch"] * static["prompt"]
    # --profile: each static decoder's step, timed and split by kind of op (a table per row)
    for mode in ("static", "static-compiled", "static-sdpa"):
        prof = decode[f"EnvACE transformers ({mode})"]["step_profile"]
        assert (prof["batch"], prof["cache_len"]) == (static["batch"], static["prompt"] + 8)
        assert prof["step_ms"] > 0 and prof["no_graph_step_ms"] > 0
        kinds = prof["profiled_ms_by_kind"]
        assert kinds["weights_mm"] > 0 and kinds["attention"] > 0 and kinds["other"] > 0
        table = tmp_path / f"profile-decode-{mode}-test-micro-4.txt"
        assert "aten::mm" in table.read_text()
    assert "decode step" in proc.stdout and "attention" in proc.stdout
    (rl,) = [r for r in report["results"] if r["what"] == "rl_iteration"]
    stages = rl["rollout_s"] + rl["reward_s"] + rl["update_s"] + rl["checkpoint_s"]
    assert rl["rows"] > 0 and stages == pytest.approx(rl["total_s"], abs=0.01)
    assert rl["decode"] == "static" and 0 < rl["decode_phases"]["steps_s"] <= rl["rollout_s"]
    # prefix caching: the n rollouts of a task share their first prompt, at the least
    assert rl["prefix_cache"] is True
    assert 0 < rl["computed_tokens_timed_iteration"] < rl["prompt_tokens_timed_iteration"]
    for header in ("tokens/s", "MFU", "ms/step", "rollout s", "checkpoint s", "prefix cache"):
        assert header in proc.stdout
