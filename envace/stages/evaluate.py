"""The evaluate step: committed execution of a checkpoint on the held-out tasks, optional
test-time rehearsal, and the Markdown report."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.config import Config
from envace.errors import UserInputError
from envace.evaluate.benchmarks import rehearsal_summary, rehearse_synthetic, write_memories
from envace.evaluate.rehearsal import (
    RehearsalConfig,
    RehearsalOutcome,
    parse_rehearsal,
    rehearsal_gain,
)
from envace.evaluate.report import write_trajectories
from envace.evaluate.runner import EvalResult
from envace.report import fmt, markdown_table
from envace.rollout.engine import RolloutConfig
from envace.run import (
    evaluate_model,
    load_splits,
    model_policy,
)
from envace.stages.checkpoint import CheckpointMeta, _Checkpoint, _load_checkpoint
from envace.stages.store import StageError, _commit, _local_copy, _scratch, _write_json

log = logging.getLogger(__name__)


# --- evaluate ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Evaluation:
    uri: str  # metrics.json, trajectories.jsonl, report.md (+ rehearsal/ with test-time rehearsal)
    metrics: dict[str, Any]  # EvalMetrics.to_dict() (+ `rehearsal/*` with test-time rehearsal)
    report: str  # Markdown
    iteration: int  # RL iterations trained into the evaluated checkpoint (0: before RL)


_REPORTED = (
    ("success_rate", "episodes that completed every turn and met the task's checks"),
    ("mean_reward", "mean episode reward"),
    ("per_turn_score", "mean score of a user turn"),
    ("valid_call_rate", "tool calls naming a tool with schema-valid arguments"),
    ("calls_per_task", "tool calls per episode"),
    ("rehearsal_fidelity", "rehearsed results equal to the real ones (exact JSON)"),
    ("rehearsal_field_fidelity", "top-level fields the rehearsal got right"),
    ("error_flag_recall", "real errors the rehearsal also predicted"),
    ("error_flag_false_rate", "real successes the rehearsal predicted as errors"),
    ("format_error_rate", "episodes ended by a malformed output"),
)

# Test-time rehearsal figures (`RehearsalGain` fields), reported as `rehearsal/<field>`.
_REHEARSAL_REPORTED = (
    ("success_without", "success per task of the committed execution without notes"),
    ("success_with", "success per task of the committed execution with the rehearsal notes"),
    ("gain", "success with - success without (a fraction)"),
    ("extra_tokens", "tokens the rehearsal generated: imagined attempts (both roles) + notes"),
    ("extra_tokens_per_task", "extra tokens per task"),
    ("extra_generations", "generations the rehearsal added (attempts + note writes)"),
    ("memory_tokens_per_task", "tokens of the final notes per task (the real context grows by)"),
)
REHEARSAL_PREFIX = "rehearsal/"


def evaluation_rehearsal(spec: str | None) -> RehearsalConfig | None:
    """The evaluate step's `rehearsal` parameter (the pipeline's `eval_rehearsal`) as a
    `RehearsalConfig`: `parallel:N` | `sequential:N` as `envace evaluate --rehearsal` takes it,
    the other settings at the CLI's defaults; empty or None: no test-time rehearsal."""
    text = (spec or "").strip()
    if not text:
        return None
    try:
        return parse_rehearsal(text)
    except UserInputError as exc:
        raise UserInputError(
            f"rehearsal {spec!r} (the evaluate step's `rehearsal`, the pipeline parameter "
            "`eval_rehearsal`): expected parallel:N or sequential:N with N >= 1 imagined attempts "
            "per task (e.g. parallel:4 or sequential:2), or empty for no test-time rehearsal"
        ) from exc


def _rehearsal_lines(metrics: Mapping[str, Any], rehearsal: RehearsalConfig | None) -> list[str]:
    if rehearsal is None:
        return [
            "Test-time rehearsal: none (committed execution only; the `rehearsal` parameter "
            "takes parallel:N or sequential:N).",
            "",
        ]
    config = {k: v for k, v in dataclasses.asdict(rehearsal).items() if k != "memory_prompt"}
    gain = {
        k.removeprefix(REHEARSAL_PREFIX): v
        for k, v in metrics.items()
        if k.startswith(REHEARSAL_PREFIX)
    }
    how = (
        "independent imagined attempts, condensed once"
        if rehearsal.mode == "parallel"
        else "imagined attempts one after another, each seeing the notes so far"
    )
    rows = [(REHEARSAL_PREFIX + k, gain.get(k), why) for k, why in _REHEARSAL_REPORTED]
    return [
        f"## Test-time rehearsal: {rehearsal.mode}:{rehearsal.n}",
        "",
        f"After the committed execution above, the policy rehearsed each task privately "
        f"({rehearsal.n} {how}; it wrote the tool results itself, nothing real ran), condensed "
        f"the attempts into notes of at most {rehearsal.memory_tokens} tokens and executed the "
        "task again in its real world with the notes in its system prompt (same tasks, seeds "
        "and sampling). That execution's metrics, episodes and the notes are in `rehearsal/` "
        "(metrics.json, trajectories.jsonl, memories.jsonl).",
        "",
        rehearsal_summary(config, gain),
        "",
        markdown_table(["metric", "value", "meaning"], rows),
        "",
    ]


