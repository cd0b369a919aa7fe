"""Build the Kubeflow Trainer `TrainJob` that runs `envace train`, as a plain dict.

The object is the one `kubectl apply -k k8s/overlays/...` creates, built from flags instead of a
kustomize overlay: `torchrun --no-python envace train ...` on the `envace` training runtime that
charts/envace installs (image, store credentials, /dev/shm, GPU pool). Kubeflow Trainer injects
PET_NNODES / PET_NPROC_PER_NODE / PET_NODE_RANK / PET_MASTER_ADDR / PET_MASTER_PORT, which torchrun
reads as its arguments, so the command carries no rendezvous flags.

The training config travels in a ConfigMap owned by the TrainJob (deleted with it), mounted
through a runtime patch at `JOB_CONFIG_PATH`. Pure functions, no Kubernetes client: the dicts are
what the API server receives and what the tests validate against the CRD schema.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from envace.errors import UserInputError

__all__ = [
    "API_VERSION",
    "DEFAULT_RUNTIME",
    "DEFAULT_STORE",
    "GPU_RESOURCE",
    "GROUP",
    "JOB_CONFIG_DIR",
    "JOB_CONFIG_PATH",
    "MAX_NAME_LENGTH",
    "PATCH_MANAGER",
    "PLURAL",
    "VERSION",
    "Toleration",
    "TrainJobSpec",
    "build_config_map",
    "build_trainjob",
    "check_cpu_quantity",
    "check_memory_quantity",
    "check_run_name",
    "config_map_name",
    "default_job_name",
    "parse_key_value",
    "parse_toleration",
    "runtime_node_resources",
    "validate_job_name",
    "with_runtime_resources",
]

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "trainjobs"
DEFAULT_RUNTIME = "envace"
DEFAULT_STORE = "minio://envace/runs"
GPU_RESOURCE = "nvidia.com/gpu"
PATCH_MANAGER = "envace.dev/cli"
JOB_CONFIG_DIR = "/etc/envace-job"
JOB_CONFIG_PATH = f"{JOB_CONFIG_DIR}/config.yaml"
CONFIG_KEY = "config.yaml"
_CONFIG_VOLUME = "envace-job-config"
# JobSet names pods `<trainjob>-node-<job>-<pod>-<5 chars>`, and a pod's hostname must stay a
# 63-character DNS label: a TrainJob name longer than this breaks rendezvous by hostname.
MAX_NAME_LENGTH = 40
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
# Kubernetes quantities (resource.Quantity) as people write them: a plain or decimal number with
# an optional suffix. CPU: cores or millicores (500m). Memory: bytes with a decimal (k, M, G, ...)
# or binary (Ki, Mi, Gi, ...) suffix; not m, which means milli-bytes there (a typo for Mi).
_CPU_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?m?$")
_MEMORY_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
# A run name is one folder of the store (and of the local `runs/` work dir): a file name's limit.
_MAX_RUN_NAME_BYTES = 255
_LABELS = {"app.kubernetes.io/part-of": "envace", "app.kubernetes.io/component": "train"}
# The label Kueue's TrainJob integration reads: the LocalQueue that admits the job.
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
_QUEUE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a DNS label: a LocalQueue's name


@dataclass(frozen=True)
class Toleration:
    """A pod toleration. `value=None` tolerates the key with any value (operator Exists)."""

    key: str
    effect: str
    value: str | None = None

    def to_dict(self) -> dict[str, str]:
        if self.value is None:
            return {"key": self.key, "operator": "Exists", "effect": self.effect}
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}


@dataclass(frozen=True)
class TrainJobSpec:
    """What `envace cluster submit` launches.

    nodes x procs_per_node processes join one torch.distributed world. `gpus_per_node`,
    `cpu` and `memory`, when any is set, replace the runtime's per-node resources; left unset, the
    runtime's (the chart's `runtime.resources`) apply. `procs_per_node` defaults to the GPU count
    (one process per GPU), else 1.
    """

    name: str
    namespace: str
    nodes: int = 1
    gpus_per_node: int | None = None
    procs_per_node: int | None = None
    cpu: str | None = None
    memory: str | None = None
    runtime: str = DEFAULT_RUNTIME
    runtime_kind: str = "TrainingRuntime"
    image: str | None = None
    store: str = DEFAULT_STORE
    run_name: str | None = None
    resume: bool = False
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Toleration] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # Kueue LocalQueue (in the job's namespace) that admits the job: the TrainJob gets the
    # kueue.x-k8s.io/queue-name label, and Kueue holds it suspended until the quota allows it
    queue: str | None = None
    # The nodes' command and arguments; None: `torchrun --no-python envace train` with the
    # arguments of the spec (config, store, run name, resume). The pipeline's train step sets both.
    command: Sequence[str] | None = None
    args: Sequence[str] | None = None

    def __post_init__(self) -> None:
        validate_job_name(self.name)
        if self.nodes < 1:
            raise UserInputError(f"--nodes must be at least 1, got {self.nodes}")
        if self.gpus_per_node is not None and self.gpus_per_node < 0:
            raise UserInputError(f"--gpus-per-node must be 0 or more, got {self.gpus_per_node}")
        if self.procs_per_node is not None and self.procs_per_node < 1:
            raise UserInputError(f"--procs-per-node must be at least 1, got {self.procs_per_node}")
        if self.cpu is not None:
            check_cpu_quantity(self.cpu, "--cpu")
        if self.memory is not None:
            check_memory_quantity(self.memory, "--memory")
        if self.run_name is not None:
            check_run_name(self.run_name, "--run-name")
        if self.queue is not None and (not _QUEUE.match(self.queue) or len(self.queue) > 63):
            raise UserInputError(
                f"--queue {self.queue!r} is not a LocalQueue name: lower-case letters, digits and"
                " '-', at most 63 characters, e.g. --queue team-a (kubectl get localqueues -n"
                f" {self.namespace} lists them)"
            )
        if self.runtime_kind not in ("TrainingRuntime", "ClusterTrainingRuntime"):
            raise UserInputError(
                f"runtime kind must be TrainingRuntime or ClusterTrainingRuntime, "
                f"got {self.runtime_kind!r}"
            )
        if not re.match(r"^(minio|s3)://[^/]+", self.store):
            raise UserInputError(
                f"--store must be a minio://bucket/prefix or s3://bucket/prefix URI reachable from "
                f"the cluster, got {self.store!r}"
            )

    @property
    def processes_per_node(self) -> int:
        if self.procs_per_node is not None:
            return self.procs_per_node
        return self.gpus_per_node if self.gpus_per_node else 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.processes_per_node


def check_cpu_quantity(value: str, flag: str) -> str:
    """`value` if it is a CPU quantity (16, 0.5, 500m), else UserInputError naming `flag`.

    Checked here because the API server would refuse the object only at submit time, and a
    dry run would print a manifest that cannot be applied.
    """
    if not _CPU_QUANTITY.fullmatch(value):
        raise UserInputError(
            f"{flag} {value!r} is not a Kubernetes CPU quantity: give cores or millicores,"
            f" e.g. {flag} 16, {flag} 0.5 or {flag} 500m"
        )
    return value


def check_memory_quantity(value: str, flag: str) -> str:
    """`value` if it is a memory quantity (128Gi, 512Mi, 1.5G), else UserInputError naming `flag`."""
    if not _MEMORY_QUANTITY.fullmatch(value):
        hint = " (m means milli-bytes; write Mi for mebibytes)" if value.endswith("m") else ""
        raise UserInputError(
            f"{flag} {value!r} is not a Kubernetes memory quantity{hint}: give a number of"
            f" bytes with an optional suffix k, M, G, T, Ki, Mi, Gi, Ti, ..., e.g. {flag} 128Gi"
        )
    return value


def _run_name_problem(value: str) -> str | None:
    """What makes `value` unusable as a run name, or None."""
    if value == "":
        return "is empty"
    if value in (".", ".."):
        return "is a relative folder reference"
    if "/" in value or "\\" in value:
        return "has a path separator"
    if any(ch.isspace() or unicodedata.category(ch) in ("Cc", "Cf", "Cs") for ch in value):
        return "has whitespace or a control character"
    if value.startswith("-"):
        return "starts with '-' (`envace train` would read it as an option)"
    if len(value.encode("utf-8")) > _MAX_RUN_NAME_BYTES:
        return f"is longer than {_MAX_RUN_NAME_BYTES} bytes"
    return None


def check_run_name(value: str, flag: str) -> str:
    """`value` if it is one plain store key segment (a run folder), else UserInputError naming `flag`.

    The name is appended to --store as one key segment and names the local work dir
    (`runs/<name>`). Checked before a TrainJob exists: otherwise the pods fail only once scheduled
    (`..` is refused by the store, `/abs` becomes a work dir on the read-only root), and names
    with whitespace or invisible characters break every command that is copied from the logs.
    """
    problem = _run_name_problem(value)
    if problem is not None:
        shown = ascii(value) if len(value) <= 80 else ascii(value[:80]) + "..."
        raise UserInputError(
            f"{flag} {shown} {problem}: a run name is one plain folder name in the store, without"
            f" '/', whitespace or control characters and not '.' or '..', e.g. {flag} exp1"
        )
    return value


def validate_job_name(name: str) -> None:
    """Raise UserInputError unless name is a valid, short-enough TrainJob name."""
    if not _NAME.match(name):
        raise UserInputError(
            f"job name {name!r} is not a DNS label: use lower-case letters, digits and '-', "
            "starting with a letter and ending with a letter or digit"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise UserInputError(
            f"job name {name!r} has {len(name)} characters; at most {MAX_NAME_LENGTH} keep the "
            "pod host names JobSet derives from it valid"
        )


def default_job_name(prefix: str = "envace-train", now: datetime | None = None) -> str:
    """A unique-per-second job name, e.g. `envace-train-20261129-201500`."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    return f"{prefix}-{stamp}"


