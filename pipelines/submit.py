"""`envace pipeline submit`: a compiled pipeline started on a Kubeflow Pipelines backend through
`kfp.Client`, its run parameters checked against the package first (and the store and endpoint
checks the other pipeline commands share).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from envace.errors import UserInputError

__all__ = [
    "DEFAULT_PACKAGE",
    "KFP_CHECK_TIMEOUT_S",
    "KFP_SUBMIT_TIMEOUT_S",
    "check_kfp_host",
    "check_kfp_reachable",
    "check_store",
    "check_store_endpoint",
    "packaged_pipeline",
    "parse_params",
    "submit",
]

DEFAULT_PACKAGE = Path("pipelines") / "envace_pipeline.yaml"
_COMPILE_HINT = f"envace pipeline compile --out {DEFAULT_PACKAGE}"
# IR parameter type -> (converter, what the value must be).
_PARAM_TYPES: dict[str, tuple[type, str]] = {
    "STRING": (str, "text"),
    "NUMBER_INTEGER": (int, "an integer"),
    "NUMBER_DOUBLE": (float, "a number"),
    "BOOLEAN": (bool, "true or false"),
    "STRUCT": (dict, 'a JSON object, e.g. {"pool": "gpu"}'),
    "LIST": (list, 'a JSON list, e.g. [{"key": "nvidia.com/gpu", "operator": "Exists"}]'),
}
# `submit`: seconds the KFP API gets to accept a connection, then to answer its health check
# (a port-forward whose far end is gone accepts connections and never answers).
KFP_CHECK_TIMEOUT_S = 10.0
# `submit`: seconds kfp.Client gets to create the experiment and the run (it sets no timeout).
KFP_SUBMIT_TIMEOUT_S = 120.0
_HOST_EXAMPLE = "--host http://localhost:8080"
_HOST_HINT = (
    "check --host (e.g. `kubectl port-forward -n kubeflow svc/ml-pipeline-ui 8080:80`, then "
    f"{_HOST_EXAMPLE})"
)
_STORE_EXAMPLE = "minio://envace/runs"


# --- store checks (every pipeline command) ----------------------------------------------------
def check_store(uri: str, label: str) -> str:
    """The pipeline's store: parsed as the steps parse it, and an object store, since every step
    runs in its own pod (a local folder would vanish with the pod that wrote it)."""
    from envace.storage.uri import parse_uri

    try:
        parsed = parse_uri(uri)
    except UserInputError as exc:
        raise UserInputError(f"{label}: {exc}") from None
    if parsed.is_local:
        raise UserInputError(
            f"{label}: a local folder; the pipeline's steps run in separate pods that share no "
            f"folder: give minio://bucket/prefix or s3://bucket/prefix, e.g. {_STORE_EXAMPLE}"
        )
    return uri


def check_store_endpoint(endpoint: str, label: str) -> str:
    """The store endpoint as the steps' S3 client reads it (ENVACE_S3_ENDPOINT), with a port or
    a scheme: a bare name would silently mean https on port 443."""
    from envace.storage.settings import _split_endpoint

    host, scheme_secure = _split_endpoint(endpoint, label)
    if scheme_secure is None and urlsplit(f"//{host}").port is None:
        raise UserInputError(
            f"{label}={endpoint!r}: give host:port or http(s)://host[:port], "
            "e.g. http://envace-minio:9000"
        )
    return endpoint


# --- submit -----------------------------------------------------------------------------------
def _package_inputs(package: Path) -> dict[str, str]:
    """Run parameters of a compiled pipeline: name -> IR parameter type."""
    import yaml

    not_compiled = UserInputError(
        f"{package}: not a compiled pipeline (envace pipeline compile writes one)"
    )
    try:
        spec = next(yaml.safe_load_all(package.read_text(encoding="utf-8")), None)
    except FileNotFoundError:
        raise UserInputError(
            f"{package}: no compiled pipeline there; run `{_COMPILE_HINT}`"
        ) from None
    except (yaml.YAMLError, UnicodeDecodeError, IsADirectoryError):
        raise not_compiled from None
    if not isinstance(spec, dict) or not {"pipelineInfo", "root"} <= spec.keys():
        raise not_compiled
    try:
        params = spec["root"].get("inputDefinitions", {}).get("parameters", {})
        return {name: str(p["parameterType"]) for name, p in params.items()}
    except (AttributeError, KeyError, TypeError):
        raise not_compiled from None


def _coerce_param(name: str, text: str, kind: str) -> Any:
    convert, what = _PARAM_TYPES.get(kind, (str, "text"))
    if convert is bool:
        if text.lower() not in ("true", "false"):
            raise UserInputError(f"--param {name}={text}: expected {what}")
        return text.lower() == "true"
    if convert in (dict, list):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if not isinstance(value, convert):
            raise UserInputError(f"--param {name}={text}: expected {what}") from None
        return value
    try:
        return convert(text)
    except ValueError:
        raise UserInputError(f"--param {name}={text}: expected {what}") from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _check_config_param(label: str, value: Mapping[str, Any]) -> None:
    from envace.stages import pipeline_config

    try:
        pipeline_config(value)
    except UserInputError as exc:
        raise UserInputError(f"--param config: {_one_line(exc)}") from None


def _check_rehearsal_param(label: str, text: str) -> None:
    """As the evaluate step reads it (`envace.stages.evaluation_rehearsal`): empty is none."""
    from envace.evaluate.rehearsal import MAX_REHEARSAL_N, parse_rehearsal

    if text.strip():
        try:
            parse_rehearsal(text.strip())
        except UserInputError:
            raise UserInputError(
                f"{label}: expected parallel:N or sequential:N with N 1 to {MAX_REHEARSAL_N} "
                "(e.g. parallel:4), or empty for no test-time rehearsal"
            ) from None


def _check_text_param(label: str, text: str) -> None:
    if not text.strip() or any(ch.isspace() for ch in text):
        raise UserInputError(f"{label}: must be a non-empty name without spaces")


def _at_least(low: int, why: str) -> Callable[[str, int], None]:
    def check(label: str, value: int) -> None:
        if value < low:
            raise UserInputError(f"{label}: must be {low} or more ({why})")

    return check


# Checks of the run parameters of pipelines/pipeline.py, by the parsers the steps use: a bad
# value fails here, not in a pod (eval_rehearsal: only after every training round).
_PARAM_CHECKS: dict[str, Callable[[str, Any], object]] = {
    "config": _check_config_param,
    "store": lambda label, text: check_store(text, label),
    "store_endpoint": lambda label, text: check_store_endpoint(text, label.partition("=")[0]),
    "image": _check_text_param,
    "train_nodes": _at_least(1, "nodes of each train step"),
    "train_gpus_per_node": _at_least(0, "0: the training runtime's resources"),
    "trainjob_runtime": _check_text_param,
    "eval_rehearsal": _check_rehearsal_param,
}


def parse_params(items: Sequence[str], inputs: Mapping[str, str]) -> dict[str, Any]:
    """`KEY=VALUE` flags as typed run parameters of a pipeline with `inputs`, each known one
    checked as the step that reads it would."""
    params: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            raise UserInputError(f"--param {item!r}: expected KEY=VALUE, e.g. train_nodes=2")
        if name not in inputs:
            raise UserInputError(
                f"--param {name}: the pipeline has no such parameter; it takes "
                f"{', '.join(sorted(inputs))}"
            )
        params[name] = _coerce_param(name, text, inputs[name])
        check = _PARAM_CHECKS.get(name)
        if check is not None:
            check(f"--param {item}", params[name])
    return params


def submit(
    client: Any,
    package: Path,
    params: Mapping[str, Any],
    *,
    experiment: str,
    run_name: str | None = None,
    namespace: str | None = None,
    service_account: str | None = None,
    enable_caching: bool | None = None,
) -> str:
    """Start a run of the compiled pipeline through a `kfp.Client`; returns the run id."""
    result = client.create_run_from_pipeline_package(
        str(package),
        arguments=dict(params),
        run_name=run_name,
        experiment_name=experiment,
        namespace=namespace,
        service_account=service_account,
        enable_caching=enable_caching,
    )
    return str(result.run_id)


def check_kfp_host(host: str) -> str:
    """`--host` as kfp.Client gets it: an http(s) URL, without a trailing `/`. kfp itself would
    put https:// before anything else and fail later, on a name that resolves nowhere."""
    text = host.strip()
    try:
        parts = urlsplit(text)
        bad_port = parts.port == 0
    except ValueError as exc:  # a port that is not a number, an unclosed IPv6 bracket
        raise UserInputError(f"--host {host!r}: {exc}; give a URL, e.g. {_HOST_EXAMPLE}") from None
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or bad_port
        or parts.query
        or parts.fragment
        or not text.isprintable()
        or " " in text
    ):
        raise UserInputError(
            f"--host {host!r}: not an http(s) URL of the Kubeflow Pipelines API; give one, "
            f"e.g. {_HOST_EXAMPLE}"
        )
    return text.rstrip("/")


