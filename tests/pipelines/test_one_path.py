"""`envace run` and the pipeline's stage functions are one implementation of the method.

The same micro config runs twice: once through `envace run` (in one process, local folders) and
once through the stage functions the KFP components call (prepare, warm start, then rollout and
train per round, then evaluate), each reading its inputs from and committing its outputs to a
store. The per-iteration metrics, the final weights (bit for bit) and the held-out evaluation
must agree: a difference means the two paths have drifted apart.

The micro model earns no reward, so its RL updates are the optimizer's weight decay alone (the
weights still move, and the test checks they did); that the policy-gradient step through the
store equals the one in one process is tests/pipelines/test_stages.py's
`test_train_steps_through_the_store_equal_updates_in_one_process`, on rows with rewards.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from envace import stages
from envace.config import load_config
from envace.policy.hf_backend import load_model_and_tokenizer
from envace.run import run_main

ITERATIONS = 2
# Timings and throughputs differ between any two runs; everything else must be equal.
_VOLATILE = ("time/", "perf/", "throughput/")


def _comparable(record: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v
        for k, v in record.items()
        if not k.startswith(_VOLATILE) and not k.endswith(("_s", "_seconds", "tokens_per_s"))
    }


def _close(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Keys on which two metric records differ (floats to 1e-6, relative or absolute)."""
    diff = sorted(set(a) ^ set(b))
    for key in sorted(set(a) & set(b)):
        x, y = a[key], b[key]
        if isinstance(x, float) and isinstance(y, float):
            if not (math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-6) or (x != x and y != y)):
                diff.append(f"{key}: {x} != {y}")
        elif x != y:
            diff.append(f"{key}: {x!r} != {y!r}")
    return diff


@pytest.mark.slow
def test_envace_run_and_the_stage_functions_train_the_same_policy(
    tmp_path: Path, micro: list[str]
) -> None:
    sets = [f"train.iterations={ITERATIONS}", "train.weight_decay=0.1", "eval.probe_fidelity=false"]
    cfg = load_config(None, [*micro, *sets])

    summary = run_main(cfg, tmp_path / "run")
    run_records = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if line.strip()
    ]
    assert [r["iteration"] for r in run_records] == list(range(1, ITERATIONS + 1))

    store = str(tmp_path / "store")
    layout = stages.RunLayout(store, "pipeline")
    prepared = stages.prepare(cfg, store)
    checkpoint = stages.warm_start(
        cfg, prepared.checkpoint_uri, prepared.tasks_uri, layout.warm_start
    )
    stage_records = []
    for it in range(ITERATIONS):
        rolled = stages.rollout(cfg, checkpoint, prepared.tasks_uri, it, layout.rollout(it))
        trained = stages.train(cfg, checkpoint, rolled.uri, layout.checkpoint(it))
        stage_records.append({**rolled.metrics, **trained.metrics})
        checkpoint = trained.uri
    evaluation = stages.evaluate(cfg, checkpoint, prepared.tasks_uri, layout.evaluation)

    for it, (mine, theirs) in enumerate(zip(run_records, stage_records, strict=True)):
        ours = {k: v for k, v in _comparable(mine).items() if k in _comparable(theirs)}
        shared = _comparable(theirs)
        assert len(ours) >= 0.8 * len(shared), sorted(set(shared) - set(ours))
        assert not _close(ours, {k: shared[k] for k in ours}), f"iteration {it}"

    run_final, _ = load_model_and_tokenizer(tmp_path / "run" / "checkpoints" / "final")
    stage_final, _ = load_model_and_tokenizer(Path(checkpoint) / "policy")
    warm, _ = load_model_and_tokenizer(Path(layout.warm_start))
    moved = 0
    for (name, want), got, start in zip(
        run_final.state_dict().items(),
        stage_final.state_dict().values(),
        warm.state_dict().values(),
        strict=True,
    ):
        assert torch.equal(want, got), name
        moved += int(not torch.equal(got, start))
    assert moved > 0, "the RL steps changed no weight: the comparison proves nothing"

    after_rl = summary["stages"]["rl"]
    for key in ("success_rate", "per_turn_score", "valid_call_rate", "n_tasks"):
        assert after_rl[key] == pytest.approx(evaluation.metrics[key]), key
