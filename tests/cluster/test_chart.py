"""charts/envace: lint, render with default and non-default values, validate every object offline.

helm runs for real (`helm lint --strict`, `helm template`); rendered objects are validated against
the Kubernetes schemas and the Kubeflow Trainer CRDs (cluster_testlib.ManifestValidator).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_testlib import (
    CHART,
    REPO,
    ManifestValidator,
    containers_of,
    env_of,
    every_pod_spec,
    find,
    pod_specs,
    render,
    run_tool,
    template_argv,
)

from envace.cluster.trainjob import (
    TrainJobSpec,
    build_trainjob,
    runtime_node_resources,
    with_runtime_resources,
)

# Every worked example in ci/ (a new file is linted, validated and scanned without listing it here).
VALUE_FILES = tuple(sorted(path.name for path in (CHART / "ci").glob("*.yaml")))
VALUE_SETS = [(), *((name,) for name in VALUE_FILES)]
CHECK_OFF = ("prerequisites.check=false",)


@pytest.fixture(scope="module")
def default_objects(helm: str) -> list[dict[str, Any]]:
    return render(helm)


@pytest.fixture(scope="module")
def gpu_objects(helm: str) -> list[dict[str, Any]]:
    return render(helm, ("gpu-values.yaml",))


def _lint(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_tool([helm, "lint", "--strict", str(CHART), *args], check=False)


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda v: v[0] if v else "default")
def test_lint_strict(helm: str, values: tuple[str, ...]) -> None:
    # `helm lint` has no --api-versions: with the prerequisite check on it would only lint up to
    # the `fail`, so the check is switched off here; test_prerequisite_check_* covers it.
    args = [arg for name in values for arg in ("-f", str(CHART / "ci" / name))]
    result = _lint(helm, *args, "--set", CHECK_OFF[0])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda v: v[0] if v else "default")
def test_every_rendered_object_is_valid(
    helm: str, validator: ManifestValidator, values: tuple[str, ...]
) -> None:
    objects = render(helm, values)
    assert objects
    validator.assert_valid(objects)


def test_validator_catches_mistakes(
    default_objects: list[dict[str, Any]], validator: ManifestValidator
) -> None:
    """The validation the chart passes is strict enough to fail on typical slips."""
    runtime = json.loads(json.dumps(find(default_objects, "TrainingRuntime")))
    runtime["spec"]["mlPolicy"]["mpi"] = {"numProcPerNode": 1}  # two policies: a CEL rule
    assert any("Only one of the policy" in e for e in validator.errors(runtime))
    runtime = json.loads(json.dumps(find(default_objects, "TrainingRuntime")))
    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
        "spec"
    ]
    pod["containers"][0][
        "volumeMount"
    ] = []  # typo'd field: pruned by the API server, an error here
    assert validator.errors(runtime)
    statefulset = json.loads(json.dumps(find(default_objects, "StatefulSet")))
    statefulset["spec"]["replicas"] = "one"
    assert validator.errors(statefulset)


def test_upgrades_respect_the_runtime_crd_immutable_fields(
    helm: str, validator: ManifestValidator
) -> None:
    """`helm upgrade` between value sets must not touch what the CRD's transition rules freeze."""
    installed = find(render(helm), "TrainingRuntime")
    upgraded = find(render(helm, ("kind-values.yaml",)), "TrainingRuntime")
    assert validator.update_errors(installed, upgraded) == []
    restarts = find(render(helm, sets=("runtime.maxRestarts=2",)), "TrainingRuntime")
    errors = validator.update_errors(installed, restarts)
    assert errors == [
        ".spec.template.spec.failurePolicy: Value is immutable (rule: self == oldSelf)"
    ]


