"""`envace evaluate`: committed execution of a policy on held-out tasks or on BFCL.

envace evaluate --policy P --tasks test.jsonl --out OUT            # synthetic worlds
envace evaluate --policy P --benchmark bfcl:simple,multi_turn_base --out OUT
... [--rehearsal parallel:N | sequential:N]                       # test-time rehearsal
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "evaluate",
        help="run a policy on tasks in the real worlds (or BFCL) and report success and fidelity",
        description="Committed execution of a policy (oracle | random | empty | checkpoint) on "
        "tasks in their executable worlds, or on BFCL categories graded by bfcl-eval. Prints a "
        "table and writes OUT/report.md and OUT/report.json (per-category scores); synthetic "
        "runs also write OUT/metrics.json and OUT/trajectories.jsonl.",
    )
    p.add_argument(
        "--policy", required=True, help="oracle | random | empty | checkpoint dir | hub id"
    )
    p.add_argument(
        "--benchmark",
        default="synthetic",
        help="synthetic (the --tasks file, default) | bfcl:CATEGORIES with CATEGORIES a comma "
        "list of BFCL v4 categories (simple_python, simple_java, simple_javascript, multiple, "
        "parallel, parallel_multiple, irrelevance, live_simple, live_multiple, live_parallel, "
        "live_parallel_multiple, live_irrelevance, multi_turn_base, multi_turn_miss_func, "
        "multi_turn_miss_param, multi_turn_long_context, memory_kv, memory_rec_sum) or groups "
        "(simple: the three languages; non_live, live, single_turn, multi_turn, memory, all)",
    )
    p.add_argument("--tasks", type=Path, help="task JSONL file (held-out split; synthetic only)")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument(
        "--limit",
        type=int,
        default=None,
        help="at most N tasks: the first N of --tasks, or N evenly spaced entries per BFCL category",
    )
    p.add_argument("--n", type=int, default=1, help="episodes per task (default 1; synthetic)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (0: greedy, default)"
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-context-tokens", type=int, default=4096)
    p.add_argument(
        "--max-steps-per-turn",
        type=int,
        default=8,
        help="caller generations per user turn (synthetic; BFCL uses bfcl-eval's limits: 1 for "
        "single-turn entries, 20 steps with calls and then an answer per turn otherwise)",
    )
    p.add_argument(
        "--tool-schemas",
        choices=["full", "compact"],
        default="full",
        help="tool schemas the caller and the simulator see (a run's rollout.tool_schemas: "
        "evaluate a checkpoint with the setting it was trained with; configs/local.yaml: compact)",
    )
    p.add_argument(
        "--sim-whitelist",
        choices=["schemas", "names"],
        default="schemas",
        help="the simulator prompt's tool whitelist (a run's rollout.sim_whitelist)",
    )
    p.add_argument("--no-fidelity", action="store_true", help="skip the rehearsal-fidelity probes")
    p.add_argument("--skip-invalid", action="store_true", help="skip malformed tasks (reported)")
    _add_rehearsal_flags(p)
    p.add_argument(
        "--store", default=None, help="also commit the report folder to this artifact store URI"
    )
    p.set_defaults(func=_run)


def _add_rehearsal_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "test-time rehearsal",
        "rehearse each task privately before its real execution and report the gain over no "
        "rehearsal on the same tasks and seeds (see docs/evaluation.md)",
    )
    g.add_argument(
        "--rehearsal", default=None, help="parallel:N | sequential:N imagined attempts per task"
    )
    g.add_argument(
        "--rehearsal-memory-tokens",
        type=int,
        default=96,
        help="budget of the rehearsal notes in the policy's tokens (default 96)",
    )
    g.add_argument(
        "--rehearsal-temperature",
        type=float,
        default=1.0,
        help="sampling temperature of the imagined attempts (default 1.0)",
    )
    g.add_argument(
        "--rehearsal-prompt",
        type=Path,
        default=None,
        help="text file replacing the condensation prompt (the memory prompt)",
    )


def _rehearsal_config(args: argparse.Namespace) -> Any:
    from envace.errors import UserInputError
    from envace.evaluate.rehearsal import parse_rehearsal

    if args.rehearsal is None:
        return None
    fields: dict[str, Any] = {
        "memory_tokens": args.rehearsal_memory_tokens,
        "temperature": args.rehearsal_temperature,
    }
    if args.rehearsal_prompt is not None:
        try:
            fields["memory_prompt"] = args.rehearsal_prompt.read_text(encoding="utf-8")
        except OSError as exc:
            raise UserInputError(f"--rehearsal-prompt {args.rehearsal_prompt}: {exc}") from exc
        except UnicodeDecodeError as exc:
            raise UserInputError(
                f"--rehearsal-prompt {args.rehearsal_prompt}: byte {exc.start} is not UTF-8; the "
                "file must be UTF-8 text (re-save it as UTF-8)"
            ) from exc
    return parse_rehearsal(args.rehearsal, **fields)


def _policy(spec: str, benchmark: str, seed: int, rcfg: Any) -> Any:
    from envace.evaluate.bfcl.policies import BfclOraclePolicy, EmptyPolicy
    from envace.evaluate.rehearsal import check_can_rehearse
    from envace.rollout.factory import CHECKPOINT_FORMS, build_policy

    if spec == "empty":
        policy: Any = EmptyPolicy()
    elif spec == "oracle" and benchmark == "bfcl":
        policy = BfclOraclePolicy()
    else:
        policy = build_policy(spec, seed=seed, forms=f"oracle, random, empty, {CHECKPOINT_FORMS}")
    if rcfg is not None:
        check_can_rehearse(policy, f"--policy {spec} --rehearsal")
    return policy


def _rollout_config(args: argparse.Namespace) -> Any:
    from envace.policy.types import SamplingParams
    from envace.rollout.engine import RolloutConfig

    sampling = SamplingParams(args.max_new_tokens, args.temperature, seed=args.seed)
    return RolloutConfig(
        caller_sampling=sampling,
        simulator_sampling=sampling,
        max_steps_per_turn=args.max_steps_per_turn,
        max_context_tokens=args.max_context_tokens,
        max_sim_prompt_tokens=args.max_context_tokens,
        sim_whitelist=args.sim_whitelist,
        tool_schemas=args.tool_schemas,
    )


def _check(args: argparse.Namespace) -> str:
    """Refuse bad flags before any model loads or episode runs, naming the flag and its range."""
    from envace.errors import UserInputError

    _check_sampling(args)
    if args.store is not None:
        from envace.storage.uri import parse_uri

        parse_uri(args.store)  # an unsupported scheme fails now, not after the whole evaluation
    if args.n < 1:
        raise UserInputError(f"--n must be >= 1, got {args.n}")
    if args.limit is not None and args.limit < 1:
        raise UserInputError(f"--limit must be >= 1, got {args.limit}")
    if args.max_steps_per_turn < 1:
        raise UserInputError(f"--max-steps-per-turn must be >= 1, got {args.max_steps_per_turn}")
    kind: str = args.benchmark.split(":", 1)[0]
    if kind == "synthetic" and args.tasks is None:
        raise UserInputError("--benchmark synthetic needs --tasks FILE (a task JSONL file)")
    if kind not in ("synthetic", "bfcl") or (kind == "bfcl" and ":" not in args.benchmark):
        raise UserInputError(
            f"--benchmark {args.benchmark!r}: use synthetic or bfcl:CATEGORIES "
            "(e.g. bfcl:simple,multi_turn_base or bfcl:all)"
        )
    return kind


def _check_sampling(args: argparse.Namespace) -> None:
    """Token budgets and temperatures; a bad one would otherwise still report a score."""
    from envace.errors import UserInputError

    for flag, value in (
        ("--temperature", args.temperature),
        ("--rehearsal-temperature", args.rehearsal_temperature),
    ):
        if not (math.isfinite(value) and value >= 0):
            raise UserInputError(f"{flag} must be a finite number >= 0 (0: greedy), got {value}")
    for flag, count in (
        ("--max-new-tokens", args.max_new_tokens),
        ("--max-context-tokens", args.max_context_tokens),
        ("--rehearsal-memory-tokens", args.rehearsal_memory_tokens),
    ):
        if count < 1:
            raise UserInputError(f"{flag} must be >= 1, got {count}")
    if args.max_context_tokens <= args.max_new_tokens:
        raise UserInputError(
            f"--max-context-tokens ({args.max_context_tokens}) must be greater than "
            f"--max-new-tokens ({args.max_new_tokens}): the context holds the prompt and the reply"
        )


def _run(args: argparse.Namespace) -> int:
    kind = _check(args)
    rcfg = _rehearsal_config(args)
    report, outcome = _run_bfcl(args, rcfg) if kind == "bfcl" else _run_synthetic(args, rcfg)
    from envace.evaluate.benchmarks import write_report

    write_report(report, args.out, outcome)
    print(report.markdown())
    if args.store:
        from envace.storage.artifacts import commit_dir

        commit_dir(args.out, args.store)
        print(f"committed the report to {args.store}")
    paths = {"report": str(args.out / "report.json")}
    if kind == "synthetic":
        paths["metrics"] = str(args.out / "metrics.json")
    print(json.dumps(paths))
    return 0


def _run_synthetic(args: argparse.Namespace, rcfg: Any) -> tuple[Any, Any]:
    from envace.errors import UserInputError
    from envace.evaluate.benchmarks import run_synthetic, synthetic_report
    from envace.evaluate.report import print_and_write, trajectory_record
    from envace.tasks.io import atomic_write_text
    from envace.tasks.loader import load_tasks

    loaded = load_tasks(args.tasks, skip_invalid=args.skip_invalid)
    tasks, skipped = _runnable(loaded.tasks, args)
    tasks = tasks[: args.limit] if args.limit else tasks
    if not tasks:
        raise UserInputError(f"{args.tasks}: no valid task to evaluate")
    policy = _policy(args.policy, "synthetic", args.seed, rcfg)
    run = run_synthetic(
        policy,
        tasks,
        _rollout_config(args),
        probe_fidelity=not args.no_fidelity,
        n=args.n,
        rehearsal=rcfg,
        seed=args.seed,
        progress=True,
    )
    extra = {
        "policy": args.policy,
        "tasks": str(args.tasks),
        "skipped": len(loaded.skipped) + skipped,
    }
    print_and_write(run.baseline, args.out, extra)
    if run.rehearsed is not None:
        lines = "".join(json.dumps(trajectory_record(t)) + "\n" for t in run.rehearsed.trajectories)
        atomic_write_text(args.out / "rehearsal" / "trajectories.jsonl", lines)
    info = {"tasks": str(args.tasks), "episodes per task": args.n}
    return synthetic_report(run, tasks, args.policy, args.seed, info), run.outcome


def _runnable(tasks: list[Any], args: argparse.Namespace) -> tuple[list[Any], int]:
    """The tasks that can run in a world, and how many were left out. A task without an
    environment is valid (it trains in rehearsal mode) but has no world to be evaluated in:
    --skip-invalid leaves it out with a line on stderr; otherwise the run is refused up front."""
    import sys

    from envace.errors import UserInputError
    from envace.evaluate.runner import no_environment_message
    from envace.tasks.loader import show_text

    missing = [t.id for t in tasks if t.environment is None]
    if missing and not args.skip_invalid:
        raise UserInputError(f"{args.tasks}: {no_environment_message(missing)}")
    for task_id in missing:
        shown = show_text(task_id, quote=True)
        print(f"{args.tasks}: task {shown} names no environment; not evaluated", file=sys.stderr)
    return [t for t in tasks if t.environment is not None], len(missing)


def _run_bfcl(args: argparse.Namespace, rcfg: Any) -> tuple[Any, Any]:
    from envace.evaluate.benchmarks import bfcl_episode_record, bfcl_report, run_bfcl_benchmark
    from envace.evaluate.bfcl.adapter import load_bfcl_tasks, parse_categories
    from envace.evaluate.bfcl.client import BfclWorker
    from envace.tasks.io import atomic_write_text

    categories = parse_categories(args.benchmark.split(":", 1)[1])
    policy = _policy(args.policy, "bfcl", args.seed, rcfg)
    with BfclWorker() as worker:
        by_cat = load_bfcl_tasks(worker, categories, args.limit)
        tasks = [t for cat in categories for t in by_cat[cat]]
        run = run_bfcl_benchmark(
            policy,
            tasks,
            _rollout_config(args),
            worker,
            rehearsal=rcfg,
            seed=args.seed,
            progress=True,
        )
        version = worker.info.get("version")
    lines = "".join(json.dumps(bfcl_episode_record(e)) + "\n" for e in run.baseline)
    atomic_write_text(args.out / "episodes.jsonl", lines)
    if run.rehearsed is not None:
        lines = "".join(json.dumps(bfcl_episode_record(e)) + "\n" for e in run.rehearsed)
        atomic_write_text(args.out / "rehearsal" / "episodes.jsonl", lines)
    info = {
        "bfcl-eval": version,
        "categories": ", ".join(categories),
        "entries per category": args.limit or "all",
    }
    return bfcl_report(run, tasks, args.policy, args.seed, info), run.outcome