def evaluation_report(
    metrics: Mapping[str, Any],
    checkpoint_uri: str,
    meta: CheckpointMeta,
    uris: Sequence[str],
    rehearsal: RehearsalConfig | None = None,
) -> str:
    """The Markdown report of an evaluation (`uris`: tasks, results); with `rehearsal`, a section
    on the test-time rehearsal from the `rehearsal/*` entries of `metrics`."""
    tasks_uri, out_uri = uris
    results = "metrics.json, trajectories.jsonl, report.md" + (", rehearsal/" if rehearsal else "")
    rows = [(name, metrics.get(name), why) for name, why in _REPORTED]
    ends = ", ".join(f"{k}: {v}" for k, v in sorted(metrics.get("end_reasons", {}).items()))
    lines = [
        "# EnvACE evaluation",
        "",
        f"Committed execution in the tasks' real worlds: {metrics.get('n_tasks')} held-out "
        f"task(s), {metrics.get('n_episodes')} episode(s); before each real call the policy "
        "also rehearsed its result (fidelity rows; n/a when `eval.probe_fidelity` is off).",
        "",
        markdown_table(["metric", "value", "meaning"], rows),
        "",
        f"End reasons: {ends or 'none'}. Unscored episodes: {fmt(metrics.get('unscored'))}.",
        "",
        *_rehearsal_lines(metrics, rehearsal),
        markdown_table(
            ["artifact", "URI"],
            [
                ("checkpoint", f"`{checkpoint_uri}` ({meta.iteration} RL iteration(s))"),
                ("RL started from", f"`{meta.rl_start}`"),
                ("tasks", f"`{tasks_uri}`"),
                ("results", f"`{out_uri}` ({results})"),
            ],
        ),
        "",
    ]
    return "\n".join(lines)


def _rehearse(
    cfg: Config, ckpt: _Checkpoint, baseline: EvalResult, rehearsal: RehearsalConfig
) -> tuple[RehearsalOutcome, EvalResult]:
    """Test-time rehearsal of the tasks `baseline` executed, then their execution with the
    notes, as `envace evaluate --rehearsal` does, with the baseline's policy and settings."""
    tasks = list({t.uid: t.task for t in baseline.trajectories}.values())
    return rehearse_synthetic(
        model_policy(ckpt.policy, ckpt.tokenizer, cfg, trainable=False),
        tasks,
        RolloutConfig.from_config(cfg, eval_mode=True),
        rehearsal,
        probe_fidelity=cfg.eval.probe_fidelity,
        n=cfg.eval.n,
        seed=cfg.seed,
        progress=True,
    )


def _write_rehearsal(
    folder: Path, rehearsal: RehearsalConfig, outcome: RehearsalOutcome, rehearsed: EvalResult
) -> None:
    """rehearsal/: the execution with notes (metrics.json, trajectories.jsonl) and the notes."""
    config = {k: v for k, v in dataclasses.asdict(rehearsal).items() if k != "memory_prompt"}
    _write_json(folder / "metrics.json", {**rehearsed.metrics.to_dict(), "config": config})
    write_trajectories(rehearsed.trajectories, folder / "trajectories.jsonl")
    write_memories(outcome, folder / "memories.jsonl")


def evaluate(
    cfg: Config,
    checkpoint_uri: str,
    tasks_uri: str,
    out_uri: str,
    *,
    rehearsal: str | None = None,
) -> Evaluation:
    """Held-out evaluation of the checkpoint's policy by committed execution in the real worlds
    (with rehearsal-fidelity probes when `eval.probe_fidelity`).

    `rehearsal` (`parallel:N` | `sequential:N`, as `envace evaluate --rehearsal`): then the
    policy also rehearses each task privately and executes it again with its notes; the metrics
    gain `rehearsal/*` (success without and with, gain, extra tokens), the report a section
    naming the mode, the results a `rehearsal/` folder. Empty or None: committed execution only.
    """
    rcfg = evaluation_rehearsal(rehearsal)  # a bad spec fails before anything loads
    with _scratch() as tmp:
        splits = load_splits(_local_copy(tasks_uri, tmp / "tasks"))
        if not splits.test:
            raise StageError(f"{tasks_uri} holds no held-out tasks (test.jsonl) to evaluate on")
        ckpt = _load_checkpoint(cfg, checkpoint_uri, tmp, with_state=False)
        result = evaluate_model(ckpt.policy, ckpt.tokenizer, cfg, splits.test, "pipeline")
        metrics = result.metrics.to_dict()
        out = tmp / "out"
        if rcfg is not None:
            outcome, rehearsed = _rehearse(cfg, ckpt, result, rcfg)
            gain = rehearsal_gain(result.trajectories, rehearsed.trajectories, outcome)
            metrics.update({REHEARSAL_PREFIX + k: v for k, v in gain.to_dict().items()})
            _write_rehearsal(out / "rehearsal", rcfg, outcome, rehearsed)
        report = evaluation_report(
            metrics, checkpoint_uri, ckpt.meta, (tasks_uri, out_uri), rehearsal=rcfg
        )
        _write_json(out / "metrics.json", {**metrics, "checkpoint": checkpoint_uri})
        (out / "report.md").write_text(report, encoding="utf-8")
        write_trajectories(result.trajectories, out / "trajectories.jsonl")
        return Evaluation(_commit(out, out_uri), metrics, report, ckpt.meta.iteration)
