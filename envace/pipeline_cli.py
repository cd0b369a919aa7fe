"""`envace pipeline ...`: the Kubeflow Pipelines v2 pipeline (pipelines/), compiled, submitted or
run locally, and the train step a TrainJob runs.

    envace pipeline compile --out pipelines/envace_pipeline.yaml [--rounds N --gpus N ...]
    envace pipeline submit --host URL --experiment NAME [--param KEY=VALUE ...]
    envace pipeline run-local --store URI [--config F --set KEY=VALUE ...]
    envace pipeline train-step --config F --checkpoint URI --trajectories URI --out URI

kfp and the stage code are imported inside the handlers, so `envace --help` stays fast and works
without the `pipelines` extra.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from envace.errors import EnvaceError, UserInputError

if TYPE_CHECKING:
    from pipelines.pipeline import PipelineOptions

__all__ = [
    "DEFAULT_PACKAGE",
    "KFP_CHECK_TIMEOUT_S",
    "KFP_SUBMIT_TIMEOUT_S",
    "LocalRun",
    "check_kfp_host",
    "check_kfp_reachable",
    "check_store",
    "check_store_endpoint",
    "compile_pipeline",
    "packaged_pipeline",
    "parse_params",
    "pipeline_options",
    "register",
    "run_local",
    "submit",
]

log = logging.getLogger(__name__)

DEFAULT_PACKAGE = Path("pipelines") / "envace_pipeline.yaml"
_COMPILE_HINT = f"envace pipeline compile --out {DEFAULT_PACKAGE}"
# IR parameter type -> (converter, what the value must be).
_PARAM_TYPES: dict[str, tuple[type, str]] = {
    "STRING": (str, "text"),
    "NUMBER_INTEGER": (int, "an integer"),
    "NUMBER_DOUBLE": (float, "a number"),
    "BOOLEAN": (bool, "true or false"),
}
# kfp's memory pattern, less the suffix K, which Kubernetes does not accept (it wants k).
_KFP_MEMORY = re.compile(r"^[0-9]+(Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
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


# --- shared arguments -------------------------------------------------------------------------
def _config_args(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--config", type=Path, default=None, help=f"YAML config ({what})")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config value, e.g. --set train.lr=1e-5 (repeatable)",
    )


def _pipeline_args(parser: argparse.ArgumentParser) -> None:
    from pipelines.components import DEFAULT_IMAGE

    parser.add_argument(
        "--rounds", type=int, default=2, help="rollout -> train rounds, unrolled (default: 2)"
    )
    parser.add_argument(
        "--image",
        default=DEFAULT_IMAGE,
        help=f"default of the `image` run parameter (default: {DEFAULT_IMAGE})",
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="GPUs of each model step (warm start, rollout, train, evaluate); 0: CPU (default)",
    )
    parser.add_argument("--cpu", default="2", help="CPUs of each model step (default: 2)")
    parser.add_argument("--memory", default="8Gi", help="memory of each model step (default: 8Gi)")
    parser.add_argument(
        "--gpu-node-selector",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="node label the model steps require, e.g. pool=gpu (repeatable)",
    )
    parser.add_argument(
        "--gpu-toleration",
        action="append",
        default=None,
        metavar="KEY[=VALUE][:EFFECT]",
        help="taint the model steps tolerate (repeatable); default with --gpus > 0: "
        "nvidia.com/gpu:NoSchedule",
    )
    parser.add_argument(
        "--shm-size", default="2Gi", help="memory-backed /dev/shm of model steps (default: 2Gi)"
    )
    parser.add_argument(
        "--secret",
        default="envace-store",
        help="Secret with the store credentials, keys access-key / secret-key "
        "(default: envace-store, what charts/envace creates)",
    )
    parser.add_argument(
        "--store",
        default=None,
        help="default of the `store` run parameter (default: minio://envace/runs)",
    )
    parser.add_argument(
        "--store-endpoint",
        default=None,
        help="default of the `store_endpoint` run parameter (default: http://envace-minio:9000)",
    )
    _config_args(parser, "default of the `config` run parameter; default: the built-in defaults")


def _check_kfp_memory(value: str, flag: str) -> str:
    """A memory quantity kfp also accepts: it takes whole numbers only, and K but not k."""
    from envace.cluster.trainjob import check_memory_quantity

    check_memory_quantity(value, flag)
    if not _KFP_MEMORY.fullmatch(value):
        raise UserInputError(
            f"{flag} {value!r}: pipeline steps take a whole number with an optional suffix"
            f" Ki, M, Mi, G, Gi, ..., e.g. {flag} 1536Mi rather than 1.5Gi"
        )
    return value


def pipeline_options(args: argparse.Namespace) -> PipelineOptions:
    """`PipelineOptions` from the compile flags."""
    from envace.cluster.trainjob import (
        check_cpu_quantity,
        check_memory_quantity,
        parse_key_value,
        parse_toleration,
    )
    from envace.config import load_config
    from envace.stages import config_json
    from pipelines.pipeline import DEFAULT_STORE, DEFAULT_STORE_ENDPOINT, PipelineOptions

    if args.rounds < 0:
        raise UserInputError(f"--rounds {args.rounds}: must be 0 or more")
    if args.gpus < 0:
        raise UserInputError(f"--gpus {args.gpus}: must be 0 or more (0: CPU steps)")
    if args.store is not None:
        check_store(args.store, f"--store {args.store!r}")
    if args.store_endpoint is not None:
        check_store_endpoint(args.store_endpoint, "--store-endpoint")
    check_cpu_quantity(args.cpu, "--cpu")
    _check_kfp_memory(args.memory, "--memory")
    check_memory_quantity(args.shm_size, "--shm-size")
    tolerations = None
    if args.gpu_toleration is not None:
        tolerations = tuple(parse_toleration(t) for t in args.gpu_toleration)
    return PipelineOptions(
        config_json=config_json(load_config(args.config, args.overrides)),
        rounds=args.rounds,
        image=args.image,
        gpus=args.gpus,
        cpu=args.cpu,
        memory=args.memory,
        gpu_node_selector=dict(
            parse_key_value(s, "--gpu-node-selector") for s in args.gpu_node_selector
        ),
        gpu_tolerations=tolerations,
        shm_size=args.shm_size,
        secret=args.secret,
        store=args.store or DEFAULT_STORE,
        store_endpoint=args.store_endpoint or DEFAULT_STORE_ENDPOINT,
    )


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


# --- compile ----------------------------------------------------------------------------------
def check_out_path(out: Path) -> None:
    """Refuse an output path kfp cannot write, before anything is compiled: kfp's own errors
    are a bare ValueError (the suffix) or an OSError naming a temporary detail."""
    if out.suffix not in (".yaml", ".yml"):
        raise UserInputError(
            f"--out {out}: the compiled pipeline is YAML; give a file path ending in .yaml,"
            f" e.g. --out {DEFAULT_PACKAGE}"
        )
    if out.is_dir():
        raise UserInputError(f"--out {out}: is a folder; give a file path ending in .yaml")
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # compile creates the missing folders below this one
    if not folder.is_dir():
        raise UserInputError(f"--out {out}: {folder} is a file, not a folder; choose another path")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UserInputError(f"--out {out}: cannot write in {folder}; choose a writable folder")


def compile_pipeline(options: PipelineOptions, out: Path) -> Path:
    """Write the pipeline for `options` as KFP IR YAML to `out`.

    kfp streams the YAML into the file it is given, so it writes a scratch copy and `out` is
    replaced atomically: a failure never leaves a half-written pipeline where one was.
    """
    from kfp import compiler

    from envace.tasks.io import atomic_write_text
    from pipelines.pipeline import build_pipeline

    check_out_path(out)
    with tempfile.TemporaryDirectory(prefix="envace-pipeline-") as scratch:
        staged = Path(scratch) / "pipeline.yaml"
        compiler.Compiler().compile(build_pipeline(options), str(staged))
        text = staged.read_text(encoding="utf-8")
    atomic_write_text(out, text)
    return out


def _compile(args: argparse.Namespace) -> int:
    check_out_path(args.out)  # before the config is loaded: a typo here fails at once
    out = compile_pipeline(pipeline_options(args), args.out)
    print(f"wrote {out} ({args.rounds} round(s)); upload it in the Kubeflow Pipelines UI")
    return 0


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
    try:
        return convert(text)
    except ValueError:
        raise UserInputError(f"--param {name}={text}: expected {what}") from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())


def _check_config_param(label: str, text: str) -> None:
    from envace.stages import pipeline_config

    try:
        pipeline_config(text)
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
        from envace.stages import config_json

        params["config"] = config_json(load_config(args.config, args.overrides))
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


# --- run-local --------------------------------------------------------------------------------
@dataclass(frozen=True)
class LocalRun:
    """What a local run produced: the final checkpoint, the evaluation (its metrics loaded) and
    the folder with KFP's own outputs."""

    checkpoint_uri: str
    evaluation_uri: str
    metrics: dict[str, Any]
    pipeline_root: Path


