"""Benchmark runs behind `envace evaluate --benchmark ...`, with and without test-time rehearsal.

A run executes the policy once per task for real (the baseline), and, when rehearsal is on,
rehearses every task privately, then executes again with the rehearsal notes in context — same
tasks, same seeds, same sampling — so the difference is the rehearsal's gain. Scores are per
category: the world for the synthetic tasks, the BFCL category for BFCL.

Outputs (`write_report`): OUT/report.json (every number) and OUT/report.md (the tables), plus
OUT/rehearsal/memories.jsonl (each task's notes and imagined attempts) when rehearsal is on.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envace.evaluate.bfcl.adapter import (
    BfclEpisode,
    CategoryScore,
    bfcl_settings,
    run_bfcl,
    summarize_bfcl,
)
from envace.evaluate.bfcl.client import BfclWorker
from envace.evaluate.bfcl.scoring import bfcl_overall
from envace.evaluate.metrics import summarize
from envace.evaluate.rehearsal import (
    RehearsalConfig,
    RehearsalOutcome,
    TurnRehearsal,
    attempt_lines,
    rehearsal_gain,
)
from envace.evaluate.report import trajectory_record
from envace.evaluate.runner import EvalResult, evaluate_policy
from envace.report import fmt, markdown_table
from envace.rollout.engine import RolloutConfig
from envace.rollout.policies import Policy
from envace.rollout.types import Trajectory
from envace.tasks.io import atomic_write_text
from envace.tasks.model import Task

__all__ = [
    "BenchmarkReport",
    "BfclRun",
    "SyntheticRun",
    "bfcl_episode_record",
    "bfcl_overall_line",
    "bfcl_report",
    "rehearsal_summary",
    "rehearse_synthetic",
    "run_bfcl_benchmark",
    "run_synthetic",
    "synthetic_report",
    "write_memories",
    "write_report",
]


@dataclass
class BenchmarkReport:
    """What `report.json` holds. `categories[c]` are the baseline scores; `rehearsal` (when on)
    has the overall gain and one gain per category."""

    benchmark: str
    policy: str
    seed: int
    score_name: str  # "success_rate" (synthetic) or "accuracy" (BFCL)
    categories: dict[str, dict[str, Any]]
    overall: dict[str, Any]
    rehearsal: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def markdown(self) -> str:
        head = [f"# Evaluation report: {self.benchmark}", ""]
        head += [f"- {k}: {v}" for k, v in {"policy": self.policy, "seed": self.seed}.items()]
        head += [f"- {k}: {v}" for k, v in self.info.items()]
        cols = ["category", "n", self.score_name]
        gains = (self.rehearsal or {}).get("categories", {})
        if self.rehearsal is not None:
            cols += ["with rehearsal", "gain", "extra tokens / task"]
        rows = [self._row(name, c, gains.get(name)) for name, c in self.categories.items()]
        overall = self.overall
        if "bfcl_overall" not in overall:
            rows.append(
                self._row("overall", overall, (self.rehearsal or {}).get("overall"), "score_micro")
            )
        body = ["", markdown_table(cols, rows)]
        if "bfcl_overall" in overall:
            body.append("\n" + bfcl_overall_line(overall, self.rehearsal))
        elif len(self.categories) > 1:
            body.append(f"\nMean over categories (macro): {fmt(overall.get('score_macro'))}")
        if self.rehearsal is not None:
            body.append(
                "\n" + rehearsal_summary(self.rehearsal["config"], self.rehearsal["overall"])
            )
        return "\n".join(head + body) + "\n"

    def _row(
        self, name: str, scores: dict[str, Any], gain: dict[str, Any] | None, key: str = "score"
    ) -> list[Any]:
        row: list[Any] = [name, scores.get("n"), scores.get(key)]
        if self.rehearsal is not None:
            g = gain or {}
            row += [g.get("success_with"), g.get("gain"), g.get("extra_tokens_per_task")]
        return row


def bfcl_overall_line(overall: dict[str, Any], rehearsal: dict[str, Any] | None) -> str:
    """BFCL's weighted v4 overall beside the share of its weight that ran, and the sections."""
    line = (
        f"BFCL overall (bfcl-eval's weighted v4 score; categories not run count 0): "
        f"{fmt(overall['bfcl_overall'])}, coverage {fmt(overall['coverage'])} of the v4 weight "
        f"ran ({overall['n']} entries)"
    )
    with_rehearsal = (rehearsal or {}).get("bfcl_overall_with_rehearsal")
    if with_rehearsal is not None:
        line += f"; with rehearsal {fmt(with_rehearsal['bfcl_overall'])}"
    sections = ", ".join(f"{k} {fmt(v)}" for k, v in overall["sections"].items())
    return f"{line}.\nSections (0 where nothing ran): {sections}."


