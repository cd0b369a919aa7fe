"""bench/cpu_speed.py end to end on a micro checkpoint: EnvACE's update and rollout beside plain
transformers' on the same rows and prompts (vLLM skipped: it needs its worker venv)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench.bench_testlib import ROOT, run_bench_report

TASKS = 2
DTYPES = ("float32", "bfloat16")  # configs/local.yaml: model.dtype auto


def _micro_checkpoint(out: Path, tasks_dir: Path) -> Path:
    """The test-micro model with a tokenizer trained on the bench's own tasks (as `envace run`
    builds the tiny presets), so the gold conversations replay within the config's limits."""
    from envace.config import load_config
    from envace.policy.tiny import (
        build_tiny_model,
        build_tokenizer,
        corpus_min_frequency,
        save_checkpoint,
    )
    from envace.run import load_splits, tokenizer_corpus
    from envace.tasks.generate import write_splits

    cfg = load_config(ROOT / "configs" / "local.yaml")
    write_splits(tasks_dir, TASKS, 0, cfg.tasks.seed)
    corpus = tokenizer_corpus(cfg, load_splits(tasks_dir))
    tok = build_tokenizer(corpus, 2048, corpus_min_frequency(len(corpus)))
    return save_checkpoint(build_tiny_model(tok, "test-micro", seed=0), tok, out)


@pytest.mark.slow
def test_cpu_speed_counts_the_same_useful_tokens_and_packs_fewer_forward_tokens(
    tmp_path: Path,
) -> None:
    """Both updates train the same generations: the same useful (prompt + response) and trained
    tokens; EnvACE runs them as fewer, packed sequences, so fewer tokens go through the model.
    Every rollout row is there: the two in-process ones measured, vLLM's skipped with its
    reason, so EnvACE's ratio to it is unknown rather than made up."""
    ckpt = _micro_checkpoint(tmp_path / "ckpt", tmp_path / "tasks")
    args = ["--checkpoint", str(ckpt), "--tasks", str(TASKS), "--steps", "1"]
    args += ["--batch", "2", "--new-tokens", "4", "--skip", "vllm"]
    args += ["--trainable", "top_layers", "--top-layers", "1"]  # a row besides the config's
    # every weight (configs/local.yaml's top 12 layers are more than the micro model's 2); a
    # step's batch of 8 holds nearly every row of the two tasks, caller rows included
    for key in ("train.trainable=full", "train.top_layers=null", "warm_start.batch_rows=8"):
        args += ["--set", key]
    proc, report = run_bench_report("cpu_speed.py", args, tmp_path, tmp_path / "speed.json")

    machine = report["machine"]
    update = {(r["system"], r["trains"]): r for r in report["results"] if r["what"] == "update"}
    assert list(update) == [
        ("transformers", "full"),
        ("EnvACE", "full"),
        ("EnvACE", "top 1 layers"),
    ]
    hf, ours, top = update.values()
    for r in (hf, ours, top):
        assert r["status"] == "ok" and r["steps"] == 1 and r["step_s"] > 0
        assert r["tokens_per_s"] > 0 and r["forward_tokens"] > 0
    assert hf["dtype"] == "float32" and ours["dtype"] == top["dtype"] == machine["envace_dtype"]
    assert 0 < top["trained_params_m"] < ours["trained_params_m"] == hf["trained_params_m"]
    assert (top["useful_tokens"], top["forward_tokens"]) == (
        ours["useful_tokens"],
        ours["forward_tokens"],
    )
    assert ours["useful_tokens"] == hf["useful_tokens"] > 0
    assert ours["trained_tokens"] == hf["trained_tokens"] > 0
    # transformers: one sequence per generation; EnvACE: a conversation's caller turns as one
    assert hf["sequences_per_step"] == hf["generations_per_step"] == ours["generations_per_step"]
    assert ours["sequences_per_step"] < ours["generations_per_step"]
    assert ours["forward_tokens"] < hf["forward_tokens"]
    assert ours["vs_transformers"] == pytest.approx(
        ours["tokens_per_s"] / hf["tokens_per_s"], abs=0.01
    )
    assert ours["goal"] == ">= 2x" and ours["meets_goal"] == (ours["vs_transformers"] >= 2)

    rollout = {r["system"]: r for r in report["results"] if r["what"] == "rollout"}
    assert set(rollout) == {"transformers", "EnvACE", "vLLM"}
    for name in ("transformers", "EnvACE"):
        r = rollout[name]
        assert r["status"] == "ok" and (r["batch"], r["new_tokens"]) == (2, 4)
        assert r["dtype"] == machine["envace_dtype"]  # the model as EnvACE loads it
        assert 0 < r["generated"] <= 2 * 4 and r["tokens_per_s"] > 0 and r["prompt_tokens"] > 0
    assert rollout["EnvACE"]["backend"] == "TransformersBackend (static)"
    assert rollout["vLLM"]["status"] == "skipped: --skip vllm"
    assert rollout["EnvACE"]["vs_vllm"] is None and rollout["EnvACE"]["meets_goal"] is None

    assert machine["cores"] >= 1 and machine["torch"] and machine["envace_dtype"] in DTYPES
    assert isinstance(machine["bf16_native"], bool)
    assert machine["bf16_matmul_speedup"] > 0
    assert report["command"].startswith("python bench/cpu_speed.py --checkpoint")
    assert "useful tok/s" in proc.stdout and "x vLLM" in proc.stdout
