"""`envace evaluate`: committed execution of a policy on held-out tasks in the real worlds."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "evaluate",
        help="run a policy on tasks in the real worlds and report success and fidelity",
        description="Committed execution of a policy (oracle | random | checkpoint) on tasks in "
        "their executable worlds. Prints a table and writes OUT/metrics.json and trajectories.",
    )
    p.add_argument("--policy", required=True, help="oracle | random | checkpoint dir | hub id")
    p.add_argument("--tasks", required=True, type=Path, help="task JSONL file (held-out split)")
    p.add_argument("--out", required=True, type=Path, help="output directory")
    p.add_argument("--n", type=int, default=1, help="episodes per task (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (0: greedy, default)"
    )
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--max-context-tokens", type=int, default=4096)
    p.add_argument("--no-fidelity", action="store_true", help="skip the rehearsal-fidelity probes")
    p.add_argument("--skip-invalid", action="store_true", help="skip malformed tasks (reported)")
    p.add_argument(
        "--store", default=None, help="also commit the report folder to this artifact store URI"
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from envace.errors import UserInputError
    from envace.evaluate.report import print_and_write
    from envace.evaluate.runner import evaluate_policy
    from envace.policy.types import SamplingParams
    from envace.rollout.engine import RolloutConfig
    from envace.rollout.factory import build_policy
    from envace.tasks.loader import load_tasks

    if args.n < 1:
        raise UserInputError(f"--n must be >= 1, got {args.n}")
    loaded = load_tasks(args.tasks, skip_invalid=args.skip_invalid)
    if not loaded.tasks:
        raise UserInputError(f"{args.tasks}: no valid task to evaluate")
    policy = build_policy(args.policy, seed=args.seed)
    sampling = SamplingParams(args.max_new_tokens, args.temperature, seed=args.seed)
    cfg = RolloutConfig(
        caller_sampling=sampling,
        simulator_sampling=sampling,
        max_context_tokens=args.max_context_tokens,
        max_sim_prompt_tokens=args.max_context_tokens,
    )
    result = evaluate_policy(
        policy, loaded.tasks, cfg, probe_fidelity=not args.no_fidelity, n=args.n, progress=True
    )
    extra = {"policy": args.policy, "tasks": str(args.tasks), "skipped": len(loaded.skipped)}
    print_and_write(result, args.out, extra)
    if args.store:
        from envace.storage.artifacts import commit_dir

        commit_dir(args.out, args.store)
        print(f"committed the report to {args.store}")
    print(json.dumps({"metrics": str(args.out / "metrics.json")}))
    return 0