def test_default_inventory(default_objects: list[dict[str, Any]]) -> None:
    names = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in default_objects)
    assert names == [
        "ConfigMap/envace-bucket-init",
        "ConfigMap/envace-config",
        "ConfigMap/kfp-launcher",
        "Job/envace-bucket-init",
        "Pod/envace-test",
        "Role/envace-test",
        "Role/envace-trainjobs",
        "RoleBinding/envace-test",
        "RoleBinding/envace-trainjobs",
        "Secret/envace-minio-root",
        "Secret/envace-store",
        "Service/envace-minio",
        "Service/envace-minio-headless",
        "ServiceAccount/envace",
        "ServiceAccount/envace-test",
        "StatefulSet/envace-minio",
        "TrainingRuntime/envace",
    ]
    job = find(default_objects, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    assert find(default_objects, "Pod")["metadata"]["annotations"]["helm.sh/hook"] == "test"
    minio = find(default_objects, "StatefulSet")
    (claim,) = minio["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    assert minio["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
        "quay.io/minio/minio:RELEASE."
    )


def test_prerequisite_check_names_the_missing_operator(helm: str) -> None:
    none = run_tool(template_argv(helm, api_versions=False), check=False)
    assert none.returncode != 0
    assert "Kubeflow Trainer is not installed" in none.stderr
    assert "prerequisites.check=false" in none.stderr
    trainer_only = run_tool(
        template_argv(
            helm, api_versions=False, extra=("--api-versions", "trainer.kubeflow.org/v1alpha1")
        ),
        check=False,
    )
    assert trainer_only.returncode != 0
    assert "JobSet is not installed" in trainer_only.stderr
    off = run_tool(template_argv(helm, sets=CHECK_OFF, api_versions=False))
    assert "kind: TrainingRuntime" in off.stdout


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda v: v[0] if v else "default")
def test_secure_defaults_on_every_pod(helm: str, values: tuple[str, ...]) -> None:
    pods = every_pod_spec(render(helm, values))
    assert pods
    for where, pod in pods.items():
        assert pod["securityContext"]["runAsNonRoot"] is True, where
        # >= 10000: no clash with a host user should a container escape (checkov CKV_K8S_40)
        assert pod["securityContext"]["runAsUser"] >= 10000, where
        assert pod["securityContext"]["runAsGroup"] >= 10000, where
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        assert pod["automountServiceAccountToken"] is False, where
        for container in containers_of(pod):
            at = f"{where}/{container['name']}"
            security = container["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, at
            assert security["readOnlyRootFilesystem"] is True, at
            assert security["capabilities"] == {"drop": ["ALL"]}, at
            assert container["resources"]["requests"] and container["resources"]["limits"], at
            tag = container["image"].rsplit(":", 1)[-1]
            assert tag and tag != "latest", f"{at}: unpinned image {container['image']}"
            # Secrets reach every container as files, never as environment variables.
            secret_env = [
                e["name"]
                for e in container.get("env", [])
                if "secretKeyRef" in e.get("valueFrom", {})
            ]
            assert not secret_env, f"{at}: secrets as env {secret_env}"


def _shm(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return dict(volume["emptyDir"])


def test_nccl_and_vllm_pods_get_memory_backed_shm(gpu_objects: list[dict[str, Any]]) -> None:
    pods = pod_specs(gpu_objects)
    runtime = pods["ClusterTrainingRuntime/envace-h100/node"]
    assert _shm(runtime, runtime["containers"][0]) == {"medium": "Memory", "sizeLimit": "64Gi"}
    vllm = pods["Deployment/envace-simulator"]
    assert _shm(vllm, vllm["containers"][0]) == {"medium": "Memory", "sizeLimit": "8Gi"}


def test_gpu_pools_come_from_values(
    default_objects: list[dict[str, Any]], gpu_objects: list[dict[str, Any]]
) -> None:
    default_runtime = pod_specs(default_objects)["TrainingRuntime/envace/node"]
    assert "nodeSelector" not in default_runtime  # the GPU request selects GPU nodes
    assert default_runtime["tolerations"] == [
        {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}
    ]
    assert default_runtime["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    pods = pod_specs(gpu_objects)
    runtime = pods["ClusterTrainingRuntime/envace-h100/node"]
    assert runtime["nodeSelector"] == {"node-pool": "h100"}
    assert {
        "key": "dedicated",
        "operator": "Equal",
        "value": "training",
        "effect": "NoSchedule",
    } in runtime["tolerations"]
    assert runtime["affinity"]["podAntiAffinity"]
    assert runtime["priorityClassName"] == "training-high"
    assert runtime["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == 8
    vllm = pods["Deployment/envace-simulator"]
    assert vllm["nodeSelector"] == {"node-pool": "l40s"}
    assert vllm["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert pods["StatefulSet/envace-minio"]["nodeSelector"] == {"node-pool": "system"}


def test_runtime_runs_envace_train_under_torchrun(default_objects: list[dict[str, Any]]) -> None:
    runtime = find(default_objects, "TrainingRuntime", "envace")
    assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "torch"
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 1, "torch": {}}  # no MPI, no SSH
    (job,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    assert (
        job["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"]
        == "trainer"
    )
    pod = job["template"]["spec"]["template"]["spec"]
    (node,) = pod["containers"]
    assert node["name"] == "node"
    assert node["image"] == "envace-gpu:0.1.0"
    assert node["command"] == ["torchrun", "--no-python", "envace", "train"]
    assert node["args"] == [
        "--config",
        "/etc/envace/config.yaml",
        "--store",
        "minio://envace/runs",
        "--run-name",
        "$(ENVACE_RUN_NAME)",
    ]
    env = env_of(node)
    assert env["ENVACE_RUN_NAME"] == {
        "fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/jobset-name']"}
    }
    # a restarted job resumes (tests/train/test_restart.py): JobSet's restart counter label
    assert env["ENVACE_RESTART_ATTEMPT"] == {
        "fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"}
    }
    config_mount = next(m for m in node["volumeMounts"] if m["mountPath"] == "/etc/envace")
    config_volume = next(v for v in pod["volumes"] if v["name"] == config_mount["name"])
    assert config_volume["configMap"]["name"] == "envace-config"


def test_gpu_trainjobs_take_cpu_and_memory_from_the_rendered_runtime(
    gpu_objects: list[dict[str, Any]], validator: ManifestValidator
) -> None:
    """`resourcesPerNode` replaces the runtime's resources: a submit with GPUs alone fills CPU
    and memory from the chart's runtime, so the pods still request them."""
    runtime = find(gpu_objects, "ClusterTrainingRuntime", "envace-h100")
    requests = runtime_node_resources(runtime)["requests"]
    spec = TrainJobSpec(name="r", namespace="ns", gpus_per_node=8, runtime="envace-h100")
    spec = with_runtime_resources(spec, runtime)
    trainjob = build_trainjob(spec)
    per_node = trainjob["spec"]["trainer"]["resourcesPerNode"]
    want = {"cpu": str(requests["cpu"]), "memory": str(requests["memory"]), "nvidia.com/gpu": 8}
    assert per_node == {"requests": want, "limits": want}
    validator.assert_valid([trainjob])


def test_store_contract_reaches_pods_and_kfp(default_objects: list[dict[str, Any]]) -> None:
    endpoint = "envace-minio.envace.svc:9000"
    node = pod_specs(default_objects)["TrainingRuntime/envace/node"]["containers"][0]
    env = env_of(node)
    assert env["ENVACE_S3_ENDPOINT"] == endpoint
    assert env["ENVACE_S3_SECURE"] == "false"
    assert env["ENVACE_S3_REGION"] == "us-east-1"
    # The keys as files of the store Secret, where the variables point (envace/storage/settings.py)
    assert env["ENVACE_S3_ACCESS_KEY_FILE"] == "/credentials/store/access-key"
    assert env["ENVACE_S3_SECRET_KEY_FILE"] == "/credentials/store/secret-key"
    assert "ENVACE_S3_ACCESS_KEY" not in env and "ENVACE_S3_SECRET_KEY" not in env
    runtime_pod = pod_specs(default_objects)["TrainingRuntime/envace/node"]
    keys = next(v for v in runtime_pod["volumes"] if v["name"] == "store-credentials")["secret"]
    assert keys["secretName"] == "envace-store"
    assert keys["items"] == [
        {"key": "access-key", "path": "access-key"},
        {"key": "secret-key", "path": "secret-key"},
    ]
    assert {"name": "store-credentials", "mountPath": "/credentials/store", "readOnly": True} in (
        node["volumeMounts"]
    )
    secret = find(default_objects, "Secret", "envace-store")
    assert secret["stringData"]["access-key"] == "envace"
    assert len(secret["stringData"]["secret-key"]) == 40
    launcher = find(default_objects, "ConfigMap", "kfp-launcher")["data"]
    assert launcher["defaultPipelineRoot"] == "minio://envace/pipeline-root"
    provider = yaml.safe_load(launcher["providers"])["minio"]["default"]
    assert provider["endpoint"] == endpoint
    assert provider["disableSSL"] is True
    assert provider["credentials"] == {
        "fromEnv": False,
        "secretRef": {
            "secretName": "envace-store",
            "accessKeyKey": "access-key",
            "secretKeyKey": "secret-key",
        },
    }
    minio = pod_specs(default_objects)["StatefulSet/envace-minio"]
    minio_env = env_of(minio["containers"][0])
    assert minio_env["MINIO_ROOT_PASSWORD_FILE"] == "/credentials/root/password"
    assert minio_env["MINIO_ROOT_USER_FILE"] == "/credentials/root/user"
    assert "MINIO_ROOT_PASSWORD" not in minio_env
    root = next(v for v in minio["volumes"] if v["name"] == "root-credentials")["secret"]
    assert root["secretName"] == "envace-minio-root"
    assert root["items"] == [
        {"key": "root-user", "path": "user"},
        {"key": "root-password", "path": "password"},
    ]
    mount = next(
        m for m in minio["containers"][0]["volumeMounts"] if m["name"] == "root-credentials"
    )
    assert mount == {"name": "root-credentials", "mountPath": "/credentials/root", "readOnly": True}


def test_existing_secrets_replace_generated_ones(gpu_objects: list[dict[str, Any]]) -> None:
    assert not [o for o in gpu_objects if o["kind"] == "Secret"]
    runtime_pod = pod_specs(gpu_objects)["ClusterTrainingRuntime/envace-h100/node"]
    node = runtime_pod["containers"][0]
    keys = next(v for v in runtime_pod["volumes"] if v["name"] == "store-credentials")
    assert keys["secret"]["secretName"] == "envace-store-credentials"
    assert node["args"][3] == "minio://envace-prod/experiments"
    bucket_init = pod_specs(gpu_objects)["Job/envace-bucket-init"]
    secrets = {v["name"]: v["secret"] for v in bucket_init["volumes"] if "secret" in v}
    assert secrets["root-credentials"]["secretName"] == "envace-minio-root"
    assert secrets["store-credentials"]["secretName"] == "envace-store-credentials"
    bucket_env = env_of(bucket_init["containers"][0])
    assert bucket_env["BUCKETS"] == "envace-prod envace-datasets"
    assert bucket_env["ROOT_CREDENTIALS_DIR"] == "/credentials/root"
    role = find(gpu_objects, "Role", "envace-trainjobs")
    secret_rule = next(r for r in role["rules"] if r["resources"] == ["secrets"])
    assert secret_rule == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["envace-store-credentials"],
        "verbs": ["get"],
    }
    launcher = find(gpu_objects, "ConfigMap", "kfp-launcher")["data"]
    assert launcher["defaultPipelineRoot"] == "s3://envace-prod/pipelines/v2"


def test_external_store(helm: str) -> None:
    objects = render(helm, ("external-store-values.yaml",))
    kinds = {o["kind"] for o in objects}
    assert "StatefulSet" not in kinds and "TrainingRuntime" not in kinds and "Secret" not in kinds
    bucket_env = env_of(pod_specs(objects)["Job/envace-bucket-init"]["containers"][0])
    assert bucket_env["STORE_ENDPOINT"] == "s3.eu-west-1.amazonaws.com:443"
    assert bucket_env["STORE_SCHEME"] == "https"
    assert bucket_env["MANAGE_USER"] == "false"
    provider = yaml.safe_load(find(objects, "ConfigMap", "kfp-launcher")["data"]["providers"])[
        "s3"
    ]["default"]
    assert provider["disableSSL"] is False
    assert provider["credentials"]["secretRef"]["accessKeyKey"] == "AWS_ACCESS_KEY_ID"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ("minio.enabled=false", "store.credentials.existingSecret=s3"),
            "store.externalEndpoint is required",
        ),
        (
            ("minio.enabled=false", "store.externalEndpoint=s3:443"),
            "store.credentials.existingSecret is required",
        ),
        (("runtime.kind=MPIRuntime",), "runtime.kind"),
        (("inference.gpuMemoryUtilization=1.5",), "gpuMemoryUtilization"),
        (("runtme.enabled=true",), "runtme"),
        (("runtime.resources.limits=null",), "limits"),
        (("store.bucket=Bad_Bucket",), "store.bucket"),
        (("inference.enabled=true", "inference.modelStoreUri=s3://b/ckpt"), "modelStoreUri"),
    ],
)
def test_bad_values_fail_with_the_key(helm: str, sets: tuple[str, ...], message: str) -> None:
    result = run_tool(template_argv(helm, sets=sets), check=False)
    assert result.returncode != 0
    assert message in result.stderr


