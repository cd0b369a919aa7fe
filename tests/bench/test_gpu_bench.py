"""bench/gpu.py's quick CPU mode end to end: training (torch and DeepSpeed engines), decoding,
the rollout loop, one RL iteration by stage; a table on stdout and a JSON report.

Run in a subprocess: the DeepSpeed engine joins a process group, which must not outlive the
benchmark inside the test process.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.bench.bench_testlib import load_bench, run_bench_report


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
    # the rollout loop at the mode's size: generated tokens over the rollout's wall time
    (loop,) = [r for r in report["results"] if r["what"] == "rollout_loop"]
    assert (loop["trajectories"], loop["tasks"], loop["prefix_cache"]) == (4, 2, True)
    assert loop["rows"] >= loop["trajectories"] and loop["generated_tokens"] > 0
    assert loop["tokens_per_s"] == pytest.approx(
        loop["generated_tokens"] / loop["rollout_s"], rel=0.02
    )
    assert 0 < sum(loop["decode_phases"].values()) <= loop["rollout_s"]
    assert loop["baseline_tokens_per_s"] is None and loop["meets_baseline"] is None  # CPU
    assert 0 < loop["computed_tokens_timed_iteration"] < loop["prompt_tokens_timed_iteration"]
    (rl,) = [r for r in report["results"] if r["what"] == "rl_iteration"]
    stages = rl["rollout_s"] + rl["reward_s"] + rl["update_s"] + rl["checkpoint_s"]
    assert rl["rows"] > 0 and stages == pytest.approx(rl["total_s"], abs=0.01)
    assert rl["decode"] == "static" and 0 < rl["decode_phases"]["steps_s"] <= rl["rollout_s"]
    # prefix caching: the n rollouts of a task share their first prompt, at the least
    assert rl["prefix_cache"] is True
    assert 0 < rl["computed_tokens_timed_iteration"] < rl["prompt_tokens_timed_iteration"]
    headers = ("tokens/s", "MFU", "ms/step", "rollout loop", "baseline tok/s", "checkpoint s")
    for header in (*headers, "prefix cache"):
        assert header in proc.stdout


def test_rollout_loop_on_a_real_shape_with_its_own_vocabulary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU plan's rollout-loop row (a real shape with its full vocabulary, larger than the
    task tokenizer's: sampled ids the tokenizer does not know decode to nothing), run on the
    CPU with the tiny-4m shape (4,096 ids over a ~1,000-token tokenizer). In process: no
    DeepSpeed engine is built for a rollout."""
    bench = load_bench("gpu.py", monkeypatch)
    quick = bench.PLANS["quick"]
    plan = dataclasses.replace(quick, rl_shape="tiny-4m")
    row = bench.bench_rollout_loop(plan, tmp_path / "a", trajectories=6)
    assert (row["trajectories"], row["tasks"]) == (6, 3)  # 3 tasks x rollout.n = 2
    assert row["vocab"] == 4096 and row["model_params_m"] > 3  # the shape, not the tiny model
    assert row["rows"] >= 6 and row["generated_tokens"] >= 6
    assert row["tokens_per_s"] > 0 and row["decode"] == "static"
    assert row["keep_decode_cache"] is False and row["prefix_cache"] is True
    # rollout.keep_decode_cache: the warm-up's caches are kept, yet the timed rollout computes
    # the same prompt tokens (the weights "changed" in between: no stale prefix is reused)
    keep = bench.decode_settings(keep_decode_cache=True)
    kept = bench.bench_rollout_loop(plan, tmp_path / "b", trajectories=6, settings=keep)
    assert kept["keep_decode_cache"] is True
    for key in ("prompt_tokens_timed_iteration", "computed_tokens_timed_iteration"):
        assert kept[key] == row[key] > 0