def rehearsal_summary(config: dict[str, Any], g: dict[str, Any]) -> str:
    """One paragraph on a rehearsal: `config` (RehearsalConfig fields), `g` (a RehearsalGain as
    a dict): success without -> with, the gain and the extra cost."""
    return (
        f"Rehearsal {config['mode']}:{config['n']}, notes of at most {config['memory_tokens']} "
        "tokens. "
        f"Success {fmt(g['success_without'])} -> {fmt(g['success_with'])} "
        f"(gain {fmt(g['gain'])}) on the same {g['n_tasks']} tasks and seeds. "
        f"Extra cost: {g['extra_tokens']} generated tokens ({fmt(g['extra_tokens_per_task'], 1)} "
        f"per task), {g['extra_generations']} generations; the real context grows by "
        f"{fmt(g['memory_tokens_per_task'], 1)} tokens of notes per task."
    )


def _overall(n: int, micro: float | None, per_cat: Sequence[float | None]) -> dict[str, Any]:
    vals = [v for v in per_cat if v is not None]
    return {
        "n": n,
        "score_micro": micro,
        "score_macro": sum(vals) / len(vals) if vals else None,
    }


def _rehearsal_section(
    outcome: RehearsalOutcome,
    without: Sequence[Trajectory],
    with_rehearsal: Sequence[Trajectory],
    groups: dict[str, list[str]],
) -> dict[str, Any]:
    return {
        "config": {
            k: v for k, v in dataclasses.asdict(outcome.config).items() if k != "memory_prompt"
        },
        "memory_prompt": outcome.config.memory_prompt,
        "overall": rehearsal_gain(without, with_rehearsal, outcome).to_dict(),
        "categories": {
            cat: rehearsal_gain(without, with_rehearsal, outcome, ids).to_dict()
            for cat, ids in groups.items()
        },
    }


# --- synthetic worlds --------------------------------------------------------------------------
@dataclass
class SyntheticRun:
    baseline: EvalResult
    rehearsed: EvalResult | None = None
    outcome: RehearsalOutcome | None = None


def run_synthetic(
    policy: Policy,
    tasks: Sequence[Task],
    cfg: RolloutConfig,
    *,
    probe_fidelity: bool = True,
    n: int = 1,
    rehearsal: RehearsalConfig | None = None,
    seed: int = 0,
    progress: bool = False,
) -> SyntheticRun:
    """Committed execution in the real worlds; with `rehearsal`, again after rehearsing."""
    baseline = evaluate_policy(
        policy, tasks, cfg, probe_fidelity=probe_fidelity, n=n, progress=progress
    )
    if rehearsal is None:
        return SyntheticRun(baseline)
    outcome, rehearsed = rehearse_synthetic(
        policy,
        tasks,
        cfg,
        rehearsal,
        probe_fidelity=probe_fidelity,
        n=n,
        seed=seed,
        progress=progress,
    )
    return SyntheticRun(baseline, rehearsed, outcome)


def rehearse_synthetic(
    policy: Policy,
    tasks: Sequence[Task],
    cfg: RolloutConfig,
    rehearsal: RehearsalConfig,
    *,
    probe_fidelity: bool = True,
    n: int = 1,
    seed: int = 0,
    progress: bool = False,
) -> tuple[RehearsalOutcome, EvalResult]:
    """The rehearsal half of `run_synthetic`: execute every task again in its real world,
    rehearsing each turn privately before committing to it (the same tasks, `cfg`, `n` as the
    baseline)."""
    hook = TurnRehearsal(policy, rehearsal, seed=seed, progress=progress)
    rehearsed = evaluate_policy(
        policy,
        tasks,
        cfg,
        probe_fidelity=probe_fidelity,
        n=n,
        progress=progress,
        before_turn=hook,
    )
    return hook.outcome, rehearsed


def _world(task: Task) -> str:
    return task.environment.name if task.environment is not None else "none"


