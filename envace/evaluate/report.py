"""Write evaluation results: metrics.json, trajectories.jsonl and a printed table."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from envace.evaluate.runner import EvalResult
from envace.report import text_table
from envace.rollout.types import Trajectory
from envace.tasks.io import atomic_write_text

__all__ = ["metrics_table", "print_and_write", "trajectory_record"]

_SHOWN = (
    "n_tasks",
    "success_rate",
    "per_turn_score",
    "valid_call_rate",
    "calls_per_task",
    "rehearsal_fidelity",
    "rehearsal_field_fidelity",
    "error_flag_recall",
    "format_error_rate",
)


def trajectory_record(t: Trajectory) -> dict[str, Any]:
    """A JSON-friendly view of a trajectory (messages, calls, scores; no token ids)."""
    return {
        "task_id": t.uid,
        "traj_id": t.traj_id,
        "reward": t.reward,
        "success": t.success,
        "end_reason": str(t.end_reason),
        "turn_scores": t.turn_scores,
        "messages": t.messages,
        "calls": [
            {**asdict(c), "call": {"name": c.call.name, "arguments": c.call.arguments}}
            for c in t.calls
        ],
    }


def metrics_table(metrics: dict[str, Any]) -> str:
    return text_table(["metric", "value"], [(k, metrics.get(k)) for k in _SHOWN])


def print_and_write(result: EvalResult, out: Path, extra: dict[str, Any]) -> dict[str, Any]:
    metrics = {**result.metrics.to_dict(), **extra}
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    lines = "".join(json.dumps(trajectory_record(t)) + "\n" for t in result.trajectories)
    atomic_write_text(out / "trajectories.jsonl", lines)
    print(metrics_table(metrics))
    return metrics
