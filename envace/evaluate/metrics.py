"""Evaluation metrics over trajectories from committed execution in the real world."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from envace.envs.base import is_error_result
from envace.reward.fidelity import canonical_json, field_agreement
from envace.rollout.types import CallRecord, Trajectory

__all__ = ["EvalMetrics", "field_agreement", "summarize"]


@dataclass(frozen=True)
class EvalMetrics:
    """Aggregates. Rates are None where nothing was measured (e.g. fidelity without probes)."""

    n_tasks: int
    n_episodes: int
    success_rate: float | None
    mean_reward: float | None
    per_turn_score: float | None
    valid_call_rate: float | None
    calls_per_task: float
    rehearsal_fidelity: float | None  # exact JSON match of rehearsed vs real results
    rehearsal_field_fidelity: float | None  # top-level field agreement
    error_flag_recall: float | None  # real errors the rehearsal also flagged
    error_flag_false_rate: float | None  # real successes the rehearsal flagged as errors
    format_error_rate: float  # episodes ended by a malformed output
    unscored: int
    end_reasons: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _fidelity(calls: Sequence[CallRecord]) -> tuple[float | None, ...]:
    probed = [
        c for c in calls if c.source == "real" and (c.rehearsed is not None or c.rehearsal_error)
    ]
    if not probed:
        return None, None, None, None
    exact = [
        1.0
        if c.rehearsal_error is None and canonical_json(c.result) == canonical_json(c.rehearsed)
        else 0.0
        for c in probed
    ]
    fields = [0.0 if c.rehearsal_error else field_agreement(c.result, c.rehearsed) for c in probed]
    real_err = [c for c in probed if is_error_result(c.result)]
    real_ok = [c for c in probed if not is_error_result(c.result)]
    recall = _mean([1.0 if is_error_result(c.rehearsed) else 0.0 for c in real_err])
    false_flag = _mean([1.0 if is_error_result(c.rehearsed) else 0.0 for c in real_ok])
    return _mean(exact), _mean(fields), recall, false_flag


def summarize(trajs: Sequence[Trajectory]) -> EvalMetrics:
    """Aggregate trajectories (n per task allowed; rates are over episodes)."""
    calls = [c for t in trajs for c in t.calls]
    scored = [t for t in trajs if t.reward is not None]
    turn_scores = [s for t in trajs for s in t.turn_scores if s is not None]
    reasons: dict[str, int] = {}
    for t in trajs:
        key = str(t.end_reason) if t.end_reason is not None else "unknown"
        reasons[key] = reasons.get(key, 0) + 1
    exact, fields, recall, false_flag = _fidelity(calls)
    n_format = sum(1 for t in trajs if t.parse_errors > 0)
    return EvalMetrics(
        n_tasks=len({t.uid for t in trajs}),
        n_episodes=len(trajs),
        success_rate=_mean([1.0 if t.success else 0.0 for t in scored]),
        mean_reward=_mean([t.reward for t in scored if t.reward is not None]),
        per_turn_score=_mean(turn_scores),
        valid_call_rate=_mean(
            [1.0 if c.schema_valid else 0.0 for c in calls]
            + [0.0] * sum(t.parse_errors for t in trajs)
        ),
        calls_per_task=len(calls) / len(trajs) if trajs else 0.0,
        rehearsal_fidelity=exact,
        rehearsal_field_fidelity=fields,
        error_flag_recall=recall,
        error_flag_false_rate=false_flag,
        format_error_rate=n_format / len(trajs) if trajs else 0.0,
        unscored=len(trajs) - len(scored),
        end_reasons=reasons,
    )
