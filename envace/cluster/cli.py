"""`envace cluster ...`: submit, follow and cancel training runs as Kubeflow Trainer TrainJobs.

    envace cluster submit --config configs/gpu-1.yaml --nodes 2 --gpus-per-node 8
    envace cluster status NAME [--follow]
    envace cluster cancel NAME
    envace cluster check

The Kubernetes client is imported inside the handlers, so `envace --help` stays fast and works
without the `cluster` extra.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from envace.cluster.trainjob import (
    DEFAULT_RUNTIME,
    DEFAULT_STORE,
    TrainJobSpec,
    build_config_map,
    build_trainjob,
    check_run_name,
    default_job_name,
    parse_key_value,
    parse_toleration,
)
from envace.config import config_sections
from envace.errors import UserInputError

__all__ = ["register"]

_INTERRUPTED = 130
# time.sleep refuses much more than this (about 292 years in nanoseconds); a day is plenty.
_MAX_POLL_INTERVAL = 86400.0
# Indirection so tests can interrupt the follow loop (Ctrl-C arrives while it sleeps).
_sleep = time.sleep


def _connection_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("cluster connection")
    group.add_argument(
        "--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)"
    )
    group.add_argument("--context", help="kubeconfig context (default: the current one)")
    group.add_argument(
        "-n", "--namespace", help="namespace (default: the context's, or the pod's in a cluster)"
    )


def _runtime_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runtime",
        default=DEFAULT_RUNTIME,
        help=f"training runtime name (default: {DEFAULT_RUNTIME})",
    )
    parser.add_argument(
        "--cluster-runtime",
        action="store_true",
        help="the runtime is a ClusterTrainingRuntime (default: a namespaced TrainingRuntime)",
    )


def _follow_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds between polls (default: 10)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="give up following after S seconds (submit: and cancel the job)",
    )


def _add_submit(sub: Any) -> None:
    parser = sub.add_parser(
        "submit",
        help="create a TrainJob that runs `envace train`, follow it, cancel it on Ctrl-C",
        description="Create the TrainJob k8s/ describes (torchrun -> envace train on the EnvACE "
        "runtime), with the training config uploaded as a ConfigMap; follow its status and "
        "progress until it finishes. Ctrl-C (or --timeout) deletes the TrainJob.",
    )
    parser.add_argument(
        "--config", required=True, type=Path, help="training config YAML (local file)"
    )
    parser.add_argument("--nodes", type=int, default=1, help="training nodes (pods) (default: 1)")
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        metavar="G",
        help="GPUs per node (default: the runtime's resources)",
    )
    parser.add_argument(
        "--procs-per-node",
        type=int,
        metavar="P",
        help="processes per node (default: G, or 1 without GPUs)",
    )
    parser.add_argument("--cpu", help="CPU per node, e.g. 16 (default: the runtime's resources)")
    parser.add_argument(
        "--memory", help="memory per node, e.g. 128Gi (default: the runtime's resources)"
    )
    parser.add_argument("--name", help="TrainJob name (default: envace-train-<UTC timestamp>)")
    parser.add_argument("--image", help="container image (default: the runtime's image)")
    parser.add_argument(
        "--store", default=DEFAULT_STORE, help=f"store URI for runs (default: {DEFAULT_STORE})"
    )
    parser.add_argument(
        "--run-name",
        help="run folder under --store, one plain name such as exp1 (default: the job name)",
    )
    parser.add_argument(
        "--resume", action="store_true", help="resume the run from its last checkpoint"
    )
    parser.add_argument(
        "--node-selector",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="pod node selector (repeatable)",
    )
    parser.add_argument(
        "--toleration",
        action="append",
        default=[],
        metavar="KEY[=VALUE][:EFFECT]",
        help="pod toleration, e.g. nvidia.com/gpu:NoSchedule (repeatable)",
    )
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="training environment variable (repeatable)",
    )
    parser.add_argument(
        "--queue",
        metavar="LOCALQUEUE",
        help="Kueue LocalQueue that admits the job (the kueue.x-k8s.io/queue-name label; needs"
        " Kueue's TrainJob integration); default: none, the job starts at once",
    )
    parser.add_argument("--detach", action="store_true", help="return once created; do not follow")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the TrainJob and ConfigMap YAML; contact no cluster (namespace: -n, else the "
        "kubeconfig context's, else default)",
    )
    _runtime_args(parser)
    _follow_args(parser)
    _connection_args(parser)
    parser.set_defaults(func=_submit)


def _add_status(sub: Any) -> None:
    parser = sub.add_parser("status", help="show (or follow) a TrainJob's status and progress")
    parser.add_argument("name", help="TrainJob name")
    parser.add_argument("--follow", action="store_true", help="poll until the job finishes")
    _follow_args(parser)
    _connection_args(parser)
    parser.set_defaults(func=_status)


def _add_cancel(sub: Any) -> None:
    parser = sub.add_parser("cancel", help="delete a TrainJob (its pods and config go with it)")
    parser.add_argument("name", help="TrainJob name")
    _connection_args(parser)
    parser.set_defaults(func=_cancel)


def _add_check(sub: Any) -> None:
    parser = sub.add_parser(
        "check",
        help="check the prerequisites: Kubeflow Trainer, JobSet, the EnvACE runtime, KFP, GPUs",
    )
    _runtime_args(parser)
    parser.add_argument(
        "--kfp-namespace",
        default="kubeflow",
        help="namespace of Kubeflow Pipelines' API server, whose version is checked (default: "
        "%(default)s)",
    )
    _connection_args(parser)
    parser.set_defaults(func=_check)


def register(subparsers: Any) -> None:
    """Add `envace cluster` and its actions."""
    parser = subparsers.add_parser(
        "cluster",
        help="train on Kubernetes (Kubeflow Trainer TrainJobs): submit, status, cancel, check",
    )
    sub = parser.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    _add_submit(sub)
    _add_status(sub)
    _add_cancel(sub)
    _add_check(sub)


def _read_config(path: Path) -> str:
    try:
        text = path.read_text()
    except OSError as exc:
        raise UserInputError(f"--config {path}: cannot read it ({exc.strerror})") from exc
    config_sections(text, f"--config {path}")  # a ConfigError (exit 2) names what is wrong
    return text


def _spec_from_args(args: argparse.Namespace, namespace: str) -> TrainJobSpec:
    return TrainJobSpec(
        name=args.name or default_job_name(),
        namespace=namespace,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        procs_per_node=args.procs_per_node,
        cpu=args.cpu,
        memory=args.memory,
        runtime=args.runtime,
        runtime_kind="ClusterTrainingRuntime" if args.cluster_runtime else "TrainingRuntime",
        image=args.image,
        store=args.store,
        run_name=args.run_name,
        resume=args.resume,
        node_selector=dict(parse_key_value(item, "--node-selector") for item in args.node_selector),
        tolerations=tuple(parse_toleration(item) for item in args.toleration),
        env=dict(parse_key_value(item, "--env") for item in args.env),
        queue=args.queue,
    )


def _check_follow_args(args: argparse.Namespace) -> None:
    """Refuse a --poll-interval / --timeout that is not a positive, finite number of seconds.

    Checked before anything is created: a negative interval made the follow loop crash after the
    TrainJob existed (leaving it running), 0 polled the API server without a pause, and a timeout
    of 0 or less deleted the job the moment it was created.
    """
    interval = args.poll_interval
    if not (math.isfinite(interval) and 0 < interval <= _MAX_POLL_INTERVAL):
        raise UserInputError(
            f"--poll-interval must be a number of seconds above 0 and at most "
            f"{_MAX_POLL_INTERVAL:g}, got {interval:g}; e.g. --poll-interval 10"
        )
    timeout = args.timeout
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise UserInputError(
            f"--timeout must be a number of seconds above 0, got {timeout:g}; "
            "e.g. --timeout 3600, or leave it out to follow until the job finishes"
        )


def _require_kubernetes() -> None:
    try:
        import kubernetes  # noqa: F401
    except ModuleNotFoundError as exc:
        raise UserInputError(
            "`envace cluster` needs the Kubernetes client: pip install 'envace[cluster]'"
        ) from exc


def _client(args: argparse.Namespace) -> Any:
    _require_kubernetes()
    from envace.cluster.submit import TrainJobClient, connect

    api_client, context_namespace = connect(args.kubeconfig, args.context)
    return TrainJobClient(api_client, args.namespace or context_namespace)


def _follow_job(client: Any, name: str, args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException

    from envace.cluster import submit

    try:
        state = submit.follow(
            client,
            name,
            interval=args.poll_interval,
            emit=print,
            timeout=args.timeout,
            sleep=_sleep,
        )
    except submit.FollowTimeoutError:
        raise
    except submit.ClusterError as exc:
        cause = exc.__cause__
        if isinstance(cause, ApiException) and cause.status == 404:
            raise  # the job is gone: there is nothing left running to point at
        # Following failed, not the job: it keeps running on the cluster.
        raise submit.ClusterError(
            f"{exc}. The TrainJob may still be running: check it with `envace cluster status "
            f"{name} -n {client.namespace}` (add --follow to keep following) or stop it with "
            f"`envace cluster cancel {name} -n {client.namespace}`"
        ) from exc
    if not state.succeeded:
        print(
            f"envace: TrainJob {client.namespace}/{name} failed: {state.message or state.phase}",
            file=sys.stderr,
        )
    return 0 if state.succeeded else 1


def _dry_run_namespace(args: argparse.Namespace) -> tuple[str, str]:
    """The namespace a real submit would use (-n, else the kubeconfig context's), and its source.

    A dry run contacts no cluster but reads the kubeconfig when it can, so the printed manifest
    names the namespace `submit` would create it in; without one it assumes `default` and says so.
    """
    if args.namespace:
        return args.namespace, "-n"
    try:
        from envace.cluster.submit import ClusterError, context_namespace
    except ModuleNotFoundError:
        return "default", "no kubeconfig context: the Kubernetes client is not installed"
    try:
        return context_namespace(args.kubeconfig, args.context)
    except ClusterError:
        return "default", "no kubeconfig context could be loaded"


def _dry_run(args: argparse.Namespace, config_text: str) -> int:
    namespace, source = _dry_run_namespace(args)
    spec = _spec_from_args(args, namespace)
    if spec.gpus_per_node and (spec.cpu is None or spec.memory is None):
        # A real submit takes them from the runtime; a dry run reads no cluster.
        raise UserInputError(
            f"--gpus-per-node {spec.gpus_per_node} replaces the runtime's resources: a dry run "
            "reads no runtime to take CPU and memory from, so give --cpu and --memory too"
        )
    if not args.namespace:
        print(
            f"envace: dry run for namespace {namespace} ({source}); -n NAMESPACE picks another",
            file=sys.stderr,
        )
    print(
        yaml.safe_dump_all(
            [build_trainjob(spec), build_config_map(spec, config_text)], sort_keys=False
        ),
        end="",
    )
    return 0


def _submit(args: argparse.Namespace) -> int:
    _check_follow_args(args)
    if args.run_name is not None:
        check_run_name(args.run_name, "--run-name")
    config_text = _read_config(args.config)
    if args.dry_run:
        return _dry_run(args, config_text)
    _require_kubernetes()
    from envace.cluster.submit import ClusterError, FollowTimeoutError

    try:
        client = _client(args)
        spec = _spec_from_args(args, client.namespace)
        client.preflight(spec.runtime, spec.runtime_kind)
        client.create(spec, config_text)
    except ClusterError as exc:
        print(f"envace: error: {exc}", file=sys.stderr)
        return 1
    print(
        f"created TrainJob {spec.namespace}/{spec.name}: {spec.nodes} node(s) x "
        f"{spec.processes_per_node} process(es), runtime {spec.runtime}, "
        f"run {spec.run_name or spec.name}"
    )
    if args.detach:
        print(f"follow: envace cluster status {spec.name} -n {spec.namespace} --follow")
        return 0
    try:
        return _follow_job(client, spec.name, args)
    except KeyboardInterrupt:
        client.delete(spec.name)
        print(f"cancelled: deleted TrainJob {spec.namespace}/{spec.name}", file=sys.stderr)
        return _INTERRUPTED
    except FollowTimeoutError as exc:
        client.delete(spec.name)
        print(f"envace: error: {exc}; deleted the TrainJob", file=sys.stderr)
        return 1
    except ClusterError as exc:
        print(f"envace: error: {exc}", file=sys.stderr)
        return 1


def _status(args: argparse.Namespace) -> int:
    _check_follow_args(args)
    _require_kubernetes()
    from envace.cluster.submit import ClusterError, TrainJobState

    try:
        client = _client(args)
        if args.follow:
            return _follow_job(client, args.name, args)
        state = TrainJobState.from_object(client.get(args.name))
    except ClusterError as exc:
        print(f"envace: error: {exc}", file=sys.stderr)
        return 1
    print(f"{client.namespace}/{args.name}: {state.describe()}")
    return 0


def _cancel(args: argparse.Namespace) -> int:
    _require_kubernetes()
    from envace.cluster.submit import ClusterError

    try:
        client = _client(args)
        client.delete(args.name)
    except ClusterError as exc:
        print(f"envace: error: {exc}", file=sys.stderr)
        return 1
    print(f"cancelled: deleted TrainJob {client.namespace}/{args.name}")
    return 0


def _check(args: argparse.Namespace) -> int:
    _require_kubernetes()
    from envace.cluster.prerequisites import check_cluster, format_checks
    from envace.cluster.submit import ClusterError, connect

    try:
        api_client, context_namespace = connect(args.kubeconfig, args.context)
        namespace = args.namespace or context_namespace
        kind = "ClusterTrainingRuntime" if args.cluster_runtime else "TrainingRuntime"
        checks = check_cluster(api_client, namespace, args.runtime, kind, args.kfp_namespace)
    except ClusterError as exc:
        print(f"envace: error: {exc}", file=sys.stderr)
        return 1
    print(format_checks(checks))
    return 0 if all(check.ok for check in checks if check.required) else 1
