"""Check the cluster prerequisites EnvACE relies on but does not install.

Kubeflow Trainer v2 and JobSet (required for TrainJobs), the EnvACE runtime from charts/envace
(required), Kubeflow Pipelines' Argo backend (only for pipeline runs) and the NVIDIA device plugin
(only for GPU pools: it is what makes `nvidia.com/gpu` allocatable on nodes).

The minimum versions are stated here once (docs/cluster.md repeats them): Kubeflow Trainer
MIN_TRAINER, the first whose TrainJob has `runtimePatches` (our GPU TrainJobs set node selectors
and tolerations through it), checked by reading the served CRD's schema; Kubeflow Pipelines
MIN_KFP, the first whose driver accepts the `optional` field kfp 2.15 compiles into secret
environment variables, checked by the API server Deployment's image tag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from envace.cluster.submit import ClusterError, TrainJobClient, api_errors
from envace.cluster.trainjob import GPU_RESOURCE, GROUP, VERSION

__all__ = ["MIN_KFP", "MIN_TRAINER", "Check", "check_cluster", "format_checks"]

_JOBSET = ("jobset.x-k8s.io", "v1alpha2")
_ARGO = ("argoproj.io", "v1alpha1")
MIN_TRAINER = (2, 2, 0)
MIN_KFP = (2, 15, 0)
_TRAINJOB_CRD = f"trainjobs.{GROUP}"
# The TrainJob fields EnvACE writes (envace/cluster/trainjob.py, k8s/overlays): spec, spec.trainer.
_SPEC_FIELDS = ("runtimeRef", "trainer", "runtimePatches")
_TRAINER_FIELDS = (
    *("command", "args", "env", "image"),
    *("numNodes", "numProcPerNode", "resourcesPerNode"),
)
_TRAINER_INSTALL = (
    'kubectl apply --server-side -k "https://github.com/kubeflow/trainer.git/manifests/overlays/'
    'manager?ref=v{v}" (docs/cluster.md)'
)
_KFP_DEPLOYMENT = "ml-pipeline"
_VERSION = re.compile(r":v?(\d+)\.(\d+)\.(\d+)(?:[-+@][^:/]*)?$")


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


@dataclass(frozen=True)
class Check:
    """One prerequisite: whether it holds, whether EnvACE needs it, and what was found."""

    name: str
    ok: bool
    required: bool
    detail: str
    absent_as: str = "absent"  # the word for an optional check that fails: absent, or warning


def _served_groups(api_client: Any, host: str) -> dict[str, set[str]]:
    with api_errors("listing the API groups", host):
        groups = k8s.ApisApi(api_client).get_api_versions(_request_timeout=30)
    return {g.name: {v.version for v in g.versions or []} for g in groups.groups or []}


def _api_check(
    groups: dict[str, set[str]], name: str, group: str, version: str, required: bool, fix: str
) -> Check:
    if version in groups.get(group, set()):
        return Check(name, True, required, f"{group}/{version} served")
    return Check(name, False, required, f"{group}/{version} not served: {fix}")


def _gpu_check(api_client: Any, host: str) -> Check:
    with api_errors("listing nodes", host):
        nodes = k8s.CoreV1Api(api_client).list_node(_request_timeout=30).items
    per_node = {
        node.metadata.name: int((node.status.allocatable or {}).get(GPU_RESOURCE, "0"))
        for node in nodes
    }
    gpu_nodes = {name: count for name, count in per_node.items() if count > 0}
    if not gpu_nodes:
        return Check(
            "NVIDIA device plugin",
            False,
            False,
            f"no node has allocatable {GPU_RESOURCE} ({len(per_node)} nodes): install the NVIDIA "
            "device plugin or GPU Operator on the GPU pool (CPU-only clusters run the CPU image)",
        )
    listing = ", ".join(f"{name}: {count}" for name, count in sorted(gpu_nodes.items()))
    total = sum(gpu_nodes.values())
    return Check(
        "NVIDIA device plugin", True, False, f"{total} GPUs on {len(gpu_nodes)} nodes ({listing})"
    )


def _schema_fields(crd: Any, version: str) -> tuple[set[str], set[str]] | None:
    """The property names of spec and spec.trainer in the CRD's schema for `version`."""
    for served in crd.spec.versions or []:
        if served.name != version or not served.served:
            continue
        root = served.schema.open_apiv3_schema if served.schema else None
        spec = (root.properties or {}).get("spec") if root else None
        if spec is None:
            return set(), set()
        trainer = (spec.properties or {}).get("trainer")
        trainer_fields = set(trainer.properties or {}) if trainer is not None else set()
        return set(spec.properties or {}), trainer_fields
    return None


