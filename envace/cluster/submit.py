"""Create, follow and cancel EnvACE TrainJobs through the Kubernetes API (the `kubernetes` client).

`TrainJobClient` is the only code here that talks to the API server; `follow` needs nothing but
`get`, so it works on any `TrainJobReader`. Every API failure becomes a `ClusterError` that says
what failed and how to fix it: a missing Kubeflow Trainer names the prerequisite, a missing
runtime names the chart, a 403 names the RBAC the chart grants.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from envace.cluster.trainjob import (
    GROUP,
    PLURAL,
    VERSION,
    TrainJobSpec,
    build_config_map,
    build_trainjob,
    with_runtime_resources,
)
from envace.errors import EnvaceError

__all__ = [
    "ClusterError",
    "FollowTimeoutError",
    "TrainJobClient",
    "TrainJobReader",
    "TrainJobState",
    "api_errors",
    "connect",
    "context_namespace",
    "follow",
]

logger = logging.getLogger(__name__)

_SA_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
_REQUEST_TIMEOUT = 30
_PREREQ_HELP = "see docs/cluster.md, Prerequisites"


class ClusterError(EnvaceError):
    """The cluster refused or cannot serve a request; the message names the cause and the fix."""


class FollowTimeoutError(ClusterError):
    """A followed TrainJob did not finish within the allowed time."""


class TrainJobReader(Protocol):
    """What `follow` needs: read one TrainJob object by name."""

    namespace: str

    def get(self, name: str) -> dict[str, Any]: ...


# True while one of our API calls runs: urllib3's "Retrying ..." warnings are then ours to report.
_OWN_CALL: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "envace_cluster_call", default=False
)


class _QuietRetries(logging.Filter):
    """Turn urllib3's "Retrying (...)" warnings during our API calls into debug records.

    A retry that succeeds needs no warning, and one that fails ends in a ClusterError that says
    what failed and how to fix it; the warning before it was noise. Other urllib3 users (the
    store's S3 client) keep their warnings.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if _OWN_CALL.get() and str(record.msg).startswith("Retrying"):
            logger.debug("urllib3: %s", record.getMessage())
            return False
        return True


logging.getLogger("urllib3.connectionpool").addFilter(_QuietRetries())


def _status_message(exc: ApiException) -> str:
    """The `message` of the API server's Status body, else the body or reason, on one line."""
    body = exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else exc.body
    try:
        status = json.loads(body or "")
    except ValueError:
        status = None
    if isinstance(status, dict) and isinstance(status.get("message"), str) and status["message"]:
        text = status["message"]
    else:
        text = body or exc.reason or ""
    return " ".join(str(text).split())[:300]


def _api_error(exc: ApiException, what: str) -> ClusterError:
    """Translate an API failure into a message the user can act on."""
    if exc.status == 401:
        return ClusterError(f"{what}: the API server rejected the credentials (401); refresh them")
    if exc.status == 403:
        return ClusterError(
            f"{what}: forbidden (403). The identity in use lacks the Role charts/envace grants "
            "(rbac.create); bind it through rbac.extraSubjects or run as the chart's ServiceAccount"
        )
    if exc.status == 409:
        return ClusterError(f"{what}: it already exists; pick another --name")
    return ClusterError(f"{what}: HTTP {exc.status}: {_status_message(exc)}")


@contextlib.contextmanager
def api_errors(what: str, host: str) -> Iterator[None]:
    """Turn API and connection failures inside the block into ClusterErrors about `what`."""
    token = _OWN_CALL.set(True)
    try:
        yield
    except ApiException as exc:
        raise _api_error(exc, what) from exc
    except HTTPError as exc:
        raise ClusterError(
            f"{what}: cannot reach the Kubernetes API server at {host} ({exc.__class__.__name__}); "
            "check --kubeconfig / --context and that the cluster is up"
        ) from exc
    finally:
        _OWN_CALL.reset(token)


def _in_cluster() -> bool:
    default = os.path.expanduser(k8s_config.kube_config.KUBE_CONFIG_DEFAULT_LOCATION)
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not os.path.exists(default)


def _kubeconfig_problem(exc: Exception) -> str:
    """One line on why a kubeconfig did not load (a YAML error's own text spans several lines)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        where = f" at line {exc.problem_mark.line + 1}" if exc.problem_mark else ""
        return f"not valid YAML ({exc.problem}{where})"
    if isinstance(exc, yaml.YAMLError):
        return "not valid YAML"
    if isinstance(exc, UnicodeDecodeError):
        return "not UTF-8 text"
    if isinstance(exc, (TypeError, AttributeError, KeyError, ValueError)):
        return "not a kubeconfig (a mapping with clusters, users, contexts and current-context)"
    return " ".join(str(exc).split())


@contextlib.contextmanager
def _loading_kubeconfig(kubeconfig: str | None) -> Iterator[None]:
    """Turn every way a kubeconfig can fail to load into one ClusterError naming the file.

    The client parses the file itself: broken YAML surfaces as a yaml error, and a file that is
    YAML but not a kubeconfig (a list, a number, a context that is not a mapping) as a
    TypeError / AttributeError / KeyError from inside the client.
    """
    try:
        yield
    except (
        k8s_config.ConfigException,
        OSError,
        yaml.YAMLError,
        TypeError,
        AttributeError,
        KeyError,
        ValueError,
    ) as exc:
        source = kubeconfig or os.environ.get("KUBECONFIG", "~/.kube/config")
        raise ClusterError(
            f"cannot load the kubeconfig ({source}): {_kubeconfig_problem(exc)}. "
            "Pass --kubeconfig FILE / --context NAME, or set KUBECONFIG"
        ) from exc


def _pod_namespace() -> str:
    with open(_SA_NAMESPACE) as handle:
        return handle.read().strip()


def _kubeconfig_namespace(kubeconfig: str | None, context: str | None) -> tuple[str, str]:
    with _loading_kubeconfig(kubeconfig):
        contexts, active = k8s_config.list_kube_config_contexts(kubeconfig)
        chosen = next((c for c in contexts if c["name"] == context), None) if context else active
        if chosen is None:
            raise k8s_config.ConfigException(f"no context named {context!r}")
        name = str(chosen["name"])
        namespace = (chosen.get("context") or {}).get("namespace")
    if namespace:
        return str(namespace), f"the namespace of kubeconfig context {name!r}"
    return "default", f"kubeconfig context {name!r} sets no namespace"


def context_namespace(kubeconfig: str | None = None, context: str | None = None) -> tuple[str, str]:
    """The namespace `connect` would use and where it comes from, without contacting a cluster.

    For dry runs, which must say which namespace they assumed. Raises ClusterError when no
    kubeconfig (or no such context) can be loaded.
    """
    if kubeconfig is None and context is None and _in_cluster():
        try:
            return _pod_namespace(), "this pod's namespace"
        except OSError as exc:
            raise ClusterError(f"cannot read this pod's namespace ({_SA_NAMESPACE})") from exc
    return _kubeconfig_namespace(kubeconfig, context)


def connect(kubeconfig: str | None = None, context: str | None = None) -> tuple[Any, str]:
    """An ApiClient and the namespace of the active context (in-cluster: the pod's namespace)."""
    configuration = k8s.Configuration()
    if kubeconfig is None and context is None and _in_cluster():
        k8s_config.load_incluster_config(client_configuration=configuration)
        namespace = _pod_namespace()
    else:
        with _loading_kubeconfig(kubeconfig):
            k8s_config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        namespace, _ = _kubeconfig_namespace(kubeconfig, context)
    # One retry of a failed connection (e.g. a pooled keep-alive connection the server closed);
    # _QuietRetries keeps urllib3's warning about it off the terminal.
    configuration.retries = 1
    return k8s.ApiClient(configuration), namespace


@dataclass
class TrainJobClient:
    """TrainJobs (and their config ConfigMaps) of one namespace."""

    api_client: Any
    namespace: str
    custom: Any = field(init=False)
    core: Any = field(init=False)

    def __post_init__(self) -> None:
        self.custom = k8s.CustomObjectsApi(self.api_client)
        self.core = k8s.CoreV1Api(self.api_client)

    @property
    def host(self) -> str:
        return str(self.api_client.configuration.host)

    def _call(self, what: str) -> contextlib.AbstractContextManager[None]:
        return api_errors(what, self.host)

    def preflight(self, runtime: str, runtime_kind: str = "TrainingRuntime") -> None:
        """Fail with the fix when Kubeflow Trainer or the referenced runtime is missing."""
        try:
            with self._call("checking the Kubeflow Trainer API"):
                resources = self.custom.get_api_resources(
                    GROUP, VERSION, _request_timeout=_REQUEST_TIMEOUT
                )
        except ClusterError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                raise ClusterError(
                    f"Kubeflow Trainer is not installed on the cluster at {self.host}: it does not "
                    f"serve {GROUP}/{VERSION}. Install Kubeflow Trainer v2 with JobSet, then "
                    f"charts/envace ({_PREREQ_HELP})"
                ) from exc
            raise
        served = {resource.name for resource in resources.resources or []}
        if PLURAL not in served:
            raise ClusterError(
                f"{GROUP}/{VERSION} on {self.host} serves no '{PLURAL}' (found: "
                f"{', '.join(sorted(served)) or 'nothing'}); "
                f"install Kubeflow Trainer v2 ({_PREREQ_HELP})"
            )
        self.check_runtime(runtime, runtime_kind)

    def check_runtime(self, runtime: str, runtime_kind: str) -> dict[str, Any]:
        """The referenced training runtime; fails with the install command when it does not exist."""
        where = (
            "the cluster"
            if runtime_kind == "ClusterTrainingRuntime"
            else f"namespace {self.namespace}"
        )
        try:
            with self._call(f"reading {runtime_kind} {runtime!r}"):
                if runtime_kind == "ClusterTrainingRuntime":
                    obj: dict[str, Any] = self.custom.get_cluster_custom_object(
                        GROUP,
                        VERSION,
                        "clustertrainingruntimes",
                        runtime,
                        _request_timeout=_REQUEST_TIMEOUT,
                    )
                else:
                    obj = self.custom.get_namespaced_custom_object(
                        GROUP,
                        VERSION,
                        self.namespace,
                        "trainingruntimes",
                        runtime,
                        _request_timeout=_REQUEST_TIMEOUT,
                    )
        except ClusterError as exc:
            if isinstance(exc.__cause__, ApiException) and exc.__cause__.status == 404:
                raise ClusterError(
                    f"{runtime_kind} {runtime!r} not found in {where}: install it with "
                    f"`helm install envace charts/envace -n {self.namespace}` or pass --runtime"
                ) from exc
            raise
        return obj

    def create(self, spec: TrainJobSpec, config_text: str) -> dict[str, Any]:
        """Create the TrainJob, then its config ConfigMap owned by it; returns the created TrainJob.

        The ConfigMap comes second so it can carry the TrainJob's uid as owner (garbage-collected
        with it); pods wait for it to appear. If it cannot be created the TrainJob is removed again.
        """
        if spec.gpus_per_node and (spec.cpu is None or spec.memory is None):
            # resourcesPerNode replaces the runtime's resources as a whole: GPUs alone would
            # leave the pods with no CPU or memory request.
            runtime = self.check_runtime(spec.runtime, spec.runtime_kind)
            spec = with_runtime_resources(spec, runtime)
        body = build_trainjob(spec)
        with self._call(f"creating TrainJob {self.namespace}/{spec.name}"):
            created: dict[str, Any] = self.custom.create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, body, _request_timeout=_REQUEST_TIMEOUT
            )
        config_map = build_config_map(spec, config_text, owner=created)
        try:
            with self._call(f"creating ConfigMap {config_map['metadata']['name']}"):
                self.core.create_namespaced_config_map(
                    self.namespace, config_map, _request_timeout=_REQUEST_TIMEOUT
                )
        except ClusterError:
            self.delete(spec.name)
            raise
        return created

    def get(self, name: str) -> dict[str, Any]:
        with self._call(f"reading TrainJob {self.namespace}/{name}"):
            obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, _request_timeout=_REQUEST_TIMEOUT
            )
        return obj

    def delete(self, name: str) -> None:
        """Delete the TrainJob; its JobSet, pods and config ConfigMap are garbage-collected."""
        with self._call(f"deleting TrainJob {self.namespace}/{name}"):
            self.custom.delete_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                name,
                propagation_policy="Background",
                _request_timeout=_REQUEST_TIMEOUT,
            )