def config_map_name(job_name: str) -> str:
    return f"{job_name}-config"


def parse_key_value(text: str, flag: str) -> tuple[str, str]:
    """`KEY=VALUE` of a repeatable flag; the key must be a Kubernetes label / variable name."""
    key, sep, value = text.partition("=")
    if not sep or not _LABEL_KEY.match(key):
        raise UserInputError(f"{flag} expects KEY=VALUE, got {text!r}")
    return key, value


def parse_toleration(text: str) -> Toleration:
    """`KEY[=VALUE][:EFFECT]`, e.g. `nvidia.com/gpu:NoSchedule` or `pool=gpu:NoExecute`.

    The effect defaults to NoSchedule; without `=VALUE` any value of the key is tolerated.
    """
    spec, _, effect = text.partition(":")
    effect = effect or "NoSchedule"
    if effect not in _EFFECTS:
        raise UserInputError(
            f"--toleration {text!r}: effect must be one of {', '.join(_EFFECTS)}, got {effect!r}"
        )
    key, sep, value = spec.partition("=")
    if not _LABEL_KEY.match(key):
        raise UserInputError(f"--toleration {text!r}: {key!r} is not a valid taint key")
    return Toleration(key=key, effect=effect, value=value if sep else None)


def runtime_node_resources(runtime: Mapping[str, Any]) -> dict[str, Any]:
    """The `resources` of the `node` container of a (Cluster)TrainingRuntime object ({} when it
    sets none): what a TrainJob's `resourcesPerNode` would replace."""
    for job in _dig(runtime, "spec", "template", "spec", "replicatedJobs") or []:
        if not isinstance(job, dict) or job.get("name") != "node":
            continue
        for container in _dig(job, "template", "spec", "template", "spec", "containers") or []:
            if isinstance(container, dict) and container.get("name") == "node":
                resources = container.get("resources")
                return dict(resources) if isinstance(resources, dict) else {}
    return {}


