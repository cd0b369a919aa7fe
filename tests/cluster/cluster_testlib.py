"""Shared machinery of the cluster tests: rendering, strict manifest validation, a fake API server.

Validation is offline and strict:
- core kinds against the Kubernetes OpenAPI schemas bundled with `kubernetes-validate`
  (unknown fields are errors), for the oldest and the newest Kubernetes the chart supports;
- TrainJob / TrainingRuntime / ClusterTrainingRuntime against the openAPIV3Schema of the Kubeflow
  Trainer CRDs in tests/cluster/crds (copied from kubeflow/trainer), made strict (an unknown field
  is an error here where the API server would silently prune it), plus the CRDs' CEL rules
  (x-kubernetes-validations) evaluated with cel-python; their metadata and the pod templates
  inside runtimes are validated again as core objects.

The fake API server exists because no Kubernetes API server can run on CI machines (no kind, no
apiserver binary): it serves the real HTTP paths and JSON bodies the `kubernetes` client uses.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import os
import re
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "envace"
K8S = REPO / "k8s"
CRDS = Path(__file__).resolve().parent / "crds"
KUBE_VERSIONS = ("1.29.0", "1.37.0")
TRAINER_KINDS = ("TrainJob", "TrainingRuntime", "ClusterTrainingRuntime")
API_VERSIONS_FLAGS = (
    "--api-versions",
    "trainer.kubeflow.org/v1alpha1",
    "--api-versions",
    "jobset.x-k8s.io/v1alpha2",
)


def _tool(name: str, local: Path | None = None) -> str:
    if local is not None and local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.fail(
            f"`{name}` is not installed: run scripts/install_tools.sh (it puts helm into "
            ".tools/bin; kubectl comes with the CI machine). These checks must not be skipped.",
            pytrace=False,
        )
    return found


def helm_binary() -> str:
    return _tool("helm", REPO / ".tools" / "bin" / "helm")


def kubectl_binary() -> str:
    return _tool("kubectl", Path("/usr/bin/kubectl"))


def run_tool(argv: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if check and result.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr}{result.stdout}"
        )
    return result


def load_objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def template_argv(
    helm: str,
    values_files: tuple[str, ...] = (),
    sets: tuple[str, ...] = (),
    api_versions: bool = True,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """`helm template envace charts/envace -n envace ...` with ci/ value files and --set items."""
    argv = [helm, "template", "envace", str(CHART), "--namespace", "envace", *extra]
    if api_versions:
        argv += API_VERSIONS_FLAGS
    for values in values_files:
        argv += ["-f", str(CHART / "ci" / values)]
    for item in sets:
        argv += ["--set", item]
    return argv


def render(
    helm: str, values_files: tuple[str, ...] = (), sets: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    """The chart's objects for the given ci/ value files and --set items (APIs present)."""
    return load_objects(run_tool(template_argv(helm, values_files, sets)).stdout)


def build_kustomization(kubectl: str, directory: Path) -> list[dict[str, Any]]:
    return load_objects(run_tool([kubectl, "kustomize", str(directory)]).stdout)


def pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod spec in objects, keyed `Kind/name` (runtimes: `Kind/name/replicatedJob`)."""
    specs = {}
    for obj in objects:
        key = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in ("Deployment", "StatefulSet", "Job"):
            specs[key] = obj["spec"]["template"]["spec"]
        elif obj["kind"] in ("TrainingRuntime", "ClusterTrainingRuntime"):
            for job in obj["spec"]["template"]["spec"]["replicatedJobs"]:
                specs[f"{key}/{job['name']}"] = job["template"]["spec"]["template"]["spec"]
    return specs


def every_pod_spec(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """pod_specs plus bare Pods (the chart's `helm test` Pod), keyed `Pod/name`."""
    specs = pod_specs(objects)
    specs.update({f"Pod/{o['metadata']['name']}": o["spec"] for o in objects if o["kind"] == "Pod"})
    return specs


def images_of(objects: list[dict[str, Any]]) -> dict[str, str]:
    """The image of every container (init containers included), keyed `pod key/container`."""
    return {
        f"{where}/{container['name']}": container["image"]
        for where, pod in every_pod_spec(objects).items()
        for container in containers_of(pod)
    }


def containers_of(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"]]


def find(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {
        item["name"]: item.get("value", item.get("valueFrom")) for item in container.get("env", [])
    }


def _strict(schema: Any) -> Any:
    """Close every object schema that lists its properties, unless it preserves unknown fields."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    closed = {key: _strict(value) for key, value in schema.items() if key != "properties"}
    if "properties" in schema:
        closed["properties"] = {key: _strict(value) for key, value in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            closed["additionalProperties"] = False
    return closed


class _CrdValidator:
    """openAPIV3Schema + CEL validation of one CRD version (create semantics: no oldSelf)."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.validator = jsonschema.Draft7Validator(_strict(schema))
        self.cel = celpy.Environment()
        self._programs: dict[str, Any] = {}

    def _program(self, rule: str) -> Any:
        if rule not in self._programs:
            self._programs[rule] = self.cel.program(self.cel.compile(rule))
        return self._programs[rule]

    def _rule_errors(
        self, schema: dict[str, Any], value: Any, old: Any, path: str
    ) -> Iterator[str]:
        for rule in schema.get("x-kubernetes-validations", []):
            bindings = {"self": celpy.json_to_cel(value)}
            if "oldSelf" in rule["rule"]:
                if old is _ABSENT:
                    continue  # transition rules apply to updates of an existing value only
                bindings["oldSelf"] = celpy.json_to_cel(old)
            result = self._program(rule["rule"]).evaluate(bindings)
            if not (isinstance(result, bool | celpy.celtypes.BoolType) and result):
                yield f"{path or '.'}: {rule.get('message', rule['rule'])} (rule: {rule['rule']})"

    def _cel_errors(
        self, schema: dict[str, Any], value: Any, path: str, old: Any = None
    ) -> Iterator[str]:
        """CEL rules on value and below; `old` (the previous object, or _ABSENT) for updates."""
        old = _ABSENT if old is None else old
        yield from self._rule_errors(schema, value, old, path)
        old_map = old if isinstance(old, dict) else {}
        if isinstance(value, dict):
            for key, sub in schema.get("properties", {}).items():
                if key in value:
                    yield from self._cel_errors(sub, value[key], f"{path}.{key}", old_map.get(key))
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict):
                for key, sub_value in value.items():
                    yield from self._cel_errors(extra, sub_value, f"{path}.{key}", old_map.get(key))
        elif isinstance(value, list) and isinstance(schema.get("items"), dict):
            # Old and new list items correlate by name (the list-map key of every keyed list here).
            old_items = (
                {i.get("name"): i for i in old if isinstance(i, dict)}
                if isinstance(old, list)
                else {}
            )
            for index, item in enumerate(value):
                previous = old_items.get(item.get("name")) if isinstance(item, dict) else None
                yield from self._cel_errors(schema["items"], item, f"{path}[{index}]", previous)

    def errors(self, obj: dict[str, Any], old: dict[str, Any] | None = None) -> list[str]:
        """Schema errors, else CEL errors; with `old`, as an update of old to obj."""
        found = [
            f"{'.'.join(str(p) for p in error.absolute_path) or '.'}: {error.message}"
            for error in self.validator.iter_errors(obj)
        ]
        return found or list(self._cel_errors(self.schema, obj, "", old))


_ABSENT = object()


@functools.cache
def _vendored_crd_text(plural: str) -> str:
    return (CRDS / f"trainer.kubeflow.org_{plural}.yaml").read_text()


def vendored_crd(plural: str) -> dict[str, Any]:
    """The vendored CustomResourceDefinition of `plural` (a fresh copy: callers may edit it)."""
    crd: dict[str, Any] = yaml.load(_vendored_crd_text(plural), Loader=yaml.CSafeLoader)
    return crd


def _load_crd_validators() -> dict[str, _CrdValidator]:
    validators = {}
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.load(path.read_text(), Loader=yaml.CSafeLoader)
        (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
        validators[crd["spec"]["names"]["kind"]] = _CrdValidator(
            version["schema"]["openAPIV3Schema"]
        )
    return validators


def _core_errors(obj: dict[str, Any]) -> list[str]:
    errors = []
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"k8s {version}: {'.'.join(map(str, exc.path)) or '.'}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(
                f"k8s {version}: no schema for {obj.get('apiVersion')} {obj.get('kind')}: {exc}"
            )
    return errors


def _as_job(job_template: dict[str, Any], name: str) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {**job_template.get("metadata", {}), "name": name},
        "spec": job_template["spec"],
    }


def _metadata_errors(obj: dict[str, Any]) -> list[str]:
    # ObjectMeta is only `type: object` in CRD schemas: check it as a ConfigMap's metadata.
    probe = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": copy.deepcopy(obj["metadata"])}
    return [f"metadata: {e}" for e in _core_errors(probe)]


@dataclass
class ManifestValidator:
    """Validate rendered objects; `errors(obj)` is empty for a valid object."""

    crds: dict[str, _CrdValidator] = field(default_factory=_load_crd_validators)

    def errors(self, obj: dict[str, Any]) -> list[str]:
        kind = obj.get("kind", "?")
        if kind not in TRAINER_KINDS:
            return _core_errors(obj)
        if obj.get("apiVersion") != "trainer.kubeflow.org/v1alpha1":
            return [f"{kind} must be trainer.kubeflow.org/v1alpha1, got {obj.get('apiVersion')}"]
        errors = self.crds[kind].errors(obj) + _metadata_errors(obj)
        if kind != "TrainJob":
            for replicated in obj["spec"]["template"]["spec"].get("replicatedJobs", []):
                job = _as_job(
                    replicated["template"], f"{obj['metadata']['name']}-{replicated['name']}"
                )
                errors += [f"replicatedJobs[{replicated['name']}]: {e}" for e in _core_errors(job)]
        return errors

    def update_errors(self, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
        """What the API server's transition rules say about replacing old by new (Trainer kinds)."""
        return self.crds[new["kind"]].errors(new, old)

    def assert_valid(self, objects: list[dict[str, Any]]) -> None:
        problems = {
            f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}": errs
            for obj in objects
            if (errs := self.errors(obj))
        }
        assert not problems, json.dumps(problems, indent=2)


# ---------------------------------------------------------------- fake Kubernetes API server

_GROUP_PATH = "/apis/trainer.kubeflow.org/v1alpha1"
_TRAINJOB = re.compile(rf"^{_GROUP_PATH}/namespaces/(?P<ns>[^/]+)/trainjobs(/(?P<name>[^/?]+))?$")
_RUNTIME = re.compile(rf"^{_GROUP_PATH}/namespaces/(?P<ns>[^/]+)/trainingruntimes/(?P<name>[^/]+)$")
_CLUSTER_RUNTIME = re.compile(rf"^{_GROUP_PATH}/clustertrainingruntimes/(?P<name>[^/]+)$")
_CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
_CONFIGMAPS = re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/configmaps$")


@dataclass
class Request:
    method: str
    path: str
    query: str
    body: Any


@dataclass
class FakeCluster:
    """State and script of the fake API server.

    `statuses` is the sequence of `status` values successive GETs of a TrainJob return (the last
    one repeats), standing in for the Trainer controller. `fail` maps "METHOD path-regex" to an
    HTTP status the server answers instead.
    """

    trainer_installed: bool = True
    groups: tuple[tuple[str, str], ...] = (
        ("trainer.kubeflow.org", "v1alpha1"),
        ("jobset.x-k8s.io", "v1alpha2"),
    )
    runtimes: set[str] = field(default_factory=lambda: {"envace"})
    # The `node` container's resources in every runtime served (the chart's defaults).
    runtime_resources: dict[str, Any] = field(
        default_factory=lambda: {
            "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": 1},
            "limits": {"cpu": "16", "memory": "96Gi", "nvidia.com/gpu": 1},
        }
    )
    cluster_runtimes: set[str] = field(default_factory=set)
    gpus: dict[str, int] = field(default_factory=dict)
    # The served TrainJob CRD (None: the vendored one, tests/cluster/crds) and the image of
    # Kubeflow Pipelines' API server Deployment kubeflow/ml-pipeline (None: no KFP).
    trainjob_crd: dict[str, Any] | None = None
    kfp_image: str | None = None
    statuses: list[dict[str, Any]] = field(default_factory=list)
    fail: dict[str, int] = field(default_factory=dict)
    trainjobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    configmaps: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    gets: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def calls(self, method: str, pattern: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and re.search(pattern, r.path)]


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


