"""`envace run` (the whole method on one machine) and `envace train` (the training job)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["register"]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, help="YAML config (see configs/)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config value, e.g. --set train.iterations=5 (repeatable)",
    )
    p.add_argument(
        "--store",
        default=None,
        help=(
            "artifact store URI (a folder, minio://bucket/prefix or s3://...);"
            " default: the output folder (run: --out, train: --work-dir)"
        ),
    )
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in the output folder from its newest complete checkpoint"
        " (none yet: start fresh)",
    )
    again.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a run already in the output folder (its reports and checkpoints,"
        " also in --store, are deleted once the inputs check out)",
    )


def register(sub: Any) -> None:
    run = sub.add_parser(
        "run",
        help="the whole method on CPU: tasks, warm start, RL with world rehearsal, evaluation",
        description="Generate tasks, warm-start both roles, train with world rehearsal "
        "(role-wise GRPO), and evaluate untrained / warm start / after RL on held-out tasks in "
        "the real worlds.",
    )
    _common(run)
    run.add_argument("--out", type=Path, default=Path("runs/local"), help="output folder")
    run.set_defaults(func=_run)
    train = sub.add_parser(
        "train",
        help="the training job (warm start + RL) as run by a Kubeflow TrainJob / pipeline step",
        description="Same stages as `envace run`, keyed by --run-name in the store; under torchrun "
        "only rank 0 writes reports.",
    )
    _common(train)
    train.add_argument("--run-name", default="envace", help="folder of this run in the store")
    train.add_argument(
        "--work-dir", type=Path, default=None, help="local scratch (default: ./runs/NAME)"
    )
    train.set_defaults(func=_train)


def _run(args: argparse.Namespace) -> int:
    from envace.config import load_config
    from envace.run import leave_job, run_main

    cfg = load_config(args.config, args.overrides)
    run_main(cfg, args.out, store=args.store, resume=args.resume, overwrite=args.overwrite)
    leave_job(cfg)
    return 0


def _train(args: argparse.Namespace) -> int:
    from envace.cluster.trainjob import check_run_name
    from envace.config import load_config
    from envace.run import leave_job, run_main
    from envace.storage.uri import join_uri

    check_run_name(args.run_name, "--run-name")  # one plain store key: it names a folder too
    cfg = load_config(args.config, args.overrides)
    work = args.work_dir or Path("runs") / args.run_name
    store = join_uri(args.store, args.run_name) if args.store else None
    resume = args.resume or _restarted()
    # refuses torch with WORLD_SIZE > 1
    run_main(cfg, work, store=store, resume=resume, overwrite=args.overwrite)
    leave_job(cfg)
    return 0


# The TrainingRuntime sets it from the pod's `jobset.sigs.k8s.io/restart-attempt` label: JobSet
# recreates a failed job's pods (up to the TrainJob's maxRestarts) with that count raised.
RESTART_ATTEMPT_ENV = "ENVACE_RESTART_ATTEMPT"


def _restarted() -> bool:
    """Whether this process is a restart of the job (restart attempt >= 1): then the run
    continues from the newest complete checkpoint in the store, with no user action (the first
    attempt refuses a run name that already holds a run unless --resume is given)."""
    import logging
    import os

    raw = os.environ.get(RESTART_ATTEMPT_ENV, "").strip()
    attempt = int(raw) if raw.isdigit() else 0
    if attempt:
        logging.getLogger(__name__).info(
            "restart attempt %d of this job: resuming from the newest complete checkpoint", attempt
        )
    return attempt > 0