def _dig(obj: Any, *keys: str) -> Any:
    """obj[k1][k2]..., None where a level is missing or not a mapping."""
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def with_runtime_resources(spec: TrainJobSpec, runtime: Mapping[str, Any]) -> TrainJobSpec:
    """`spec` with the CPU and memory it leaves unset taken from the runtime's node requests.

    A TrainJob's `resourcesPerNode` replaces the runtime's resources as a whole (Trainer >= 2.2),
    so `--gpus-per-node 8` alone would give pods no CPU or memory request. UserInputError when
    the runtime has none to take either.
    """
    requests = runtime_node_resources(runtime).get("requests") or {}
    kind = runtime.get("kind", spec.runtime_kind)
    cpu = spec.cpu if spec.cpu is not None else requests.get("cpu")
    memory = spec.memory if spec.memory is not None else requests.get("memory")
    missing = [flag for flag, value in (("--cpu", cpu), ("--memory", memory)) if value is None]
    if missing:
        raise UserInputError(
            f"--gpus-per-node {spec.gpus_per_node} replaces the resources of {kind} "
            f"{spec.runtime!r}, which requests no {' or '.join(m[2:] for m in missing)} for its "
            f"node container: give {' and '.join(missing)} (e.g. --cpu 16 --memory 128Gi)"
        )
    return replace(spec, cpu=str(cpu), memory=str(memory))


