"""Write evaluation results: metrics.json, trajectories.jsonl and a printed table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from envace.evaluate.runner import EvalResult
from envace.report import text_table
from envace.rollout.types import Trajectory
from envace.tasks.io import atomic_write_text

__all__ = ["metrics_table", "print_and_write", "trajectory_record", "write_trajectories"]

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


def trajectory_record(t: Trajectory, *, rows: bool = False) -> dict[str, Any]:
    """A JSON-friendly view of a trajectory (messages, calls, scores; no token ids). `rows`:
    also each generation's role, turn, length, validity, score and GRPO advantage (a training
    rollout's rows, once `RLTrainer` scored them)."""
    record = {
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
    if rows:
        record["rows"] = [
            {
                "role": str(r.role),
                "turn": r.turn,
                "tokens": len(r.response_ids),
                "valid": r.valid,
                "finish_reason": r.finish_reason,
                "score": r.reward,
                "advantage": r.advantage,
                "fidelity": r.fidelity,
            }
            for r in t.rows
        ]
    return record


def write_trajectories(
    trajectories: Sequence[Trajectory], path: Path, *, rows: bool = False
) -> None:
    """`path` (JSON lines, one `trajectory_record` each), written atomically."""
    lines = "".join(json.dumps(trajectory_record(t, rows=rows)) + "\n" for t in trajectories)
    atomic_write_text(path, lines)


def metrics_table(metrics: dict[str, Any]) -> str:
    return text_table(["metric", "value"], [(k, metrics.get(k)) for k in _SHOWN])


def print_and_write(result: EvalResult, out: Path, extra: dict[str, Any]) -> dict[str, Any]:
    metrics = {**result.metrics.to_dict(), **extra}
    atomic_write_text(out / "metrics.json", json.dumps(metrics, indent=2) + "\n")
    write_trajectories(result.trajectories, out / "trajectories.jsonl")
    print(metrics_table(metrics))
    return metrics