def _trainer_version_check(api_client: Any, host: str) -> Check:
    """Trainer >= MIN_TRAINER, judged by the served TrainJob schema holding every field we set."""
    from kubernetes.client.exceptions import ApiException

    name = f"Kubeflow Trainer >= {_dotted(MIN_TRAINER)}"
    install = _TRAINER_INSTALL.format(v=_dotted(MIN_TRAINER))
    try:
        crd = k8s.ApiextensionsV1Api(api_client).read_custom_resource_definition(
            _TRAINJOB_CRD, _request_timeout=30
        )
    except ApiException as exc:
        if exc.status in (401, 403):
            return Check(
                name,
                False,
                False,
                f"cannot read CRD {_TRAINJOB_CRD} (HTTP {exc.status}: needs `get` on "
                "customresourcedefinitions); check by hand that `kubectl explain "
                "trainjob.spec.runtimePatches` works",
                "warning",
            )
        with api_errors(f"reading CRD {_TRAINJOB_CRD}", host):
            raise
    fields = _schema_fields(crd, VERSION)
    if fields is None:
        return Check(name, False, True, f"CRD {_TRAINJOB_CRD} serves no {VERSION}: {install}")
    spec, trainer = fields
    missing = [f"spec.{f}" for f in _SPEC_FIELDS if f not in spec]
    missing += [f"spec.trainer.{f}" for f in _TRAINER_FIELDS if f not in trainer]
    if missing:
        return Check(
            name,
            False,
            True,
            f"the served TrainJob schema lacks {', '.join(missing)} (an older Trainer): upgrade "
            f"with {install}",
        )
    return Check(name, True, True, f"TrainJob schema has every field EnvACE sets ({VERSION})")


def _kfp_version_check(api_client: Any, host: str, namespace: str) -> Check | None:
    """KFP >= MIN_KFP by its API server's image tag; None when no KFP is found there."""
    from kubernetes.client.exceptions import ApiException

    name = f"Kubeflow Pipelines >= {_dotted(MIN_KFP)}"
    try:
        deployment = k8s.AppsV1Api(api_client).read_namespaced_deployment(
            _KFP_DEPLOYMENT, namespace, _request_timeout=30
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        if exc.status in (401, 403):
            return Check(
                name,
                False,
                False,
                f"cannot read Deployment {namespace}/{_KFP_DEPLOYMENT} (HTTP {exc.status}); "
                "check its image tag by hand",
                "warning",
            )
        with api_errors(f"reading Deployment {namespace}/{_KFP_DEPLOYMENT}", host):
            raise
    images = [c.image or "" for c in deployment.spec.template.spec.containers or []]
    found = [tuple(int(p) for p in m.groups()) for i in images if (m := _VERSION.search(i))]
    if not found:
        return Check(
            name,
            False,
            False,
            f"{namespace}/{_KFP_DEPLOYMENT} runs {images}: no version tag",
            "warning",
        )
    version = max(found)
    detail = f"{namespace}/{_KFP_DEPLOYMENT} runs {_dotted(version)}"
    if version < MIN_KFP:
        return Check(
            name,
            False,
            False,
            f"{detail}: its driver rejects the `optional` fields of our compiled pipeline; "
            f"upgrade Kubeflow Pipelines to {_dotted(MIN_KFP)} or later (docs/pipeline.md)",
            "warning",
        )
    return Check(name, True, False, detail)


def check_cluster(
    api_client: Any,
    namespace: str,
    runtime: str,
    runtime_kind: str = "TrainingRuntime",
    kfp_namespace: str = "kubeflow",
) -> list[Check]:
    """All prerequisite checks, in dependency order."""
    host = str(api_client.configuration.host)
    groups = _served_groups(api_client, host)
    checks = [
        _api_check(
            groups,
            "Kubeflow Trainer",
            GROUP,
            VERSION,
            True,
            "install Kubeflow Trainer v2 (docs/cluster.md, Prerequisites)",
        ),
        _api_check(
            groups,
            "JobSet",
            *_JOBSET,
            True,
            "install JobSet (the Kubeflow Trainer manager overlay includes it)",
        ),
    ]
    if checks[0].ok:
        checks.append(_trainer_version_check(api_client, host))
        try:
            TrainJobClient(api_client, namespace).check_runtime(runtime, runtime_kind)
            checks.append(Check("EnvACE runtime", True, True, f"{runtime_kind} {runtime!r} found"))
        except ClusterError as exc:
            checks.append(Check("EnvACE runtime", False, True, str(exc)))
    checks.append(
        _api_check(
            groups,
            "Kubeflow Pipelines (Argo)",
            *_ARGO,
            False,
            "only needed for pipeline runs; install Kubeflow Pipelines v2",
        )
    )
    if checks[-1].ok and (kfp := _kfp_version_check(api_client, host, kfp_namespace)):
        checks.append(kfp)
    checks.append(_gpu_check(api_client, host))
    return checks


def format_checks(checks: list[Check]) -> str:
    """A fixed-width table: status, name, detail."""
    width = max(len(check.name) for check in checks)
    lines = []
    for check in checks:
        status = "ok" if check.ok else ("MISSING" if check.required else check.absent_as)
        lines.append(f"{status:<8} {check.name:<{width}}  {check.detail}")
    return "\n".join(lines)