@pytest.mark.parametrize(
    ("sets", "key", "example"),
    [
        (("runtime.resources.limits.memory=-8Gi",), "runtime.resources.limits.memory", "8Gi"),
        (("runtime.resources.requests.cpu=-500m",), "runtime.resources.requests.cpu", "500m"),
        (("runtime.resources.limits.memory=128GB",), "runtime.resources.limits.memory", "8Gi"),
        (("minio.persistence.size=-5Gi",), "minio.persistence.size", "100Gi"),
        (("minio.resources.limits.memory=lots",), "minio.resources.limits.memory", "8Gi"),
        (("bucketInit.resources.requests.cpu=1.2.3",), "bucketInit.resources.requests.cpu", "500m"),
        (("runtime.shmSize=huge",), "runtime.shmSize", "16Gi"),
        (("runtime.scratchSize=1 Gi",), "runtime.scratchSize", "200Gi"),
        (
            ("inference.enabled=true", "inference.cacheSize=-1Gi"),
            "inference.cacheSize",
            "100Gi",
        ),
        (
            ("inference.enabled=true", "inference.resources.limits.cpu=x"),
            "inference.resources.limits.cpu",
            "500m",
        ),
    ],
)
def test_bad_quantities_name_the_key_and_an_example(
    helm: str, sets: tuple[str, ...], key: str, example: str
) -> None:
    """No sign, and a message with the key and an example instead of the schema's bare regex."""
    result = run_tool(template_argv(helm, sets=sets), check=False)
    assert result.returncode != 0
    value = sets[-1].split("=", 1)[1]
    assert f'{key}="{value}" is not a Kubernetes quantity' in result.stderr
    assert f"e.g. --set {key}={example}" in result.stderr
    assert "pattern" not in result.stderr


