"""`run_main`: the whole method in one job, composed of the building blocks (`envace.run.blocks`)
and the RL stage (`envace.run.loop`); reports, summary and the committed report at the end."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from envace.config import Config
from envace.evaluate.runner import EvalResult
from envace.report import text_table
from envace.run.blocks import evaluate_model, init_model, warm_start
from envace.run.job import broadcast_weights, join_job, wait_for_all
from envace.run.layout import RunPaths, TaskSplits, copy_tensorboard, load_splits, prepare_tasks
from envace.run.loop import RunContext, rl_stage
from envace.run.resume import restore_history, resume_point
from envace.tasks.io import atomic_write_text
from envace.train.adapters import save_hf_checkpoint
from envace.train.distributed import DistInfo
from envace.train.engine import require_finite_weights
from envace.train.rl import generation_ready
from envace.train.tracking import MetricsLogger, NullLogger, TrackedRun, plot_progress

log = logging.getLogger(__name__)


STAGE_NAMES = ("untrained", "warm_start", "rl")


def _stage_metrics(result: EvalResult) -> dict[str, Any]:
    m = result.metrics
    return {
        "success_rate": m.success_rate,
        "valid_call_rate": m.valid_call_rate,
        "rehearsal_fidelity": m.rehearsal_fidelity,
        "per_turn_score": m.per_turn_score,
        "rehearsal_field_fidelity": m.rehearsal_field_fidelity,
        "error_flag_recall": m.error_flag_recall,
        "n_tasks": m.n_tasks,
    }


def _initial_model(
    cfg: Config, paths: RunPaths, splits: TaskSplits, info: DistInfo
) -> tuple[Any, Any]:
    """The configured or preset model; a node's first process builds and saves the preset one."""
    from envace.policy.hf_backend import load_model_and_tokenizer

    init_dir = paths.checkpoints / "init"
    builds = cfg.model.path is not None or info.local_rank == 0
    if builds:
        model, tokenizer = init_model(cfg, splits, init_dir)
    wait_for_all(cfg, "initial checkpoint")
    if not builds:
        model, tokenizer = load_model_and_tokenizer(
            init_dir, cfg.model.dtype, device=cfg.model.device
        )
    if init_dir.is_dir():
        paths.commit(init_dir)
    return model, tokenizer


def _start(
    cfg: Config, out: Path, store: str | None, resume: bool, info: DistInfo, overwrite: bool
) -> RunContext:
    """Tasks, resume point and the starting model, on every rank.

    Nothing is written before the resume point is known and the folder may be used (the inputs
    were checked by `run_main`): a refused folder leaves `out` as it was.
    """
    from envace.train import preflight

    if info.is_main and not resume:
        found = preflight.previous_run(out, store)
        if found is not None:
            if not overwrite:
                preflight.refuse_previous_run(found, out)
            preflight.clear_previous_run(out, store)
    wait_for_all(cfg, "pre-flight checks")
    preflight.make_out_dir(out)  # rank 0 made it under the run lock; the other ranks here
    paths = RunPaths(out, store or str(out), writes=info.is_main)
    stages_path = out / "stages.json"
    first_on_node = info.local_rank == 0
    resume_from = resume_point(paths, info) if resume else None
    if resume and resume_from is None and info.is_main:
        log.warning(
            "--resume: no complete checkpoint under %s/checkpoints/rl; starting a fresh run",
            paths.store,
        )
    if resume_from is not None:
        saved = resume_from / "config.json"
        preflight.check_resume_config(cfg, saved if saved.exists() else out / "config.json")
    if info.is_main:
        atomic_write_text(out / "config.json", json.dumps(cfg.to_dict(), indent=2) + "\n")
    if resume_from is not None and first_on_node:
        restore_history(paths, resume_from)
    if resume_from is None and first_on_node:
        prepare_tasks(cfg, paths)
    if resume_from is None and info.is_main:  # a fresh run starts a fresh metric history
        (out / "metrics.jsonl").unlink(missing_ok=True)
    wait_for_all(cfg, "tasks and resume point")
    splits = load_splits(paths.tasks)
    if resume_from is None:
        model, tokenizer = _initial_model(cfg, paths, splits, info)
        return RunContext(cfg, paths, splits, model, tokenizer)
    from envace.policy.hf_backend import load_model_and_tokenizer

    stages = json.loads(stages_path.read_text()) if stages_path.exists() else {}
    model, tokenizer = load_model_and_tokenizer(
        resume_from / "policy", cfg.model.dtype, device=cfg.model.device
    )
    return RunContext(cfg, paths, splits, model, tokenizer, resume_from, stages)