_LOCAL_NOOP_WARNINGS = (
    # Resources, images and Kubernetes settings mean nothing to a local subprocess.
    r".*have no effect in the current local runner.*",
    r".*non-Python base image.*",
)


@contextlib.contextmanager
def _local_environment() -> Iterator[None]:
    """Component subprocesses import this envace; KFP's notes about settings they ignore
    (resources, image, Kubernetes) are silenced."""
    import envace

    source_root = str(Path(envace.__file__).resolve().parents[1])
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (source_root, previous) if p)
    try:
        with warnings.catch_warnings():
            for pattern in _LOCAL_NOOP_WARNINGS:
                warnings.filterwarnings("ignore", message=pattern)
            yield
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def _check_store_reachable(store: str) -> None:
    """One request to a minio:// or s3:// store before any step starts: a wrong endpoint or
    credentials then fail here, in one line, instead of inside the first step's log."""
    from envace.storage.artifacts import open_store
    from envace.storage.manifest import MANIFEST_NAME
    from envace.storage.uri import join_key

    backend, prefix = open_store(store)
    backend.exists(join_key(prefix, MANIFEST_NAME))


def _local_endpoint(store: str, default: str) -> str:
    """The store endpoint the components get: this machine's ENVACE_S3_* settings."""
    from envace.storage.settings import S3Settings
    from envace.storage.uri import parse_uri

    if parse_uri(store).is_local:
        return default
    return S3Settings.from_env().require(store).endpoint_url


