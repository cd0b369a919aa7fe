"""`envace pipeline ...`: the Kubeflow Pipelines v2 pipeline (this package), compiled, submitted
or run locally, and the train step a TrainJob runs.

    envace pipeline compile --out pipelines/envace_pipeline.yaml [--rounds N --gpus N ...]
    envace pipeline submit --host URL --experiment NAME [--param KEY=VALUE ...]   (submit.py)
    envace pipeline run-local --store URI [--config F --set KEY=VALUE ...]        (local.py)
    envace pipeline train-step --config F --checkpoint URI --trajectories URI --out URI

kfp and the stage code are imported inside the handlers, so `envace --help` stays fast and works
without the `pipelines` extra.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace.errors import UserInputError
from pipelines.local import LocalRun, _run_local, run_local
from pipelines.submit import (
    DEFAULT_PACKAGE,
    _submit,
    check_store,
    check_store_endpoint,
)

if TYPE_CHECKING:
    from pipelines.pipeline import PipelineOptions

__all__ = [
    "DEFAULT_PACKAGE",
    "LocalRun",
    "compile_pipeline",
    "pipeline_options",
    "register",
    "run_local",
]

# kfp's memory pattern, less the suffix K, which Kubernetes does not accept (it wants k).
_KFP_MEMORY = re.compile(r"^[0-9]+(Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")


# --- shared arguments -------------------------------------------------------------------------
def _config_args(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--config", type=Path, default=None, help=f"YAML config ({what})")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config value, e.g. --set train.lr=1e-5 (repeatable)",
    )


def _pipeline_args(parser: argparse.ArgumentParser) -> None:
    from pipelines.components import DEFAULT_IMAGE

    parser.add_argument(
        "--rounds", type=int, default=2, help="rollout -> train rounds, unrolled (default: 2)"
    )
    parser.add_argument(
        "--image",
        default=DEFAULT_IMAGE,
        help=f"default of the `image` run parameter (default: {DEFAULT_IMAGE})",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="GPUs of each model step (warm start, rollout, train, evaluate); 0: CPU (default)",
    )
    parser.add_argument("--cpu", default="2", help="CPUs of each model step (default: 2)")
    parser.add_argument("--memory", default="8Gi", help="memory of each model step (default: 8Gi)")
    parser.add_argument(
        "--gpu-node-selector",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="node label the model steps require, e.g. pool=gpu (repeatable)",
    )
    parser.add_argument(
        "--gpu-toleration",
        action="append",
        default=None,
        metavar="KEY[=VALUE][:EFFECT]",
        help="taint the model steps tolerate (repeatable); default with --gpus > 0: "
        "nvidia.com/gpu:NoSchedule",
    )
    parser.add_argument(
        "--shm-size", default="2Gi", help="memory-backed /dev/shm of model steps (default: 2Gi)"
    )
    parser.add_argument(
        "--secret",
        default="envace-store",
        help="Secret with the store credentials, keys access-key / secret-key "
        "(default: envace-store, what charts/envace creates)",
    )
    parser.add_argument(
        "--tracking-secret",
        default="envace-tracking",
        help="Secret with MLflow / W&B credentials, mounted optionally in every step: keys "
        "named as the variables (MLFLOW_TRACKING_URI, MLFLOW_TRACKING_USERNAME, "
        "MLFLOW_TRACKING_PASSWORD, MLFLOW_TRACKING_TOKEN, WANDB_API_KEY, WANDB_BASE_URL); "
        "a run without that Secret tracks nothing (default: envace-tracking; '' mounts none)",
    )
    parser.add_argument(
        "--store",
        default=None,
        help="default of the `store` run parameter (default: minio://envace/runs)",
    )
    parser.add_argument(
        "--store-endpoint",
        default=None,
        help="default of the `store_endpoint` run parameter (default: http://envace-minio:9000)",
    )
    _config_args(parser, "default of the `config` run parameter; default: the built-in defaults")


def _check_kfp_memory(value: str, flag: str) -> str:
    """A memory quantity kfp also accepts: it takes whole numbers only, and K but not k."""
    from envace.cluster.trainjob import check_memory_quantity

    check_memory_quantity(value, flag)
    if not _KFP_MEMORY.fullmatch(value):
        raise UserInputError(
            f"{flag} {value!r}: pipeline steps take a whole number with an optional suffix"
            f" Ki, M, Mi, G, Gi, ..., e.g. {flag} 1536Mi rather than 1.5Gi"
        )
    return value


def pipeline_options(args: argparse.Namespace) -> PipelineOptions:
    """`PipelineOptions` from the compile flags."""
    from envace.cluster.trainjob import (
        check_cpu_quantity,
        check_memory_quantity,
        parse_key_value,
        parse_toleration,
    )
    from envace.config import load_config
    from envace.stages import config_struct
    from pipelines.pipeline import DEFAULT_STORE, DEFAULT_STORE_ENDPOINT, PipelineOptions

    if args.rounds < 0:
        raise UserInputError(f"--rounds {args.rounds}: must be 0 or more")
    if args.gpus < 0:
        raise UserInputError(f"--gpus {args.gpus}: must be 0 or more (0: CPU steps)")
    if args.store is not None:
        check_store(args.store, f"--store {args.store!r}")
    if args.store_endpoint is not None:
        check_store_endpoint(args.store_endpoint, "--store-endpoint")
    check_cpu_quantity(args.cpu, "--cpu")
    _check_kfp_memory(args.memory, "--memory")
    check_memory_quantity(args.shm_size, "--shm-size")
    tolerations = None
    if args.gpu_toleration is not None:
        tolerations = tuple(parse_toleration(t) for t in args.gpu_toleration)
    return PipelineOptions(
        config=config_struct(load_config(args.config, args.overrides)),
        rounds=args.rounds,
        image=args.image,
        gpus=args.gpus,
        cpu=args.cpu,
        memory=args.memory,
        gpu_node_selector=dict(
            parse_key_value(s, "--gpu-node-selector") for s in args.gpu_node_selector
        ),
        gpu_tolerations=tolerations,
        shm_size=args.shm_size,
        secret=args.secret,
        tracking_secret=args.tracking_secret,
        store=args.store or DEFAULT_STORE,
        store_endpoint=args.store_endpoint or DEFAULT_STORE_ENDPOINT,
    )


# --- compile ----------------------------------------------------------------------------------
def check_out_path(out: Path) -> None:
    """Refuse an output path kfp cannot write, before anything is compiled: kfp's own errors
    are a bare ValueError (the suffix) or an OSError naming a temporary detail."""
    if out.suffix not in (".yaml", ".yml"):
        raise UserInputError(
            f"--out {out}: the compiled pipeline is YAML; give a file path ending in .yaml,"
            f" e.g. --out {DEFAULT_PACKAGE}"
        )
    if out.is_dir():
        raise UserInputError(f"--out {out}: is a folder; give a file path ending in .yaml")
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # compile creates the missing folders below this one
    if not folder.is_dir():
        raise UserInputError(f"--out {out}: {folder} is a file, not a folder; choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserInputError(f"--out {out}: cannot write in {folder}; choose a writable folder")


def compile_pipeline(options: PipelineOptions, out: Path) -> Path:
    """Write the pipeline for `options` as KFP IR YAML to `out`.

    kfp streams the YAML into the file it is given, so it writes a scratch copy and `out` is
    replaced atomically: a failure never leaves a half-written pipeline where one was.
    """
    from kfp import compiler

    from envace.tasks.io import atomic_write_text
    from pipelines.pipeline import build_pipeline

    check_out_path(out)
    with tempfile.TemporaryDirectory(prefix="envace-pipeline-") as scratch:
        staged = Path(scratch) / "pipeline.yaml"
        compiler.Compiler().compile(build_pipeline(options), str(staged))
        text = staged.read_text(encoding="utf-8")
    atomic_write_text(out, _stable_header(text))
    return out


_HEADER_DEFAULT = re.compile(r"^(#    (\w+): (?:list|dict) \[Default: ).*\]$")


def _stable_header(text: str) -> str:
    """kfp's comment header prints list and dict defaults in protobuf map order, which changes
    from one process to the next; print them as sorted JSON so a compile is reproducible (the
    spec below is written with sorted keys already)."""
    import yaml

    spec = next(yaml.safe_load_all(text))
    params = spec["root"].get("inputDefinitions", {}).get("parameters", {})
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line.startswith("#"):
            break
        if (match := _HEADER_DEFAULT.match(line)) and match[2] in params:
            default = params[match[2]].get("defaultValue")
            lines[i] = f"{match[1]}{json.dumps(default, sort_keys=True)}]"
    return "\n".join(lines)


def _compile(args: argparse.Namespace) -> int:
    check_out_path(args.out)  # before the config is loaded: a typo here fails at once
    out = compile_pipeline(pipeline_options(args), args.out)
    print(f"wrote {out} ({args.rounds} round(s)); upload it in the Kubeflow Pipelines UI")
    return 0


# --- train-step -------------------------------------------------------------------------------
def _train_step(args: argparse.Namespace) -> int:
    from envace.config import load_config
    from envace.stages import train

    if args.total_iterations is not None and args.total_iterations < 1:
        raise UserInputError(
            f"--total-iterations {args.total_iterations}: must be 1 or more (the RL iterations "
            "the lr schedule spans: the pipeline's rounds)"
        )
    cfg = load_config(args.config, args.overrides)
    trained = train(
        cfg,
        args.checkpoint,
        args.trajectories,
        args.out,
        total_iterations=args.total_iterations,
    )
    from envace.run import leave_job

    leave_job(cfg)
    print(f"committed {trained.uri}")
    return 0


# --- wiring -----------------------------------------------------------------------------------
def _add_compile(sub: Any) -> None:
    parser = sub.add_parser(
        "compile",
        help="write the Kubeflow pipeline as IR YAML (upload it in the KFP UI)",
        description="Compile prepare -> warm start -> (rollout -> train) x rounds -> evaluate to "
        "KFP v2 IR YAML. Resources, GPU placement, /dev/shm and the credentials Secret are fixed "
        "here; config, store, image and TrainJob settings stay run parameters.",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_PACKAGE,
        help=f"output file (default: {DEFAULT_PACKAGE})",
    )
    _pipeline_args(parser)
    parser.set_defaults(func=_compile)


def _add_submit(sub: Any) -> None:
    parser = sub.add_parser(
        "submit",
        help="start a run of the compiled pipeline on Kubeflow Pipelines (kfp.Client)",
        description="Start a run of a compiled pipeline. --config/--set replace the `config` "
        "parameter; --param sets any run parameter.",
    )
    parser.add_argument(
        "--host", required=True, help="KFP API endpoint, e.g. http://localhost:8080"
    )
    parser.add_argument("--experiment", default="envace", help="experiment (default: envace)")
    parser.add_argument("--run-name", default=None, help="run name shown in the UI")
    parser.add_argument(
        "--package",
        type=Path,
        default=None,
        help="compiled pipeline (default: the envace_pipeline.yaml installed with envace)",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run parameter, e.g. store=minio://envace/runs or train_nodes=2 (repeatable)",
    )
    parser.add_argument("--namespace", default=None, help="KFP namespace (multi-user installs)")
    parser.add_argument(
        "--service-account",
        default=None,
        help="service account of the run's pods (needs the RBAC charts/envace grants)",
    )
    parser.add_argument("--no-cache", action="store_true", help="disable caching for this run")
    _config_args(parser, "replaces the `config` parameter")
    parser.set_defaults(func=_submit)


def _add_run_local(sub: Any) -> None:
    parser = sub.add_parser(
        "run-local",
        help="run the whole pipeline here with KFP's local runner (CPU, no cluster)",
        description="Run every component as a local subprocess (kfp.local SubprocessRunner); the "
        "components read and write the store themselves. minio:// and s3:// stores take their "
        "endpoint and credentials from ENVACE_S3_*.",
    )
    parser.add_argument(
        "--store", required=True, help="artifact store: a folder, minio://bucket/prefix or s3://"
    )
    parser.add_argument(
        "--pipeline-root",
        type=Path,
        default=Path("runs") / "kfp-local",
        help="folder for KFP's own outputs (default: runs/kfp-local)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rollout -> train rounds")
    _config_args(parser, "default: the built-in defaults")
    parser.set_defaults(func=_run_local)


def _add_train_step(sub: Any) -> None:
    parser = sub.add_parser(
        "train-step",
        help="one pipeline train step (what a TrainJob runs when train_nodes > 1)",
        description="PPO update on a rollout's rows from the checkpoint that sampled them; "
        "commits the next checkpoint.",
    )
    _config_args(parser, "the run's config")
    parser.add_argument("--checkpoint", required=True, help="URI of the current checkpoint")
    parser.add_argument("--trajectories", required=True, help="URI of the rollout's rows")
    parser.add_argument("--out", required=True, help="URI of the next checkpoint")
    parser.add_argument(
        "--total-iterations",
        type=int,
        default=None,
        help="iterations the lr schedule spans (default: train.iterations)",
    )
    parser.set_defaults(func=_train_step)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pipeline",
        help="the Kubeflow Pipelines v2 pipeline: compile, submit, run-local",
        description="prepare -> warm start -> (rollout -> train) x rounds -> evaluate on Kubeflow "
        "Pipelines v2 (see docs/pipeline.md).",
    )
    sub = parser.add_subparsers(dest="pipeline_command", metavar="COMMAND", required=True)
    _add_compile(sub)
    _add_submit(sub)
    _add_run_local(sub)
    _add_train_step(sub)