def _true_conditions(status: Mapping[str, Any]) -> dict[str, str]:
    return {
        str(c.get("type")): str(c.get("message") or c.get("reason") or "")
        for c in status.get("conditions") or []
        if c.get("status") == "True"
    }


def _jobs_summary(status: Mapping[str, Any]) -> str:
    parts = []
    for job in status.get("jobsStatus") or []:
        counts = " ".join(
            f"{key}={job[key]}"
            for key in ("active", "ready", "succeeded", "failed", "suspended")
            if job.get(key)
        )
        parts.append(f"{job.get('name', '?')}: {counts or 'no pods'}")
    return ", ".join(parts)


@dataclass(frozen=True)
class TrainJobState:
    """What a TrainJob's status says, reduced to what a person following it needs."""

    phase: str
    message: str = ""
    jobs: str = ""
    progress: int | None = None
    eta_seconds: int | None = None
    metrics: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> TrainJobState:
        status = obj.get("status") or {}
        conditions = _true_conditions(status)
        jobs = _jobs_summary(status)
        phase = "Pending"
        for decisive in ("Complete", "Failed", "Suspended"):
            if decisive in conditions:
                phase = decisive
                break
        else:
            if any(j.get("active") or j.get("ready") for j in status.get("jobsStatus") or []):
                phase = "Running"
        trainer = status.get("trainerStatus") or {}
        return cls(
            phase=phase,
            message=conditions.get(phase, ""),
            jobs=jobs,
            progress=trainer.get("progressPercentage"),
            eta_seconds=trainer.get("estimatedRemainingSeconds"),
            metrics=tuple((str(m["name"]), str(m["value"])) for m in trainer.get("metrics") or []),
        )

    @property
    def finished(self) -> bool:
        return self.phase in ("Complete", "Failed")

    @property
    def succeeded(self) -> bool:
        return self.phase == "Complete"

    def describe(self) -> str:
        """One line, e.g. `Running | node: active=2 ready=2 | 42% | ETA 0:13:20 | loss=0.53`."""
        parts = [self.phase]
        if self.jobs:
            parts.append(self.jobs)
        if self.progress is not None:
            parts.append(f"{self.progress}%")
        if self.eta_seconds is not None:
            parts.append(f"ETA {timedelta(seconds=self.eta_seconds)}")
        if self.metrics:
            parts.append(" ".join(f"{name}={value}" for name, value in self.metrics))
        if self.message:
            parts.append(self.message)
        return " | ".join(parts)


def follow(
    api: TrainJobReader,
    name: str,
    *,
    interval: float,
    emit: Callable[[str], None],
    timeout: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> TrainJobState:
    """Poll the TrainJob until it completes or fails, emitting a line whenever its state changes.

    Polling rather than a watch stream: a watch silently ends on API-server timeouts and proxies,
    and a TrainJob changes state rarely. Raises FollowTimeoutError after `timeout` seconds.
    """
    deadline = None if timeout is None else clock() + timeout
    last = ""
    while True:
        state = TrainJobState.from_object(api.get(name))
        line = state.describe()
        if line != last:
            emit(f"{api.namespace}/{name}: {line}")
            last = line
        if state.finished:
            return state
        if deadline is not None and clock() >= deadline:
            raise FollowTimeoutError(
                f"TrainJob {api.namespace}/{name} did not finish within {timeout:g} s "
                f"(last state: {state.phase}); raise --timeout or follow it with "
                f"`envace cluster status {name} --follow`"
            )
        sleep(interval)