def run_main(
    cfg: Config,
    out: Path,
    store: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run the whole method; returns the summary written to OUT/summary.json (on rank 0; the
    other ranks of a multi-process run return `{"rank": r}`).

    A folder that already holds a run needs `resume` (continue it) or `overwrite` (replace it);
    a folder another run is using is refused (rank 0 holds `OUT/.envace.lock` while it runs).
    """
    from envace.train import preflight

    t0 = time.perf_counter()
    info = join_job(cfg)
    preflight.check_inputs(cfg, out, store)
    with preflight.run_lock(out, enabled=info.is_main):
        return _run_locked(cfg, out, store, resume, overwrite, info, t0)


def _run_locked(
    cfg: Config,
    out: Path,
    store: str | None,
    resume: bool,
    overwrite: bool,
    info: DistInfo,
    t0: float,
) -> dict[str, Any]:
    main = info.is_main
    st = _start(cfg, out, store, resume, info, overwrite)
    paths, stages, splits, tokenizer = st.paths, st.stages, st.splits, st.tokenizer

    def record(name: str, model: Any, label: str) -> None:
        stages[name] = _stage_metrics(evaluate_model(model, tokenizer, cfg, splits.test, label))
        atomic_write_text(out / "stages.json", json.dumps(stages, indent=2) + "\n")

    def eval_hook(m: Any) -> float:
        return (
            evaluate_model(m, tokenizer, cfg, splits.test, "during RL").metrics.success_rate or 0.0
        )

    # Opened before the first evaluation: a tracker that cannot start (a wrong MLflow URI or
    # credential) stops the run in seconds, not after the warm start.
    logger: MetricsLogger | NullLogger = _metrics_logger(cfg, paths) if main else NullLogger()
    try:
        if "untrained" not in stages and main:
            record("untrained", st.model, "untrained")
        if st.resume_from is None and cfg.warm_start.enabled:
            stages["warm_start_training"] = warm_start(cfg, st.model, tokenizer, splits)
            if info.distributed:
                broadcast_weights(st.model)
            if main:
                ws_dir = paths.checkpoints / "warm_start"
                require_finite_weights(st.model, "the weights to save as checkpoints/warm_start")
                save_hf_checkpoint(st.model, ws_dir, tokenizer)
                paths.commit(ws_dir)
                record("warm_start", st.model, "warm start")
        wait_for_all(cfg, "evaluations before RL")
        model, records, engine = rl_stage(st, logger, eval_hook)
    except BaseException:
        logger.close(failed=True)  # MLflow: FAILED; a resume sets it RUNNING again
        raise
    logger.close()
    if cfg.train.iterations > 0:
        with generation_ready([engine]):
            if main:
                record("rl", model, "after RL")
        wait_for_all(cfg, "evaluation after RL")
    final = paths.checkpoints / "final"
    require_finite_weights(model, "the weights to save as checkpoints/final")
    engine.save_weights(final, tokenizer)  # collective under ZeRO-3 (gathers the shards)
    if not main:
        return {"rank": info.rank}
    paths.commit(final)
    return _finish(paths, stages, records, st.resume_from, time.perf_counter() - t0, info)


def _metrics_logger(cfg: Config, paths: RunPaths) -> MetricsLogger:
    """metrics.jsonl and the trackers the config asks for, keyed by this run (`TrackedRun`):
    its store URI and the commit time of its tasks, which a fresh start (also --overwrite)
    renews and a resume keeps, so a restarted or resumed run continues its MLflow / W&B run."""
    from envace.storage.artifacts import read_manifest
    from envace.storage.uri import parse_uri

    started = read_manifest(paths.store_uri(paths.tasks)).created
    run = TrackedRun(str(parse_uri(paths.store)), started)
    return MetricsLogger.from_config(paths.out, cfg, run)


def _finish(
    paths: RunPaths,
    stages: dict[str, Any],
    records: list[dict[str, Any]],
    resume_from: Path | None,
    wall_s: float,
    info: DistInfo,
) -> dict[str, Any]:
    """Plot, summary.json and the committed report (rank 0)."""
    out = paths.out
    all_records = (
        [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
        if (out / "metrics.jsonl").exists()
        else records
    )
    evals = {
        k: v["success_rate"]
        for k, v in stages.items()
        if k in STAGE_NAMES and v.get("success_rate") is not None
    }
    plot = plot_progress(all_records, evals, out / "progress.png")
    summary: dict[str, Any] = {
        "stages": {k: v for k, v in stages.items() if k in STAGE_NAMES},
        "warm_start_training": stages.get("warm_start_training"),
        "wall_seconds": wall_s,
        "resumed_from": str(resume_from) if resume_from else None,
        "ranks": info.world_size,
        "artifacts": {
            "metrics": str(out / "metrics.jsonl"),
            "summary": str(out / "summary.json"),
            "plot": str(plot),
            "tensorboard": str(out / "tensorboard"),
            "final_checkpoint": paths.store_uri(paths.checkpoints / "final"),
            "store": paths.store,
        },
    }
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    summary["artifacts"]["report"] = commit_report(paths)
    _print_summary(summary)
    return summary


def commit_report(paths: RunPaths) -> str:
    """summary, metrics, plot, config and TensorBoard events as one committed artifact
    (`report/`)."""
    import shutil

    report = paths.out / "report"
    report.mkdir(exist_ok=True)
    for name in ("summary.json", "metrics.jsonl", "stages.json", "config.json", "progress.png"):
        if (paths.out / name).exists():
            shutil.copyfile(paths.out / name, report / name)
    copy_tensorboard(paths.out, report)
    return paths.commit(report)


def _print_summary(summary: dict[str, Any]) -> None:
    rows = [
        (name, s.get("success_rate"), s.get("valid_call_rate"), s.get("rehearsal_fidelity"))
        for name, s in summary["stages"].items()
    ]
    print()
    print(text_table(["stage", "success_rate", "valid_call_rate", "rehearsal_fidelity"], rows))
    print(f"\nwall time: {summary['wall_seconds']:.0f} s")
    for k, v in summary["artifacts"].items():
        print(f"{k:>17}: {v}")