def run_local(options: PipelineOptions, store: str, pipeline_root: Path) -> LocalRun:
    """Run the whole pipeline with KFP's local SubprocessRunner (this Python, no containers).

    `pipeline_root` (a local folder) gets KFP's outputs (metrics, the report); the artifacts go
    to `store`, which the components read and write themselves.
    """
    from kfp import local

    from envace.storage.artifacts import fetch_dir
    from envace.storage.uri import parse_uri
    from pipelines.pipeline import build_pipeline

    if parse_uri(store).is_local:
        store = str(Path(parse_uri(store).path).resolve())
    else:
        _check_store_reachable(store)
    pipeline_root = pipeline_root.resolve()
    pipeline_root.mkdir(parents=True, exist_ok=True)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root))
    pipeline = build_pipeline(options)
    endpoint = _local_endpoint(store, options.store_endpoint)
    with _local_environment():
        try:
            task = pipeline(config=options.config_json, store=store, store_endpoint=endpoint)
        except RuntimeError as exc:
            raise EnvaceError(
                f"the local pipeline run failed: {exc}; the failed step's log is above"
            ) from exc
    outputs = task.outputs
    evaluation = str(outputs["evaluation"])
    with tempfile.TemporaryDirectory(prefix="envace-eval-") as tmp:
        fetch_dir(evaluation, Path(tmp))
        metrics = json.loads((Path(tmp) / "metrics.json").read_text(encoding="utf-8"))
    return LocalRun(str(outputs["checkpoint"]), evaluation, metrics, pipeline_root)


def _run_local(args: argparse.Namespace) -> int:
    from envace.config import load_config
    from envace.report import text_table
    from envace.stages import config_json
    from pipelines.pipeline import PipelineOptions

    if args.rounds < 0:
        raise UserInputError(f"--rounds must be 0 or more, got {args.rounds}")
    cfg = load_config(args.config, args.overrides)
    options = PipelineOptions(config_json=config_json(cfg), rounds=args.rounds)
    result = run_local(options, args.store, args.pipeline_root)
    keys = ("success_rate", "valid_call_rate", "rehearsal_fidelity", "n_tasks")
    print(text_table(["metric", "value"], [(k, result.metrics.get(k)) for k in keys]))
    print(f"final checkpoint: {result.checkpoint_uri}")
    print(f"evaluation:       {result.evaluation_uri}")
    print(f"KFP outputs:      {result.pipeline_root}")
    return 0


