"""k8s/: every overlay builds with `kubectl kustomize` (what `kubectl apply -k` applies) into
one TrainJob, valid against the Kubeflow Trainer CRD, fitting the runtime charts/envace installs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_testlib import (
    K8S,
    REPO,
    ManifestValidator,
    build_kustomization,
    find,
    pod_specs,
    render,
)

from envace.cluster.trainjob import Toleration, TrainJobSpec, build_trainjob

OVERLAYS = ("kind-cpu", "gpu-single-node", "gpu-multi-node")
_IMAGE_CONFIG = re.compile(r"^/opt/envace/configs/(?P<file>[\w.-]+\.yaml)$")


@pytest.fixture(scope="module")
def overlays(kubectl: str) -> dict[str, dict[str, Any]]:
    built = {}
    for name in OVERLAYS:
        objects = build_kustomization(kubectl, K8S / "overlays" / name)
        assert [o["kind"] for o in objects] == ["TrainJob"], name
        built[name] = objects[0]
    return built


def _pod_patch(trainjob: dict[str, Any]) -> dict[str, Any]:
    (patch,) = trainjob["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    return dict(job["template"]["spec"]["template"]["spec"])


def _config_arg(trainjob: dict[str, Any]) -> str:
    args = trainjob["spec"]["trainer"]["args"]
    return str(args[args.index("--config") + 1])


@pytest.mark.parametrize("name", OVERLAYS)
def test_overlay_is_a_valid_trainjob(
    overlays: dict[str, dict[str, Any]], validator: ManifestValidator, name: str
) -> None:
    validator.assert_valid([overlays[name]])


def test_kind_cpu_overlay(overlays: dict[str, dict[str, Any]]) -> None:
    trainer = overlays["kind-cpu"]["spec"]["trainer"]
    assert trainer["image"] == "envace-cpu:0.1.0"
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (1, 1)
    assert "nvidia.com/gpu" not in trainer["resourcesPerNode"]["limits"]
    assert _config_arg(overlays["kind-cpu"]) == "/etc/envace/config.yaml"  # the chart's ConfigMap
    assert "runtimePatches" not in overlays["kind-cpu"]["spec"]


def test_gpu_single_node_overlay(overlays: dict[str, dict[str, Any]]) -> None:
    trainjob = overlays["gpu-single-node"]
    trainer = trainjob["spec"]["trainer"]
    assert trainer["image"] == "envace-gpu:0.1.0"
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (1, 1)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 1
    assert _config_arg(trainjob) == "/opt/envace/configs/gpu-1.yaml"
    assert _pod_patch(trainjob)["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_gpu_multi_node_overlay(overlays: dict[str, dict[str, Any]]) -> None:
    trainjob = overlays["gpu-multi-node"]
    trainer = trainjob["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 8)
    # one process per GPU: torchrun's world is numNodes x numProcPerNode = 16 ranks
    assert trainer["resourcesPerNode"]["requests"]["nvidia.com/gpu"] == trainer["numProcPerNode"]
    assert _config_arg(trainjob) == "/opt/envace/configs/reference-8b.yaml"
    anti = _pod_patch(trainjob)["affinity"]["podAntiAffinity"]
    (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == {"app.kubernetes.io/component": "trainer"}


def test_configs_named_by_overlays_ship_in_the_image(overlays: dict[str, dict[str, Any]]) -> None:
    """docker/*.Dockerfile copy configs/ to /opt/envace/configs: the named files must exist."""
    for name, trainjob in overlays.items():
        if match := _IMAGE_CONFIG.match(_config_arg(trainjob)):
            assert (REPO / "configs" / match["file"]).is_file(), f"{name}: configs/{match['file']}"
    for dockerfile in ("cpu.Dockerfile", "gpu.Dockerfile"):
        assert "/opt/envace/configs" in (REPO / "docker" / dockerfile).read_text()


def test_overlays_fit_the_chart_runtime(overlays: dict[str, dict[str, Any]], helm: str) -> None:
    """The TrainJobs reference the runtime the chart installs and run the command it would."""
    chart_objects = render(helm)
    runtime = find(chart_objects, "TrainingRuntime")
    node = pod_specs(chart_objects)["TrainingRuntime/envace/node"]["containers"][0]
    pod_labels = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"
    ]["metadata"]["labels"]
    for name, trainjob in overlays.items():
        assert trainjob["spec"]["runtimeRef"] == {
            "apiGroup": "trainer.kubeflow.org",
            "kind": "TrainingRuntime",
            "name": runtime["metadata"]["name"],
        }, name
        assert trainjob["spec"]["trainer"]["command"] == node["command"], name
        args = trainjob["spec"]["trainer"]["args"]
        assert args[args.index("--store") + 1] == node["args"][node["args"].index("--store") + 1]
        assert "$(ENVACE_RUN_NAME)" in args  # defined by the runtime's container env
        if "runtimePatches" in trainjob["spec"] and "affinity" in _pod_patch(trainjob):
            term = _pod_patch(trainjob)["affinity"]["podAntiAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ][0]
            for key, value in term["labelSelector"]["matchLabels"].items():
                assert pod_labels[key] == value


def test_images_transformer_reaches_the_trainjob(kubectl: str, tmp_path: Path) -> None:
    """kustomize's `images:` rewrites TrainJob images (base/kustomizeconfig.yaml names it)."""
    overlay = tmp_path / "mine"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [os.path.relpath(K8S / "overlays" / "gpu-multi-node", overlay)],
                "images": [
                    {
                        "name": "envace-gpu",
                        "newName": "registry.example.com/envace-gpu",
                        "newTag": "1.2",
                    }
                ],
                "namespace": "team-a",
                "nameSuffix": "-run2",
            }
        )
    )
    (trainjob,) = build_kustomization(kubectl, overlay)
    assert trainjob["spec"]["trainer"]["image"] == "registry.example.com/envace-gpu:1.2"
    assert trainjob["metadata"]["name"] == "envace-train-run2"
    assert trainjob["metadata"]["namespace"] == "team-a"


def test_submit_builds_the_same_trainjob_as_the_overlay(
    overlays: dict[str, dict[str, Any]],
) -> None:
    """`envace cluster submit --nodes 2 --gpus-per-node 8 ...` == the gpu-multi-node overlay,
    except where the config comes from (an uploaded ConfigMap instead of the image)."""
    overlay = overlays["gpu-multi-node"]["spec"]
    built = build_trainjob(
        TrainJobSpec(
            name="envace-train",
            namespace="default",
            nodes=2,
            gpus_per_node=8,
            cpu="64",
            memory="512Gi",
            tolerations=(Toleration("nvidia.com/gpu", "NoSchedule"),),
            env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "NCCL_DEBUG": "WARN"},
        )
    )["spec"]
    assert built["runtimeRef"] == overlay["runtimeRef"]
    for key in ("command", "numNodes", "numProcPerNode", "env"):
        assert built["trainer"][key] == overlay["trainer"][key], key
    for bound in ("requests", "limits"):
        assert built["trainer"]["resourcesPerNode"][bound]["nvidia.com/gpu"] == 8
    assert (
        _pod_patch({"spec": built})["tolerations"] == _pod_patch({"spec": overlay})["tolerations"]
    )
    assert built["trainer"]["args"][2:4] == overlay["trainer"]["args"][2:4]  # --store URI
