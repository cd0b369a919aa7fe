"""charts/envace on real clusters: subchart use, `helm test`, NetworkPolicies, GPU-friendly
updates, kept secrets, web identity, registry mirrors, gang scheduling and Kueue.

Real helm renders every case; new objects go through the same strict validation as the rest of
the chart (Kubernetes schemas, the vendored Kubeflow Trainer CRDs with their CEL rules).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_testlib import (
    CHART,
    ManifestValidator,
    containers_of,
    env_of,
    every_pod_spec,
    find,
    images_of,
    load_objects,
    pod_specs,
    render,
    run_tool,
    template_argv,
)

CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "ClusterTrainingRuntime"}
VALUE_SETS = [(), *((path.name,) for path in sorted((CHART / "ci").glob("*.yaml")))]
IRSA = ("external-s3-web-identity-values.yaml",)


def _fails(helm: str, *sets: str, values: tuple[str, ...] = ()) -> str:
    """stderr of a render that must fail."""
    result = run_tool(template_argv(helm, values, sets), check=False)
    assert result.returncode != 0, f"rendered despite {sets}"
    return result.stderr


@pytest.mark.parametrize("values", VALUE_SETS, ids=lambda v: v[0] if v else "default")
def test_every_namespaced_object_names_its_namespace(helm: str, values: tuple[str, ...]) -> None:
    """`kubectl apply -f` of the rendered chart (GitOps) lands in the release namespace only."""
    for obj in render(helm, values):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], where
        else:
            assert obj["metadata"].get("namespace") == "envace", where


# ------------------------------------------------------------------------------ subchart


def test_the_chart_works_as_a_subchart(helm: str, tmp_path: Path) -> None:
    """A parent chart's `global` values reach the subchart, whose schema must accept them;
    `global.imageRegistry` then moves every image to the parent's mirror."""
    parent = tmp_path / "platform"
    (parent / "charts").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "envace")
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: platform\nversion: 1.0.0\n"
        "dependencies:\n  - name: envace\n    version: 0.1.0\n"
    )
    (parent / "values.yaml").write_text(
        "global:\n  imageRegistry: mirror.example.com\n  storageClass: fast\n"
        "envace:\n  prerequisites:\n    check: false\n"
    )
    result = run_tool([helm, "template", "platform", str(parent), "--namespace", "envace"])
    objects = load_objects(result.stdout)
    assert find(objects, "TrainingRuntime", "envace")
    images = images_of(objects)
    assert images
    for where, image in images.items():
        assert image.startswith("mirror.example.com/"), f"{where}: {image}"
    assert images["StatefulSet/platform-envace-minio/minio"] == (
        "mirror.example.com/minio/minio:RELEASE.2025-10-15T17-29-55Z"
    )


# ----------------------------------------------------------------------------- helm test


def _test_pod(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = find(objects, "Pod", "envace-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    return pod


def _mounts(container: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}


def test_helm_test_checks_store_and_runtime_with_minimal_rights(
    default_objects: list[dict[str, Any]], validator: ManifestValidator
) -> None:
    pod = _test_pod(default_objects)
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["serviceAccountName"] == "envace-test"
    assert spec["automountServiceAccountToken"] is False
    store, runtime = spec["containers"]
    assert (store["name"], runtime["name"]) == ("store", "runtime")
    # store: the pods' own credentials, as files; no API token
    assert store["image"] == "quay.io/minio/mc:RELEASE.2025-04-16T18-13-26Z"
    assert store["command"] == ["/bin/sh", "-c", (CHART / "files" / "store-check.sh").read_text()]
    env = env_of(store)
    assert env["STORE_ENDPOINT"] == "envace-minio.envace.svc:9000"
    assert env["BUCKETS"] == "envace"
    assert _mounts(store) == {"/credentials/store": "store-credentials", "/tmp": "tmp"}
    credentials = next(v for v in spec["volumes"] if v["name"] == "store-credentials")
    assert credentials["secret"]["secretName"] == "envace-store"
    # runtime: one GET of the runtime object, with a short-lived token mounted into it alone
    assert runtime["image"] == "registry.k8s.io/kubectl:v1.32.3"
    assert [*runtime["command"], *runtime["args"]] == [
        "kubectl",
        "get",
        "--raw",
        "/apis/trainer.kubeflow.org/v1alpha1/namespaces/envace/trainingruntimes/envace",
    ]
    assert _mounts(runtime)["/var/run/secrets/kubernetes.io/serviceaccount"] == "api-token"
    token = next(v for v in spec["volumes"] if v["name"] == "api-token")["projected"]["sources"]
    assert token[0] == {"serviceAccountToken": {"path": "token", "expirationSeconds": 600}}
    role = find(default_objects, "Role", "envace-test")
    assert role["rules"] == [
        {
            "apiGroups": ["trainer.kubeflow.org"],
            "resources": ["trainingruntimes"],
            "resourceNames": ["envace"],
            "verbs": ["get"],
        }
    ]
    binding = find(default_objects, "RoleBinding", "envace-test")
    assert binding["roleRef"]["name"] == "envace-test"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "envace-test", "namespace": "envace"}
    ]
    validator.assert_valid(
        [pod, role, binding, find(default_objects, "ServiceAccount", "envace-test")]
    )