def _unreachable(host: str, reason: str) -> UserInputError:
    return UserInputError(f"cannot reach Kubeflow Pipelines at {host}: {reason}; {_HOST_HINT}")


def check_kfp_reachable(host: str) -> None:
    """One health check of the KFP API at `host`, bounded by KFP_CHECK_TIMEOUT_S: kfp.Client
    sets no timeout (a silent server would hang it) and shows a urllib3 traceback when nothing
    listens. Any HTTP answer but 404 / 5xx counts: an auth front may answer 302 or 401."""
    import httpx

    url = f"{host}/apis/v2beta1/healthz"
    try:
        response = httpx.get(url, timeout=KFP_CHECK_TIMEOUT_S, trust_env=False)
    except httpx.ConnectTimeout:
        raise _unreachable(host, f"no connection within {KFP_CHECK_TIMEOUT_S:g} s") from None
    except httpx.TimeoutException:
        raise _unreachable(
            host, f"it accepted the connection but did not answer within {KFP_CHECK_TIMEOUT_S:g} s"
        ) from None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise _unreachable(host, _one_line(exc) or type(exc).__name__) from None
    if response.status_code == 404 or response.status_code >= 500:
        raise _unreachable(
            host,
            f"GET {url} answered {response.status_code} {response.reason_phrase} (no KFP API there?)",
        )