# --- train-step -------------------------------------------------------------------------------
def _train_step(args: argparse.Namespace) -> int:
    from envace.config import load_config
    from envace.stages import train

    if args.total_iterations is not None and args.total_iterations < 1:
        raise UserInputError(
            f"--total-iterations {args.total_iterations}: must be 1 or more (the RL iterations "
            "the lr schedule spans: the pipeline's rounds)"
        )
    cfg = load_config(args.config, args.overrides)
    trained = train(
        cfg,
        args.checkpoint,
        args.trajectories,
        args.out,
        total_iterations=args.total_iterations,
    )
    from envace.train.run import leave_job

    leave_job(cfg)
    print(f"committed {trained.uri}")
    return 0


# --- wiring -----------------------------------------------------------------------------------
def _add_compile(sub: Any) -> None:
    parser = sub.add_parser(
        "compile",
        help="write the Kubeflow pipeline as IR YAML (upload it in the KFP UI)",
        description="Compile prepare -> warm start -> (rollout -> train) x rounds -> evaluate to "
        "KFP v2 IR YAML. Resources, GPU placement, /dev/shm and the credentials Secret are fixed "
        "here; config, store, image and TrainJob settings stay run parameters.",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_PACKAGE,
        help=f"output file (default: {DEFAULT_PACKAGE})",
    )
    _pipeline_args(parser)
    parser.set_defaults(func=_compile)


def _add_submit(sub: Any) -> None:
    parser = sub.add_parser(
        "submit",
        help="start a run of the compiled pipeline on Kubeflow Pipelines (kfp.Client)",
        description="Start a run of a compiled pipeline. --config/--set replace the `config` "
        "parameter; --param sets any run parameter.",
    )
    parser.add_argument(
        "--host", required=True, help="KFP API endpoint, e.g. http://localhost:8080"
    )
    parser.add_argument("--experiment", default="envace", help="experiment (default: envace)")
    parser.add_argument("--run-name", default=None, help="run name shown in the UI")
    parser.add_argument(
        "--package",
        type=Path,
        default=None,
        help="compiled pipeline (default: the envace_pipeline.yaml installed with envace)",
    )
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run parameter, e.g. store=minio://envace/runs or train_nodes=2 (repeatable)",
    )
    parser.add_argument("--namespace", default=None, help="KFP namespace (multi-user installs)")
    parser.add_argument(
        "--service-account",
        default=None,
        help="service account of the run's pods (needs the RBAC charts/envace grants)",
    )
    parser.add_argument("--no-cache", action="store_true", help="disable caching for this run")
    _config_args(parser, "replaces the `config` parameter")
    parser.set_defaults(func=_submit)


def _add_run_local(sub: Any) -> None:
    parser = sub.add_parser(
        "run-local",
        help="run the whole pipeline here with KFP's local runner (CPU, no cluster)",
        description="Run every component as a local subprocess (kfp.local SubprocessRunner); the "
        "components read and write the store themselves. minio:// and s3:// stores take their "
        "endpoint and credentials from ENVACE_S3_*.",
    )
    parser.add_argument(
        "--store", required=True, help="artifact store: a folder, minio://bucket/prefix or s3://"
    )
    parser.add_argument(
        "--pipeline-root",
        type=Path,
        default=Path("runs") / "kfp-local",
        help="folder for KFP's own outputs (default: runs/kfp-local)",
    )
    parser.add_argument("--rounds", type=int, default=2, help="rollout -> train rounds")
    _config_args(parser, "default: the built-in defaults")
    parser.set_defaults(func=_run_local)


def _add_train_step(sub: Any) -> None:
    parser = sub.add_parser(
        "train-step",
        help="one pipeline train step (what a TrainJob runs when train_nodes > 1)",
        description="PPO update on a rollout's rows from the checkpoint that sampled them; "
        "commits the next checkpoint.",
    )
    _config_args(parser, "the run's config")
    parser.add_argument("--checkpoint", required=True, help="URI of the current checkpoint")
    parser.add_argument("--trajectories", required=True, help="URI of the rollout's rows")
    parser.add_argument("--out", required=True, help="URI of the next checkpoint")
    parser.add_argument(
        "--total-iterations",
        type=int,
        default=None,
        help="iterations the lr schedule spans (default: train.iterations)",
    )
    parser.set_defaults(func=_train_step)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pipeline",
        help="the Kubeflow Pipelines v2 pipeline: compile, submit, run-local",
        description="prepare -> warm start -> (rollout -> train) x rounds -> evaluate on Kubeflow "
        "Pipelines v2 (see docs/pipeline.md).",
    )
    sub = parser.add_subparsers(dest="pipeline_command", metavar="COMMAND", required=True)
    _add_compile(sub)
    _add_submit(sub)
    _add_run_local(sub)
    _add_train_step(sub)