def _group(tasks: Sequence[Task], key: Callable[[Task], str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for t in tasks:
        groups.setdefault(key(t), []).append(t.id)
    return groups


def synthetic_report(
    run: SyntheticRun, tasks: Sequence[Task], policy: str, seed: int, info: dict[str, Any]
) -> BenchmarkReport:
    groups = _group(tasks, _world)
    cats: dict[str, dict[str, Any]] = {}
    for world, ids in groups.items():
        keep = set(ids)
        m = summarize([t for t in run.baseline.trajectories if t.uid in keep])
        cats[world] = {"n": m.n_tasks, "score": m.success_rate, **m.to_dict()}
    total = run.baseline.metrics
    report = BenchmarkReport(
        benchmark="synthetic",
        policy=policy,
        seed=seed,
        score_name="success_rate",
        categories=cats,
        overall=_overall(total.n_tasks, total.success_rate, [c["score"] for c in cats.values()]),
        info=info,
    )
    if run.rehearsed is not None and run.outcome is not None:
        report.rehearsal = _rehearsal_section(
            run.outcome, run.baseline.trajectories, run.rehearsed.trajectories, groups
        )
        report.rehearsal["metrics_with_rehearsal"] = run.rehearsed.metrics.to_dict()
    return report


# --- BFCL --------------------------------------------------------------------------------------
@dataclass
class BfclRun:
    """live_counts: the entries of each live AST category (the weights of BFCL's live section);
    settings: the run settings the episodes got (reported in `info`)."""

    baseline: list[BfclEpisode]
    rehearsed: list[BfclEpisode] | None = None
    outcome: RehearsalOutcome | None = None
    live_counts: dict[str, int] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)


def run_bfcl_benchmark(
    policy: Policy,
    tasks: Sequence[Task],
    cfg: RolloutConfig,
    worker: BfclWorker,
    *,
    rehearsal: RehearsalConfig | None = None,
    seed: int = 0,
    progress: bool = False,
) -> BfclRun:
    counts = dict(worker.info["live_counts"])
    settings = bfcl_settings(policy, cfg, worker)
    baseline = run_bfcl(policy, tasks, cfg, worker, progress=progress)
    if rehearsal is None:
        return BfclRun(baseline, live_counts=counts, settings=settings)
    # attempts take the step limits of the committed episode they rehearse for
    hook = TurnRehearsal(policy, rehearsal, seed=seed, progress=progress)
    rehearsed = run_bfcl(policy, tasks, cfg, worker, progress=progress, before_turn=hook)
    return BfclRun(baseline, rehearsed, hook.outcome, live_counts=counts, settings=settings)


def _bfcl_category(s: CategoryScore) -> dict[str, Any]:
    return {"score": s.accuracy, **s.to_dict()}


def _bfcl_overall(episodes: Sequence[BfclEpisode], live_counts: dict[str, int]) -> dict[str, Any]:
    """BFCL's weighted v4 overall of these episodes, its coverage and the entry count."""
    accuracy = {c: s.accuracy for c, s in summarize_bfcl(episodes).items()}
    return {"n": len(episodes), **bfcl_overall(accuracy, live_counts).to_dict()}


def bfcl_report(
    run: BfclRun, tasks: Sequence[Task], policy: str, seed: int, info: dict[str, Any]
) -> BenchmarkReport:
    scores = summarize_bfcl(run.baseline)
    report = BenchmarkReport(
        benchmark="bfcl",
        policy=policy,
        seed=seed,
        score_name="accuracy",
        categories={c: _bfcl_category(s) for c, s in scores.items()},
        overall=_bfcl_overall(run.baseline, run.live_counts),
        info={**info, **run.settings},
    )
    if run.rehearsed is not None and run.outcome is not None:
        groups = _group(tasks, lambda t: str(t.meta.get("category")))
        report.rehearsal = _rehearsal_section(
            run.outcome,
            [e.trajectory for e in run.baseline],
            [e.trajectory for e in run.rehearsed],
            groups,
        )
        report.rehearsal["scores_with_rehearsal"] = {
            c: _bfcl_category(s) for c, s in summarize_bfcl(run.rehearsed).items()
        }
        report.rehearsal["bfcl_overall_with_rehearsal"] = _bfcl_overall(
            run.rehearsed, run.live_counts
        )
    return report


def bfcl_episode_record(e: BfclEpisode) -> dict[str, Any]:
    return {
        "category": e.category,
        "valid": e.valid,
        "error_type": e.error_type,
        "error": e.error,
        **trajectory_record(e.trajectory),
    }


# --- writing -----------------------------------------------------------------------------------
def _memory_record(task_id: str, outcome: RehearsalOutcome) -> dict[str, Any]:
    rec = outcome.tasks[task_id]
    return {
        "task_id": task_id,
        "memory": rec.memory,
        "notes_per_step": [w.text for w in rec.writes],
        "attempt_tokens": rec.attempt_tokens,
        "memory_tokens": rec.memory_tokens,
        "attempts": [
            {
                "end_reason": str(t.end_reason),
                "lines": attempt_lines(t, outcome.config.max_result_chars),
            }
            for t in rec.attempts
        ],
    }


def write_report(
    report: BenchmarkReport, out: Path, outcome: RehearsalOutcome | None = None
) -> None:
    """OUT/report.json, OUT/report.md and, with rehearsal, OUT/rehearsal/memories.jsonl."""
    atomic_write_text(out / "report.json", json.dumps(report.to_dict(), indent=2) + "\n")
    atomic_write_text(out / "report.md", report.markdown())
    if outcome is not None:
        write_memories(outcome, out / "rehearsal" / "memories.jsonl")


def write_memories(outcome: RehearsalOutcome, path: Path) -> None:
    """One JSON line per task: its final notes, the notes after each condensation step, the
    imagined attempts (as the condenser saw them) and their token cost."""
    lines = "".join(json.dumps(_memory_record(k, outcome)) + "\n" for k in outcome.tasks)
    atomic_write_text(path, lines)
