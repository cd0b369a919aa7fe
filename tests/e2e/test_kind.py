"""The kind tier: a real cluster, the chart, the train step as a TrainJob on CPU, artifacts in MinIO.

    kind create cluster -> load envace-cpu -> install Kubeflow Trainer (+ JobSet) -> helm install
    charts/envace (ci/kind-values.yaml) -> `envace cluster check` -> `envace cluster submit` (a
    short config) and `kubectl apply -k k8s/overlays/kind-cpu` -> both TrainJobs Complete -> the
    runs' checkpoints and manifests are in MinIO.

Needs a Docker daemon, `kind`, `kubectl`, `helm` and network access for the kind node image, the
MinIO images and the Kubeflow Trainer manifests; skipped with the reason otherwise. How to run it:
docs/cluster.md ("The kind tier"). Knobs (environment):
  ENVACE_E2E_KIND_CLUSTER     reuse this existing kind cluster (it is then not deleted)
  ENVACE_E2E_TRAINER_MANIFESTS  kustomize URL/path of Kubeflow Trainer (default: the v2.1.0 manager)
"""

from __future__ import annotations

import base64
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_support import REPO, docker_daemon_problem, run

TRAINER_MANIFESTS = os.environ.get(
    "ENVACE_E2E_TRAINER_MANIFESTS",
    "https://github.com/kubeflow/trainer.git/manifests/overlays/manager?ref=v2.1.0",
)
NAMESPACE = "envace"


def _missing() -> str | None:
    tools = [tool for tool in ("kind", "kubectl") if shutil.which(tool) is None]
    if shutil.which("helm") is None and not (REPO / ".tools" / "bin" / "helm").exists():
        tools.append("helm")
    if tools:
        return f"{', '.join(tools)} not installed (kind tier: see docs/cluster.md)"
    return docker_daemon_problem()


_problem = _missing()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.cluster,
    pytest.mark.slow,
    pytest.mark.skipif(_problem is not None, reason=f"needs kind + Docker: {_problem}"),
]


def _helm() -> str:
    local = REPO / ".tools" / "bin" / "helm"
    return str(local) if local.exists() else "helm"


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory, cpu_image: str) -> Iterator[Path]:
    """A kind cluster with the CPU image loaded and Kubeflow Trainer running."""
    path = tmp_path_factory.mktemp("kind") / "kubeconfig"
    reuse = os.environ.get("ENVACE_E2E_KIND_CLUSTER")
    name = reuse or f"envace-e2e-{os.getpid()}"
    if reuse:
        run(["kind", "export", "kubeconfig", "--name", name, "--kubeconfig", str(path)])
    else:
        run(
            [
                "kind",
                "create",
                "cluster",
                "--name",
                name,
                "--kubeconfig",
                str(path),
                "--wait",
                "180s",
            ]
        )
    try:
        run(["kind", "load", "docker-image", cpu_image, "--name", name], timeout=900)
        kubectl = ["kubectl", "--kubeconfig", str(path)]
        run([*kubectl, "apply", "--server-side", "-k", TRAINER_MANIFESTS], timeout=600)
        run(
            [
                *kubectl,
                "wait",
                "--for=condition=Established",
                "--timeout=180s",
                "crd/trainjobs.trainer.kubeflow.org",
                "crd/jobsets.jobset.x-k8s.io",
            ]
        )
        run(
            [
                *kubectl,
                "-n",
                "kubeflow-system",
                "wait",
                "--for=condition=Available",
                "--timeout=600s",
                "deployment",
                "--all",
            ],
            timeout=660,
        )
        yield path
    finally:
        if not reuse:
            subprocess.run(
                ["kind", "delete", "cluster", "--name", name],
                capture_output=True,
                timeout=300,
                check=False,
            )


@pytest.fixture(scope="module")
def installed(kubeconfig: Path, smoke_config: Path) -> Path:
    """charts/envace installed with the kind values and the short config as the default config."""
    run(
        [
            _helm(),
            "upgrade",
            "--install",
            "envace",
            str(REPO / "charts" / "envace"),
            "--kubeconfig",
            str(kubeconfig),
            "-n",
            NAMESPACE,
            "--create-namespace",
            "-f",
            str(REPO / "charts" / "envace" / "ci" / "kind-values.yaml"),
            "--set-file",
            f"config.content={smoke_config}",
            "--wait",
            "--timeout",
            "15m",
        ],
        timeout=1000,
    )
    return kubeconfig


def _envace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "envace", *args],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _store_objects(kubeconfig: Path, prefix: str) -> set[str]:
    """Object names under prefix in the release's MinIO, read with the chart's application user."""
    from minio import Minio
    from urllib3.exceptions import HTTPError

    kubectl = ["kubectl", "--kubeconfig", str(kubeconfig), "-n", NAMESPACE]

    def secret(key: str) -> str:
        raw = run(
            [*kubectl, "get", "secret", "envace-store", "-o", f"jsonpath={{.data.{key}}}"]
        ).stdout
        return base64.b64decode(raw).decode()

    port = _free_port()
    forward = subprocess.Popen(
        [*kubectl, "port-forward", "svc/envace-minio", f"{port}:9000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        client = Minio(
            f"127.0.0.1:{port}",
            access_key=secret("access-key"),
            secret_key=secret("secret-key"),
            secure=False,
        )
        for _ in range(30):
            try:
                return {
                    obj.object_name
                    for obj in client.list_objects("envace", prefix=prefix, recursive=True)
                }
            except (HTTPError, OSError):  # the port-forward needs a moment before it listens
                time.sleep(1)
        pytest.fail(f"MinIO was not reachable through kubectl port-forward on port {port}")
    finally:
        forward.terminate()
        forward.wait(timeout=30)


def test_prerequisites_check_passes(installed: Path) -> None:
    result = _envace("cluster", "check", "--kubeconfig", str(installed), "-n", NAMESPACE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "TrainingRuntime 'envace' found" in result.stdout


def test_submitted_train_step_writes_its_run_to_minio(installed: Path, smoke_config: Path) -> None:
    name = f"e2e-submit-{int(time.time())}"
    result = _envace(
        "cluster",
        "submit",
        "--kubeconfig",
        str(installed),
        "-n",
        NAMESPACE,
        "--config",
        str(smoke_config),
        "--name",
        name,
        "--nodes",
        "1",
        "--gpus-per-node",
        "0",
        "--cpu",
        "1",
        "--memory",
        "3Gi",
        "--poll-interval",
        "5",
        "--timeout",
        "1500",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"envace/{name}: Complete" in result.stdout
    objects = _store_objects(installed, f"runs/{name}/")
    assert f"runs/{name}/checkpoints/final/MANIFEST.json" in objects
    assert f"runs/{name}/checkpoints/final/model.safetensors" in objects


def test_kubectl_applied_overlay_runs_to_completion(installed: Path) -> None:
    kubectl = ["kubectl", "--kubeconfig", str(installed), "-n", NAMESPACE]
    run([*kubectl, "delete", "trainjob", "envace-train", "--ignore-not-found", "--wait"])
    run([*kubectl, "apply", "-k", str(REPO / "k8s" / "overlays" / "kind-cpu")])
    run(
        [*kubectl, "wait", "--for=condition=Complete", "--timeout=1500s", "trainjob/envace-train"],
        timeout=1600,
    )
    objects = _store_objects(installed, "runs/envace-train/")
    assert "runs/envace-train/checkpoints/final/MANIFEST.json" in objects