def test_helm_test_follows_the_setup(helm: str, gpu_objects: list[dict[str, Any]]) -> None:
    # a ClusterTrainingRuntime: a ClusterRole for that one object
    runtime = _test_pod(gpu_objects)["spec"]["containers"][1]
    assert (
        runtime["args"][-1]
        == "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/envace-h100"
    )
    rule = find(gpu_objects, "ClusterRole", "envace-envace-test")["rules"][0]
    assert (rule["resources"], rule["resourceNames"]) == (
        ["clustertrainingruntimes"],
        ["envace-h100"],
    )
    assert env_of(_test_pod(gpu_objects)["spec"]["containers"][0])["BUCKETS"] == (
        "envace-prod envace-datasets"
    )
    # no runtime: the store check alone, without ServiceAccount or token
    external = render(helm, ("external-store-values.yaml",))
    spec = _test_pod(external)["spec"]
    assert [c["name"] for c in spec["containers"]] == ["store"]
    assert "serviceAccountName" not in spec
    assert not [v for v in spec["volumes"] if v["name"] == "api-token"]
    assert not [
        o for o in external if o["kind"] == "ServiceAccount" and "test" in o["metadata"]["name"]
    ]
    # web identity: mc cannot log in without static keys, so the runtime check alone
    irsa = _test_pod(render(helm, IRSA))["spec"]
    assert [c["name"] for c in irsa["containers"]] == ["runtime"]
    # and off
    objects = render(helm, sets=("helmTest.enabled=false",))
    assert not [o for o in objects if o["kind"] == "Pod" or o["metadata"]["name"] == "envace-test"]


