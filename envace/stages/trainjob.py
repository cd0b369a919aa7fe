"""The train step as a Kubeflow Trainer TrainJob (`nodes` > 1): created once per output, followed
to its end with its status and logs, its committed checkpoint read back."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envace.config import Config
from envace.errors import UserInputError
from envace.run import (
    require_data_parallel,
)
from envace.stages.store import (
    TRAIN_METRICS,
    StageError,
    _is_remote,
    _local_copy,
    _scratch,
    config_text,
)

log = logging.getLogger(__name__)


TRAIN_STEP_COMMAND = ("torchrun", "--no-python", "envace", "pipeline", "train-step")


@dataclass(frozen=True)
class Trained:
    uri: str  # the next checkpoint
    metrics: dict[str, Any]  # loss, clip fractions, grad norm per learner (RLTrainer.update)


@dataclass(frozen=True)
class TrainJobLaunch:
    """Where the train step runs. `nodes` > 1: as a Kubeflow Trainer TrainJob on the `runtime`
    that charts/envace installs, `gpus_per_node` GPUs per node (None or 0: the runtime's
    resources), in `namespace` (default: the pod's, or the kubeconfig context's)."""

    nodes: int = 1
    gpus_per_node: int | None = None
    runtime: str = "envace"
    image: str | None = None
    namespace: str | None = None
    kubeconfig: str | None = None
    context: str | None = None
    poll_interval_s: float = 15.0
    timeout_s: float | None = None
    log_lines: int = 50  # last lines of each node's log shown when the job ends


# --- train as a TrainJob ----------------------------------------------------------------------
def train_step_job_name(out_uri: str) -> str:
    """The TrainJob of the step writing `out_uri`: the same name when a step is retried, so the
    retry follows the job instead of starting a second one."""
    return f"envace-step-{hashlib.sha256(out_uri.encode()).hexdigest()[:12]}"


def train_step_args(
    checkpoint_uri: str, trajectories_uri: str, out_uri: str, total_iterations: int
) -> list[str]:
    """Arguments of `envace pipeline train-step` after `--config FILE`."""
    return [
        "--checkpoint",
        checkpoint_uri,
        "--trajectories",
        trajectories_uri,
        "--out",
        out_uri,
        "--total-iterations",
        str(total_iterations),
    ]


def _create_or_follow_existing(
    client: Any, spec: Any, text: str, emit: Callable[[str], None]
) -> None:
    """Create the TrainJob and its config ConfigMap; a TrainJob of that name already there is
    this step's, from an earlier attempt of it: follow that one."""
    from kubernetes.client.exceptions import ApiException

    from envace.cluster.submit import ClusterError

    try:
        client.create(spec, text)
    except ClusterError as exc:
        if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 409:
            where = f"{client.namespace}/{spec.name}"
            emit(f"{where}: exists already (an earlier attempt of this step); following it")
            return
        raise


def _emit_node_logs(client: Any, name: str, lines: int, emit: Callable[[str], None]) -> None:
    """The last `lines` lines of each node's log (best effort: the job's outcome stands)."""
    from envace.cluster.submit import ClusterError, api_errors

    selector = f"jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name=node"
    try:
        with api_errors(f"reading the logs of TrainJob {name}", client.host):
            pods = client.core.list_namespaced_pod(
                client.namespace, label_selector=selector, _request_timeout=30
            )
            for pod in pods.items:
                text = client.core.read_namespaced_pod_log(
                    pod.metadata.name,
                    client.namespace,
                    container="node",
                    tail_lines=lines,
                    _request_timeout=30,
                )
                emit(f"--- {pod.metadata.name}: last {lines} log lines ---")
                for line in str(text).splitlines():
                    emit(line)
    except ClusterError as exc:
        log.warning("the node logs of TrainJob %s are not available: %s", name, exc)


def _read_trained(out_uri: str) -> Trained:
    with _scratch() as tmp:
        folder = _local_copy(out_uri, tmp / "ckpt")
        metrics = json.loads((folder / TRAIN_METRICS).read_text(encoding="utf-8"))
    return Trained(out_uri, metrics)


def _train_with_trainjob(
    cfg: Config,
    uris: tuple[str, str, str],
    horizon: int,
    launch: TrainJobLaunch,
    emit: Callable[[str], None],
) -> Trained:
    from envace.cluster.submit import TrainJobClient, connect, follow
    from envace.cluster.trainjob import JOB_CONFIG_PATH, TrainJobSpec

    out_uri = uris[2]
    require_data_parallel(cfg, "train with nodes > 1 (one process per GPU)")
    if not _is_remote(out_uri):
        raise UserInputError(
            f"train with nodes > 1 writes {out_uri} from TrainJob pods, which cannot reach a "
            "local folder: use a minio:// or s3:// store"
        )
    api_client, namespace = connect(launch.kubeconfig, launch.context)
    client = TrainJobClient(api_client, launch.namespace or namespace)
    spec = TrainJobSpec(
        name=train_step_job_name(out_uri),
        namespace=client.namespace,
        nodes=launch.nodes,
        gpus_per_node=launch.gpus_per_node or None,
        runtime=launch.runtime,
        image=launch.image,
        store=out_uri,
        command=TRAIN_STEP_COMMAND,
        args=("--config", JOB_CONFIG_PATH, *train_step_args(*uris, horizon)),
    )
    _create_or_follow_existing(client, spec, config_text(cfg), emit)
    state = follow(
        client, spec.name, interval=launch.poll_interval_s, emit=emit, timeout=launch.timeout_s
    )
    _emit_node_logs(client, spec.name, launch.log_lines, emit)
    if not state.succeeded:
        raise StageError(
            f"TrainJob {client.namespace}/{spec.name} {state.phase.lower()}: "
            f"{state.message or state.describe()}. Its node logs are above; more with "
            f"`envace cluster status {spec.name} -n {client.namespace}` and `kubectl logs`"
        )
    return _read_trained(out_uri)