class _Handler(BaseHTTPRequestHandler):
    cluster: FakeCluster

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        return

    def _send(self, code: int, payload: Any) -> None:
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header(
            "Content-Type", "application/json" if not isinstance(payload, bytes) else "text/plain"
        )
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _handle(self, method: str) -> None:
        path, _, query = self.path.partition("?")
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        cluster = self.cluster
        with cluster.lock:
            cluster.requests.append(Request(method, path, query, body))
            for key, code in cluster.fail.items():
                want_method, pattern = key.split(" ", 1)
                if want_method == method and re.search(pattern, path):
                    return self._send(code, _status(code, "Injected", f"injected {code} for {key}"))
            code, payload = self._route(method, path, body)
        self._send(code, payload)

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        cluster = self.cluster
        if path.startswith(_GROUP_PATH) and not cluster.trainer_installed:
            return 404, b"404 page not found\n"
        if method == "GET" and path in ("/apis", "/apis/"):
            return 200, {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": g,
                        "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                        "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
                    }
                    for g, v in cluster.groups
                ],
            }
        if method == "GET" and path == _GROUP_PATH:
            return 200, {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": "trainer.kubeflow.org/v1alpha1",
                "resources": [
                    {
                        "name": n,
                        "singularName": n[:-1],
                        "namespaced": n != "clustertrainingruntimes",
                        "kind": k,
                        "verbs": ["create", "delete", "get", "list", "patch", "watch"],
                    }
                    for n, k in (
                        ("trainjobs", "TrainJob"),
                        ("trainingruntimes", "TrainingRuntime"),
                        ("clustertrainingruntimes", "ClusterTrainingRuntime"),
                    )
                ],
            }
        if method == "GET" and path == f"{_CRD_PATH}/trainjobs.trainer.kubeflow.org":
            return 200, cluster.trainjob_crd or vendored_crd("trainjobs")
        if method == "GET" and path == "/apis/apps/v1/namespaces/kubeflow/deployments/ml-pipeline":
            if cluster.kfp_image is None:
                return 404, _status(404, "NotFound", 'deployments.apps "ml-pipeline" not found')
            return 200, {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "ml-pipeline", "namespace": "kubeflow"},
                "spec": {
                    "selector": {"matchLabels": {"app": "ml-pipeline"}},
                    "template": {
                        "spec": {"containers": [{"name": "api", "image": cluster.kfp_image}]}
                    },
                },
            }
        if method == "GET" and path == "/api/v1/nodes":
            return 200, {
                "kind": "NodeList",
                "apiVersion": "v1",
                "metadata": {},
                "items": [
                    {
                        "metadata": {"name": n},
                        "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": str(g)}},
                    }
                    for n, g in cluster.gpus.items()
                ],
            }
        if match := _RUNTIME.match(path):
            return self._runtime(
                match["name"] in cluster.runtimes, "TrainingRuntime", match["name"]
            )
        if match := _CLUSTER_RUNTIME.match(path):
            return self._runtime(
                match["name"] in cluster.cluster_runtimes, "ClusterTrainingRuntime", match["name"]
            )
        if match := _TRAINJOB.match(path):
            return self._trainjob(method, match["ns"], match["name"], body)
        if (match := _CONFIGMAPS.match(path)) and method == "POST":
            name = body["metadata"]["name"]
            cluster.configmaps[name] = body
            return 201, body
        return 404, _status(
            404, "NotFound", f"the fake API server has no route for {method} {path}"
        )

    def _runtime(self, found: bool, kind: str, name: str) -> tuple[int, Any]:
        if not found:
            return 404, _status(
                404, "NotFound", f'{kind.lower()}s.trainer.kubeflow.org "{name}" not found'
            )
        container = {"name": "node", "resources": self.cluster.runtime_resources}
        pod = {"template": {"spec": {"template": {"spec": {"containers": [container]}}}}}
        return 200, {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": kind,
            "metadata": {"name": name},
            "spec": {"template": {"spec": {"replicatedJobs": [{"name": "node", **pod}]}}},
        }

    def _trainjob(
        self, method: str, namespace: str, name: str | None, body: Any
    ) -> tuple[int, Any]:
        cluster = self.cluster
        if method == "POST":
            name = body["metadata"]["name"]
            if name in cluster.trainjobs:
                return 409, _status(
                    409, "AlreadyExists", f'trainjobs.trainer.kubeflow.org "{name}" already exists'
                )
            created = copy.deepcopy(body)
            created["metadata"].update(
                uid=str(uuid.uuid4()), namespace=namespace, creationTimestamp="2026-11-29T20:00:00Z"
            )
            cluster.trainjobs[name] = created
            return 201, created
        if name not in cluster.trainjobs:
            return 404, _status(
                404, "NotFound", f'trainjobs.trainer.kubeflow.org "{name}" not found'
            )
        if method == "GET":
            obj = copy.deepcopy(cluster.trainjobs[name])
            if cluster.statuses:
                obj["status"] = cluster.statuses[min(cluster.gets, len(cluster.statuses) - 1)]
            cluster.gets += 1
            return 200, obj
        if method == "DELETE":
            del cluster.trainjobs[name]
            return 200, {"kind": "Status", "apiVersion": "v1", "status": "Success"}
        return 405, _status(405, "MethodNotAllowed", method)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_DELETE(self) -> None:
        self._handle("DELETE")


@dataclass
class FakeApiServer:
    cluster: FakeCluster
    url: str
    kubeconfig: Path


def write_kubeconfig(path: Path, url: str) -> Path:
    """A kubeconfig whose current context is the fake API server at `url` (namespace team-a)."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "tester", "user": {"token": "test-token"}}],
                "contexts": [
                    {
                        "name": "fake",
                        "context": {"cluster": "fake", "user": "tester", "namespace": "team-a"},
                    }
                ],
            }
        )
    )
    return path


@contextlib.contextmanager
def serve_fake_api(tmp_path: Path) -> Iterator[FakeApiServer]:
    """A fake Kubernetes API server on localhost and a kubeconfig pointing at it."""
    cluster = FakeCluster()
    handler = type("Handler", (_Handler,), {"cluster": cluster})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", url)
    try:
        yield FakeApiServer(cluster, url, kubeconfig)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def condition(kind: str, message: str = "", status: str = "True") -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": kind,
        "message": message,
        "lastTransitionTime": "2026-11-29T20:00:00Z",
    }