def _fake_mc(tmp_path: Path, present: set[str]) -> dict[str, str]:
    """An `mc` stand-in that logs in and lists only the buckets in `present`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mc = bin_dir / "mc"
    cases = " | ".join(f"store/{b}" for b in sorted(present)) or "store/-none-"
    mc.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp_path}/mc.log\n'
        'if [ "$1 $2" = "alias set" ]; then exit 0; fi\n'
        f'case "$2" in {cases}) exit 0 ;; esac\n'
        'echo "mc: <ERROR> Unable to list folder. The specified bucket does not exist." >&2\n'
        "exit 1\n"
    )
    mc.chmod(0o755)
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    (credentials / "access-key").write_text("envace")
    (credentials / "secret-key").write_text("s3cret")
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "STORE_SCHEME": "http",
        "STORE_ENDPOINT": "minio:9000",
        "BUCKETS": "envace extra",
        "SECRET_NAME": "envace-store",
        "STORE_CREDENTIALS_DIR": str(credentials),
        "HOME": str(tmp_path),
    }


@pytest.mark.parametrize(
    ("present", "code"), [({"envace", "extra"}, 0), ({"envace"}, 1), (set(), 1)]
)
def test_store_check_script_fails_on_a_missing_bucket(
    tmp_path: Path, present: set[str], code: int
) -> None:
    """files/store-check.sh (the `store` container) under sh, with a stand-in `mc`."""
    env = _fake_mc(tmp_path, present)
    script = str(CHART / "files" / "store-check.sh")
    result = subprocess.run(
        ["sh", script], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == code, result.stderr
    calls = (tmp_path / "mc.log").read_text().splitlines()
    assert calls[0] == "alias set store http://minio:9000 envace s3cret"  # keys read from files
    assert calls[1:] == ["ls store/envace", "ls store/extra"]
    missing = sorted({"envace", "extra"} - present)
    if missing:
        assert f"bucket(s) {' '.join(missing)} missing or not readable" in result.stderr
        assert "Secret envace-store" in result.stderr
    else:
        assert "bucket extra is readable at http://minio:9000" in result.stdout


# ------------------------------------------------------------------------- NetworkPolicy


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    assert set(selector) <= {"matchLabels"}, f"selector form not modelled: {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _allowed(
    policies: list[dict[str, Any]],
    source: tuple[str, dict[str, str]],
    target: dict[str, str],
    port: int,
) -> bool:
    """NetworkPolicy ingress semantics for target pods in namespace `envace`; a namespace's labels
    are its automatic `kubernetes.io/metadata.name`."""
    namespace, labels = source
    namespace_labels = {"kubernetes.io/metadata.name": namespace}
    selecting = [p for p in policies if _selects(p["spec"]["podSelector"], target)]
    if not selecting:
        return True  # a pod no policy selects is not isolated
    for policy in selecting:
        for rule in policy["spec"].get("ingress", []):
            ports = [p["port"] for p in rule.get("ports", [])]
            if ports and port not in ports:
                continue
            for peer in rule.get("from", []):
                if "namespaceSelector" in peer:
                    in_namespace = _selects(peer["namespaceSelector"], namespace_labels)
                else:
                    in_namespace = namespace == "envace"
                if in_namespace and _selects(peer.get("podSelector", {}), labels):
                    return True
    return False


def _pod_labels(objects: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    labels = {}
    for obj in objects:
        if obj["kind"] == "Pod":
            labels["test"] = obj["metadata"]["labels"]
        elif obj["kind"] in ("Deployment", "StatefulSet", "Job"):
            labels[obj["metadata"]["name"]] = obj["spec"]["template"]["metadata"]["labels"]
        elif obj["kind"].endswith("TrainingRuntime"):
            job = obj["spec"]["template"]["spec"]["replicatedJobs"][0]
            labels["trainer"] = job["template"]["spec"]["template"]["metadata"]["labels"]
    return labels


def test_network_policies_are_off_by_default(default_objects: list[dict[str, Any]]) -> None:
    assert not [o for o in default_objects if o["kind"] == "NetworkPolicy"]


def test_network_policies_let_only_the_chart_pods_reach_minio(
    gpu_objects: list[dict[str, Any]],
) -> None:
    policies = [o for o in gpu_objects if o["kind"] == "NetworkPolicy"]
    assert sorted(p["metadata"]["name"] for p in policies) == [
        "envace-deny-ingress",
        "envace-minio",
        "envace-simulator",
        "envace-trainer",
    ]
    pods = _pod_labels(gpu_objects)
    minio, vllm, trainer = pods["envace-minio"], pods["envace-simulator"], pods["trainer"]
    pipeline = {
        "pipelines.kubeflow.org/v2_component": "true",
        "workflows.argoproj.io/workflow": "r",
    }
    stranger = {"app": "something-else"}
    kfp_ui = {"app": "ml-pipeline-ui"}
    may = [
        (("envace", pods["envace-bucket-init"]), minio, 9000),
        (("envace", pods["test"]), minio, 9000),
        (("envace", trainer), minio, 9000),
        (("team-b", trainer), minio, 9000),  # a ClusterTrainingRuntime's pods run anywhere
        (("envace", pipeline), minio, 9000),
        (("kubeflow", kfp_ui), minio, 9000),  # networkPolicy.extraFrom
        (("envace", trainer), vllm, 8000),
        (("envace", pipeline), vllm, 8000),
        (("envace", trainer), trainer, 29400),  # torch rendezvous, NCCL: any port
        (("envace", trainer), trainer, 45123),
    ]
    may_not = [
        (("envace", stranger), minio, 9000),
        (("other", pipeline), minio, 9000),  # pipeline pods of another namespace
        (("other", kfp_ui), minio, 9000),  # extraFrom names namespace kubeflow only
        (("envace", trainer), minio, 22),
        (("envace", stranger), vllm, 8000),
        (("envace", pipeline), trainer, 29400),
        (("envace", trainer), pods["envace-bucket-init"], 8080),  # clients serve nothing
        (("envace", stranger), pods["test"], 8080),
    ]
    for source, target, port in may:
        assert _allowed(policies, source, target, port), (source, target, port)
    for source, target, port in may_not:
        assert not _allowed(policies, source, target, port), (source, target, port)
    # every pod of the release is isolated (selected by the deny-all policy)
    deny = find(gpu_objects, "NetworkPolicy", "envace-deny-ingress")["spec"]
    assert deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    for name, labels in pods.items():
        assert _selects(deny["podSelector"], labels), name


# ------------------------------------------------------------------- updates and secrets


def test_inference_is_recreated_not_rolled(helm: str, gpu_objects: list[dict[str, Any]]) -> None:
    """A rolling update needs a second set of GPUs for the surge pod: Recreate by default."""
    assert find(gpu_objects, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    rolling = render(helm, ("gpu-values.yaml",), ("inference.updateStrategy=RollingUpdate",))
    assert find(rolling, "Deployment")["spec"]["strategy"] == {"type": "RollingUpdate"}
    error = _fails(helm, "inference.enabled=true", "inference.updateStrategy=BlueGreen")
    assert "inference.updateStrategy" in error


def test_generated_secrets_survive_uninstall(default_objects: list[dict[str, Any]]) -> None:
    """The MinIO PVC outlives `helm uninstall` and holds users made with these keys."""
    for name in ("envace-store", "envace-minio-root"):
        secret = find(default_objects, "Secret", name)
        assert secret["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}, name


def test_minio_image_carries_the_cve_2025_62506_fix(default_objects: list[dict[str, Any]]) -> None:
    image = pod_specs(default_objects)["StatefulSet/envace-minio"]["containers"][0]["image"]
    repository, tag = image.rsplit(":", 1)
    assert repository == "quay.io/minio/minio"
    # RELEASE.<UTC timestamp> tags sort by time; the fix shipped in RELEASE.2025-10-15T17-29-55Z
    assert tag >= "RELEASE.2025-10-15T17-29-55Z", tag
    for text in ((CHART / "values.yaml").read_text(), (CHART / "README.md").read_text()):
        assert "CVE-2025-62506" in text


# ---------------------------------------------------------------------------- web identity


def test_web_identity_runs_without_static_keys(helm: str, validator: ManifestValidator) -> None:
    objects = render(helm, IRSA)
    validator.assert_valid(objects)
    assert not [o for o in objects if o["kind"] in ("Secret", "StatefulSet", "Job")]
    account = find(objects, "ServiceAccount", "envace")
    assert account["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/envace-training"
    }
    node = pod_specs(objects)["TrainingRuntime/envace/node"]
    assert node["serviceAccountName"] == "envace"  # EKS injects the role's token for it
    assert node["automountServiceAccountToken"] is False  # but no API token
    env = env_of(node["containers"][0])
    assert env["ENVACE_S3_ENDPOINT"] == "s3.eu-west-1.amazonaws.com:443"
    assert env["ENVACE_S3_SECURE"] == "true"
    keys = {"ENVACE_S3_ACCESS_KEY", "ENVACE_S3_SECRET_KEY", "AWS_ACCESS_KEY_ID"}
    assert not {*keys, "ENVACE_S3_ACCESS_KEY_FILE", "ENVACE_S3_SECRET_KEY_FILE"} & set(env)
    text = json.dumps(objects)
    assert "secretKeyRef" not in text and '"secret":' not in text
    provider = yaml.safe_load(find(objects, "ConfigMap", "kfp-launcher")["data"]["providers"])
    assert provider["s3"]["default"]["credentials"] == {"fromEnv": True}
    role = find(objects, "Role", "envace-trainjobs")
    assert not [r for r in role["rules"] if r["resources"] == ["secrets"]]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ("minio.enabled=true", "bucketInit.enabled=false", "store.secure=false"),
            "needs an external store",
        ),
        (("bucketInit.enabled=true",), "bucketInit.enabled=true"),
        (
            ("inference.enabled=true", "inference.modelStoreUri=minio://b/ckpt"),
            "cannot fetch inference.modelStoreUri",
        ),
        (
            ("store.credentials.webIdentity.roleArn=envace-role",),
            'store.credentials.webIdentity.roleArn="envace-role" is not an IAM role ARN',
        ),
        (
            ("serviceAccount.create=false",),
            "serviceAccount.create=false: annotate your ServiceAccount",
        ),
        (("store.credentials.source=iam",), "store.credentials.source"),
    ],
)
def test_web_identity_misuse_names_the_key(helm: str, sets: tuple[str, ...], message: str) -> None:
    assert message in _fails(helm, *sets, values=IRSA)


# ------------------------------------------------------------------------ registry, pulls


def test_one_registry_value_moves_every_image(helm: str) -> None:
    sets = (
        "image.registry=harbor.example.com/proxy",
        "inference.enabled=true",
        "inference.modelStoreUri=minio://envace/ckpt",
    )
    images = images_of(render(helm, sets=sets))
    assert set(images) >= {
        "StatefulSet/envace-minio/minio",
        "Job/envace-bucket-init/mc",
        "TrainingRuntime/envace/node/node",
        "Deployment/envace-judge/fetch-model",
        "Deployment/envace-judge/vllm",
        "Pod/envace-test/store",
        "Pod/envace-test/runtime",
    }
    for where, image in images.items():
        assert image.startswith("harbor.example.com/proxy/"), f"{where}: {image}"
    assert images["TrainingRuntime/envace/node/node"] == "harbor.example.com/proxy/envace-gpu:0.1.0"
    assert images["Deployment/envace-judge/vllm"] == (
        "harbor.example.com/proxy/vllm/vllm-openai:v0.33.0"
    )
    # without a mirror each image keeps its own registry
    defaults = images_of(render(helm, sets=sets[1:]))
    assert defaults["TrainingRuntime/envace/node/node"] == "envace-gpu:0.1.0"
    assert defaults["Deployment/envace-judge/vllm"] == "docker.io/vllm/vllm-openai:v0.33.0"
    assert defaults["Pod/envace-test/runtime"] == "registry.k8s.io/kubectl:v1.32.3"


def test_pull_secrets_reach_every_pod(gpu_objects: list[dict[str, Any]]) -> None:
    pods = every_pod_spec(gpu_objects)
    assert {"Pod/envace-test", "ClusterTrainingRuntime/envace-h100/node"} <= set(pods)
    for where, pod in pods.items():
        assert pod["imagePullSecrets"] == [{"name": "registry-credentials"}], where
        for container in containers_of(pod):
            assert container["image"].startswith("registry.example.com/"), where


@pytest.mark.parametrize(
    "item", ["image.registry=registry.example.com/", "image.registry=https://registry.example.com"]
)
def test_a_malformed_registry_names_the_key(helm: str, item: str) -> None:
    error = _fails(helm, item)
    assert f'image.registry="{item.split("=", 1)[1]}" must be a registry host' in error
    assert "e.g. --set image.registry=registry.example.com/mirror" in error


# ------------------------------------------------------------------- gang scheduling, Kueue


def _runtime(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (runtime,) = [o for o in objects if o["kind"].endswith("TrainingRuntime")]
    return runtime


def test_gang_scheduling_and_kueue_are_opt_in(
    helm: str,
    default_objects: list[dict[str, Any]],
    gpu_objects: list[dict[str, Any]],
    validator: ManifestValidator,
) -> None:
    default = _runtime(default_objects)
    assert "podGroupPolicy" not in default["spec"]
    assert "metadata" not in default["spec"]["template"]
    assert "schedulerName" not in pod_specs(default_objects)["TrainingRuntime/envace/node"]
    gpu = _runtime(gpu_objects)
    assert gpu["spec"]["podGroupPolicy"] == {"coscheduling": {"scheduleTimeoutSeconds": 300}}
    assert gpu["spec"]["template"]["metadata"]["labels"] == {
        "kueue.x-k8s.io/queue-name": "gpu-h100"
    }
    job = gpu["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-h100"
    assert job["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    volcano = _runtime(
        render(helm, sets=("runtime.podGroupPolicy.volcano.networkTopology.mode=soft",))
    )
    assert volcano["spec"]["podGroupPolicy"] == {"volcano": {"networkTopology": {"mode": "soft"}}}
    validator.assert_valid([gpu, volcano])
    # switching them on is a plain `helm upgrade` (no immutable runtime field changes)
    assert validator.update_errors(default, volcano) == []


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            (
                "runtime.podGroupPolicy.volcano.networkTopology.mode=hard",
                "runtime.podGroupPolicy.coscheduling.scheduleTimeoutSeconds=60",
            ),
            "runtime.podGroupPolicy sets coscheduling and volcano: give exactly one",
        ),
        (("runtime.podGroupPolicy.kueue.queue=a",), "runtime.podGroupPolicy"),
        (
            ("runtime.kueueQueueName=Team A!",),
            'runtime.kueueQueueName="Team A!" is not a label value',
        ),
    ],
)
def test_bad_scheduling_values_name_the_key(helm: str, sets: tuple[str, ...], message: str) -> None:
    assert message in _fails(helm, *sets)


@pytest.fixture(scope="module")
def default_objects(helm: str) -> list[dict[str, Any]]:
    return render(helm)


@pytest.fixture(scope="module")
def gpu_objects(helm: str) -> list[dict[str, Any]]:
    return render(helm, ("gpu-values.yaml",))