@pytest.mark.parametrize("item", ["runtime.resources.limits.cpu=-1", "minio.persistence.size=-5"])
def test_negative_numbers_are_refused(helm: str, item: str) -> None:
    """--set parses these as numbers, which the schema's minimum refuses (naming the key)."""
    result = run_tool(template_argv(helm, sets=(item,)), check=False)
    assert result.returncode != 0
    assert f"{item.split('=')[0]}: Must be greater than or equal to 0" in result.stderr


def test_good_quantities_render_unchanged(helm: str) -> None:
    sets = (
        "runtime.shmSize=0.5Gi",
        "runtime.scratchSize=1e3",
        "runtime.resources.limits.cpu=2",
        "runtime.resources.requests.cpu=250m",
        "minio.persistence.size=1Ti",
    )
    objects = render(helm, sets=sets)
    runtime = pod_specs(objects)["TrainingRuntime/envace/node"]
    volumes = {
        v["name"]: v["emptyDir"].get("sizeLimit") for v in runtime["volumes"] if "emptyDir" in v
    }
    assert volumes["dshm"] == "0.5Gi" and volumes["home"] == "1e3"
    resources = runtime["containers"][0]["resources"]
    assert resources["limits"]["cpu"] == 2 and resources["requests"]["cpu"] == "250m"
    (claim,) = find(objects, "StatefulSet")["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Ti"


def test_tls_to_the_bundled_minio_is_refused(helm: str) -> None:
    """The bundled MinIO serves plain HTTP: ENVACE_S3_SECURE=true would make every client fail."""
    result = run_tool(template_argv(helm, sets=("store.secure=true",)), check=False)
    assert result.returncode != 0
    assert (
        "store.secure=true does not work with the bundled MinIO (minio.enabled=true)"
        in result.stderr
    )
    assert "set store.secure=false, or set minio.enabled=false" in result.stderr
    render(helm, ("external-store-values.yaml",))  # TLS to an external store stays allowed


def test_config_map_holds_the_default_config(
    helm: str, default_objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    data = find(default_objects, "ConfigMap", "envace-config")["data"]["config.yaml"]
    assert data == (CHART / "files" / "config.yaml").read_text()
    custom = tmp_path / "gpu.yaml"
    custom.write_text("model:\n  name: Qwen/Qwen3-8B\n")
    result = run_tool([*template_argv(helm), "--set-file", f"config.content={custom}"])
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    assert find(objects, "ConfigMap", "envace-config")["data"]["config.yaml"] == custom.read_text()


def test_chart_default_config_is_configs_local() -> None:
    """Helm cannot read files outside the chart: files/config.yaml is a copy that must not drift."""
    assert (CHART / "files" / "config.yaml").read_text() == (
        REPO / "configs" / "local.yaml"
    ).read_text(), (
        "charts/envace/files/config.yaml differs from configs/local.yaml: "
        "cp configs/local.yaml charts/envace/files/config.yaml"
    )


def test_inference_serves_a_store_checkpoint(gpu_objects: list[dict[str, Any]]) -> None:
    pod = pod_specs(gpu_objects)["Deployment/envace-simulator"]
    (fetch,) = pod["initContainers"]
    assert env_of(fetch)["MODEL_PATH"] == "envace-prod/runs/round-3/checkpoint"
    (vllm,) = pod["containers"]
    assert vllm["image"] == "registry.example.com/vllm/vllm-openai:v0.33.0"  # the mirror
    assert vllm["command"] == ["vllm", "serve"]
    assert vllm["args"][0] == "/models/served"
    assert "--served-model-name=simulator" in vllm["args"]
    assert "--tensor-parallel-size=2" in vllm["args"]
    assert "--enable-prefix-caching" in vllm["args"]
    assert env_of(vllm)["HF_TOKEN_PATH"] == "/credentials/hf/token"  # a file, not HF_TOKEN
    token = next(v for v in pod["volumes"] if v["name"] == "hf-token")["secret"]
    assert token["secretName"] == "hf-token"
    assert token["items"] == [{"key": "token", "path": "token"}]
    assert {"name": "hf-token", "mountPath": "/credentials/hf", "readOnly": True} in vllm[
        "volumeMounts"
    ]
    fetch_credentials = next(v for v in pod["volumes"] if v["name"] == "store-credentials")
    assert fetch_credentials["secret"]["secretName"] == "envace-store-credentials"
    assert "$(cat /credentials/store/access-key)" in fetch["args"][0]
    assert vllm["startupProbe"]["failureThreshold"] * vllm["startupProbe"]["periodSeconds"] == 1800
    service = find(gpu_objects, "Service", "envace-simulator")
    assert service["spec"]["ports"][0]["port"] == 8000


def test_rbac_lets_runs_manage_trainjobs(
    default_objects: list[dict[str, Any]], gpu_objects: list[dict[str, Any]]
) -> None:
    rules = find(default_objects, "Role", "envace-trainjobs")["rules"]
    trainjobs = next(r for r in rules if r["resources"] == ["trainjobs"])
    assert {"create", "get", "watch", "delete"} <= set(trainjobs["verbs"])
    assert any(r["resources"] == ["configmaps"] and "create" in r["verbs"] for r in rules)
    assert any("pods/log" in r["resources"] for r in rules)
    binding = find(gpu_objects, "RoleBinding", "envace-trainjobs")
    assert {
        "kind": "ServiceAccount",
        "name": "pipeline-runner",
        "namespace": "kubeflow",
    } in binding["subjects"]
    assert {"kind": "ServiceAccount", "name": "envace-pipelines", "namespace": "envace"} in binding[
        "subjects"
    ]
    cluster_role = find(gpu_objects, "ClusterRole", "envace-envace-runtimes")
    assert cluster_role["rules"] == [
        {
            "apiGroups": ["trainer.kubeflow.org"],
            "resources": ["clustertrainingruntimes"],
            "resourceNames": ["envace-h100"],
            "verbs": ["get"],
        }
    ]
    assert not [o for o in default_objects if o["kind"].startswith("Cluster")]


def _gen_readme() -> Any:
    spec = importlib.util.spec_from_file_location("gen_readme", CHART / "hack" / "gen_readme.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_readme"] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def _leaves(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict) and node:
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{prefix}{key}.")]
    return [prefix[:-1]]


def test_every_value_is_documented_in_readme_and_schema() -> None:
    gen = _gen_readme()
    assert gen.check(CHART) == [], "run: python charts/envace/hack/gen_readme.py"
    documented = {doc.path for doc in gen.parse_value_docs(CHART / "values.yaml")}
    readme = (CHART / "README.md").read_text()
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for leaf in _leaves(values):
        parts = leaf.split(".")
        owners = [
            ".".join(parts[:n])
            for n in range(len(parts), 0, -1)
            if ".".join(parts[:n]) in documented
        ]
        assert owners, f"values.yaml key {leaf} has no `# --` doc comment (on it or a parent)"
        assert f"`{owners[0]}`" in readme, f"{owners[0]} missing from README.md"
        node = schema
        for part in owners[0].split("."):
            node = node["properties"][part]
        assert node["description"], f"{owners[0]} has no description in values.schema.json"


def _credential_files(folder: Path, user: str, password: str) -> Path:
    """A mounted credentials Secret as the chart maps it: store keys and root user side by side."""
    folder.mkdir()
    for name, value in (("access-key", user), ("secret-key", password)):
        (folder / name).write_text(value)
    for name, value in (("user", user), ("password", password)):
        (folder / name).write_text(value)
    return folder


def test_bucket_init_script_is_idempotent(tmp_path: Path) -> None:
    """Runs files/bucket-init.sh under sh with a recording stand-in for `mc` (no MinIO here);
    credentials come as files, the way the Job mounts its Secrets."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "mc.log"
    fake_mc = bin_dir / "mc"
    fake_mc.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {log}\n'
        'if [ "$1 $2" = "admin policy" ] && [ "$3" = "create" ]; then cp "$6" '
        f"{tmp_path}/policy.json; fi\n"
        f'if [ "$1 $2 $3" = "admin user info" ] && [ -f {tmp_path}/attached ]; then '
        'echo "PolicyName: envace-rw"; fi\n'
        f'if [ "$1 $2 $3" = "admin policy attach" ]; then touch {tmp_path}/attached; fi\n'
    )
    fake_mc.chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STORE_SCHEME": "http",
        "STORE_ENDPOINT": "minio:9000",
        "BUCKETS": "envace extra",
        "POLICY": "envace-rw",
        "MANAGE_USER": "true",
        "STORE_CREDENTIALS_DIR": str(
            _credential_files(tmp_path / "store", "envace", "s3cret-s3cret")
        ),
        "ROOT_CREDENTIALS_DIR": str(_credential_files(tmp_path / "root", "root", "root-pass")),
        "HOME": str(tmp_path),
    }
    script = str(CHART / "files" / "bucket-init.sh")
    for _ in range(2):
        result = subprocess.run(
            ["sh", script], env=env, capture_output=True, text=True, timeout=30, check=False
        )
        assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "alias set store http://minio:9000 root root-pass"
    assert calls.count("mb --ignore-existing store/envace") == 2
    assert calls.count("mb --ignore-existing store/extra") == 2
    assert (
        calls.count("admin policy attach store envace-rw --user envace") == 1
    )  # second run: already attached
    policy = json.loads((tmp_path / "policy.json").read_text())
    assert policy["Statement"][0]["Resource"] == [
        "arn:aws:s3:::envace",
        "arn:aws:s3:::envace/*",
        "arn:aws:s3:::extra",
        "arn:aws:s3:::extra/*",
    ]


def _notes(helm: str, tmp_path: Path, values: tuple[str, ...]) -> str:
    """NOTES.txt as `helm install` prints it: `helm template` skips NOTES, so a copy of the chart
    renders it through `tpl` inside a probe ConfigMap (same values, same capabilities)."""
    chart = tmp_path / "envace"
    shutil.copytree(CHART, chart)
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "files" / "notes.txt")
    (chart / "templates" / "notes-probe.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  notes: {{ tpl (.Files.Get "files/notes.txt") . | quote }}\n'
    )
    argv = [*template_argv(helm, values), "--show-only", "templates/notes-probe.yaml"]
    argv[argv.index(str(CHART))] = str(chart)
    return str(yaml.safe_load(run_tool(argv).stdout)["data"]["notes"])


def test_notes_tell_how_to_use_the_release(helm: str, tmp_path: Path) -> None:
    notes = _notes(helm, tmp_path / "default", ())
    assert "endpoint     : envace-minio.envace.svc:9000 (http)" in notes
    assert "envace cluster submit --namespace envace --runtime envace --config" in notes
    assert "kubectl -n envace apply -k k8s/overlays/gpu-single-node" in notes
    assert "Kubeflow Trainer + JobSet : found" in notes
    assert "Check the release: helm test envace -n envace --logs" in notes
    assert "credentials  : Secret envace-store (keys access-key, secret-key)" in notes
    assert "Inference server" not in notes
    notes = _notes(helm, tmp_path / "gpu", ("gpu-values.yaml",))
    assert "--runtime envace-h100 --cluster-runtime" in notes
    assert "k8s/overlays" not in notes  # the overlays reference TrainingRuntime/envace
    assert 'http://envace-simulator.envace.svc:8000/v1  (model "simulator")' in notes
    assert "Run pipelines with service account envace-pipelines" in notes
    notes = _notes(helm, tmp_path / "irsa", ("external-s3-web-identity-values.yaml",))
    assert (
        "credentials  : web identity of ServiceAccount envace"
        " (role arn:aws:iam::123456789012:role/envace-training), no static keys"
    ) in notes