def _api_error(host: str, exc: Exception) -> UserInputError:
    """kfp.Client's failure as one line: the API's refusal, or the connection's."""
    from kfp_server_api.exceptions import ApiException

    if isinstance(exc, ApiException):
        body = str(exc.body or "")
        with contextlib.suppress(ValueError, AttributeError):
            body = str(json.loads(body).get("message") or body)  # KFP's error JSON
        detail = " ".join(body.split())[:300]
        return UserInputError(
            f"Kubeflow Pipelines at {host} refused the run: {exc.status} {exc.reason}"
            f"{': ' + detail if detail else ''}; check --namespace, --experiment, --package and "
            "your access to the KFP API"
        )
    return _unreachable(host, _one_line(exc) or type(exc).__name__)


def _start_run(host: str, start: Callable[[], str]) -> str:
    """`start()` (kfp.Client calls) in a daemon thread, given up after KFP_SUBMIT_TIMEOUT_S;
    its connection and API errors become one-line messages."""
    from kfp_server_api.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    outcome: list[Any] = []

    def work() -> None:
        try:
            outcome.append(start())
        except BaseException as exc:  # handed to the waiting thread
            outcome.append(exc)

    worker = threading.Thread(target=work, name="envace-kfp-submit", daemon=True)
    worker.start()
    worker.join(KFP_SUBMIT_TIMEOUT_S)
    if not outcome:
        raise UserInputError(
            f"Kubeflow Pipelines at {host} did not finish starting the run within "
            f"{KFP_SUBMIT_TIMEOUT_S:g} s; it may have started anyway: look in its UI before "
            "submitting again"
        )
    result = outcome[0]
    if isinstance(result, ApiException | HTTPError | OSError):  # OSError: TimeoutError too
        raise _api_error(host, result) from result
    if isinstance(result, BaseException):
        raise result
    return str(result)


def packaged_pipeline() -> Path:
    """The compiled pipeline shipped with the `pipelines` package (the checked-in file)."""
    import pipelines

    return Path(pipelines.__file__).resolve().parent / DEFAULT_PACKAGE.name


def _submit(args: argparse.Namespace) -> int:
    import kfp

    host = check_kfp_host(args.host)
    package = args.package or packaged_pipeline()
    inputs = _package_inputs(package)
    params = parse_params(args.param, inputs)
    if args.config is not None or args.overrides:
        from envace.config import load_config
        from envace.stages import config_struct

        params["config"] = config_struct(load_config(args.config, args.overrides))
    check_kfp_reachable(host)  # everything local is checked: now the one remote question

    def start() -> str:
        with warnings.catch_warnings():
            # kfp.Client's notice that it needs a KFP v2 backend (this pipeline needs one anyway).
            warnings.filterwarnings("ignore", message=".*only works with Kubeflow Pipeline v2.*")
            client = kfp.Client(host=host, namespace=args.namespace or "kubeflow")
        return submit(
            client,
            package,
            params,
            experiment=args.experiment,
            run_name=args.run_name,
            namespace=args.namespace,
            service_account=args.service_account,
            enable_caching=False if args.no_cache else None,
        )

    run_id = _start_run(host, start)
    print(f"started run {run_id} in experiment {args.experiment!r} at {host}")
    print(f"results: <store>/{run_id}/ (checkpoints, rollouts, evaluation)")
    return 0