def _resources(spec: TrainJobSpec) -> dict[str, dict[str, str | int]] | None:
    quantities: dict[str, str | int] = {}
    if spec.cpu is not None:
        quantities["cpu"] = spec.cpu
    if spec.memory is not None:
        quantities["memory"] = spec.memory
    if spec.gpus_per_node:
        quantities[GPU_RESOURCE] = spec.gpus_per_node
    if not quantities:
        return None
    # requests == limits: GPUs must be equal anyway, and a training pod that bursts past its
    # request only to be OOM-killed mid-step is worse than one that waits to be scheduled.
    return {"requests": dict(quantities), "limits": dict(quantities)}


def _train_args(spec: TrainJobSpec) -> list[str]:
    args = ["--config", JOB_CONFIG_PATH, "--store", spec.store, "--run-name"]
    args.append(spec.run_name or spec.name)
    if spec.resume:
        args.append("--resume")
    return args


def _pod_patch(spec: TrainJobSpec, config_map: str) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "volumes": [{"name": _CONFIG_VOLUME, "configMap": {"name": config_map}}],
        "containers": [
            {
                "name": "node",
                "volumeMounts": [
                    {"name": _CONFIG_VOLUME, "mountPath": JOB_CONFIG_DIR, "readOnly": True}
                ],
            }
        ],
    }
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = [toleration.to_dict() for toleration in spec.tolerations]
    return pod


def build_trainjob(spec: TrainJobSpec) -> dict[str, Any]:
    """The TrainJob object for spec (what `create_namespaced_custom_object` sends)."""
    trainer: dict[str, Any] = {
        "command": list(spec.command or ("torchrun", "--no-python", "envace", "train")),
        "args": list(spec.args) if spec.args is not None else _train_args(spec),
        "numNodes": spec.nodes,
        "numProcPerNode": spec.processes_per_node,
    }
    if spec.image is not None:
        trainer["image"] = spec.image
    if (resources := _resources(spec)) is not None:
        trainer["resourcesPerNode"] = resources
    if spec.env:
        trainer["env"] = [{"name": key, "value": value} for key, value in spec.env.items()]
    pod_patch = _pod_patch(spec, config_map_name(spec.name))
    labels = dict(_LABELS)
    if spec.queue is not None:
        labels[KUEUE_QUEUE_LABEL] = spec.queue
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": labels},
        "spec": {
            "runtimeRef": {"apiGroup": GROUP, "kind": spec.runtime_kind, "name": spec.runtime},
            "trainer": trainer,
            "runtimePatches": [
                {
                    "manager": PATCH_MANAGER,
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {"spec": {"template": {"spec": pod_patch}}},
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
        },
    }


def build_config_map(
    spec: TrainJobSpec, config_text: str, owner: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ConfigMap holding the training config; owned by the created TrainJob when owner is given.

    The owner reference makes Kubernetes garbage-collect the ConfigMap with its TrainJob.
    """
    metadata: dict[str, Any] = {
        "name": config_map_name(spec.name),
        "namespace": spec.namespace,
        "labels": {**_LABELS, "envace.dev/trainjob": spec.name},
    }
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": API_VERSION,
                "kind": "TrainJob",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {CONFIG_KEY: config_text},
    }
