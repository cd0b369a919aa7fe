"""Check the cluster prerequisites EnvACE relies on but does not install.

Kubeflow Trainer v2 and JobSet (required for TrainJobs), the EnvACE runtime from charts/envace
(required), Kubeflow Pipelines' Argo backend (only for pipeline runs) and the NVIDIA device plugin
(only for GPU pools: it is what makes `nvidia.com/gpu` allocatable on nodes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes import client as k8s

from envace.cluster.submit import ClusterError, TrainJobClient, api_errors
from envace.cluster.trainjob import GPU_RESOURCE, GROUP, VERSION

__all__ = ["Check", "check_cluster", "format_checks"]

_JOBSET = ("jobset.x-k8s.io", "v1alpha2")
_ARGO = ("argoproj.io", "v1alpha1")


@dataclass(frozen=True)
class Check:
    """One prerequisite: whether it holds, whether EnvACE needs it, and what was found."""

    name: str
    ok: bool
    required: bool
    detail: str


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


def check_cluster(
    api_client: Any, namespace: str, runtime: str, runtime_kind: str = "TrainingRuntime"
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
    checks.append(_gpu_check(api_client, host))
    return checks


def format_checks(checks: list[Check]) -> str:
    """A fixed-width table: status, name, detail."""
    width = max(len(check.name) for check in checks)
    lines = []
    for check in checks:
        status = "ok" if check.ok else ("MISSING" if check.required else "absent")
        lines.append(f"{status:<8} {check.name:<{width}}  {check.detail}")
    return "\n".join(lines)
