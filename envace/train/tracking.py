"""Metrics sinks: metrics.jsonl (one line per iteration, the record of the run), mirrored to
TensorBoard, MLflow and W&B (each optional), and a PNG plot.

MLflow and W&B runs are keyed by the EnvACE run (`TrackedRun`), so a restarted or resumed run
continues the same tracker run instead of starting a new one."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from envace.errors import ConfigError, UserInputError

if TYPE_CHECKING:
    from envace.config import Config

__all__ = [
    "MetricsLogger",
    "MlflowTarget",
    "MlflowTracker",
    "NullLogger",
    "TrackedRun",
    "Tracker",
    "check_mlflow_uri",
    "export_tracking_secrets",
    "flat_params",
    "plot_progress",
    "read_metrics",
    "wandb_init_args",
]

log = logging.getLogger(__name__)


class NullLogger:
    """The metrics sink of ranks other than 0 (only rank 0 writes reports)."""

    def truncate_after(self, iteration: int) -> None:
        pass

    def log(self, record: dict[str, Any]) -> None:
        pass

    def close(self, failed: bool = False) -> None:
        pass


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The records of a metrics.jsonl, and a description of a torn last line cut from them
    (None when the file ends cleanly).

    A kill can interrupt the append of the last line only, so a last line that is not a JSON
    object with an integer "iteration" is the write that was cut short and is dropped. A bad line anywhere else means the
    file was damaged some other way: UserInputError naming the line (nothing is changed)."""
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    numbered = [(n, line) for n, line in enumerate(lines, start=1) if line.strip()]
    records: list[dict[str, Any]] = []
    torn = None
    for i, (n, line) in enumerate(numbered):
        record = _parse_record(line)
        if record is not None:
            records.append(record)
        elif i == len(numbered) - 1:
            torn = f"line {n} ({len(line)} characters, the write a kill interrupted)"
        else:
            raise UserInputError(
                f"{path}: line {n} is not a JSON record, and only the last line can be torn by"
                " a kill; repair or delete that line, then resume again"
            )
    return records, torn


def _parse_record(line: str) -> dict[str, Any] | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict):
        return None
    step = record.get("iteration")
    return record if isinstance(step, int) and not isinstance(step, bool) else None


@dataclass(frozen=True)
class TrackedRun:
    """Who a run is to MLflow and W&B, the same for every restart and resume of it.

    `name` is the run's store URI (`envace train`: <store>/<run name>); `started` is when the
    run's fresh start committed its tasks (a resume never recommits them; --overwrite, or a
    fresh start after a kill before the first checkpoint, does). A run that starts over in the
    same place is a new run: its metric history starts over too."""

    name: str
    started: str = ""

    @property
    def key(self) -> str:
        """A stable id (20 hex digits): the W&B run id and the MLflow run's `envace.run_key` tag."""
        return hashlib.sha256(f"{self.name}\n{self.started}".encode()).hexdigest()[:20]

    @property
    def title(self) -> str:
        """A short display name: the last part of `name`."""
        return self.name.rstrip("/").rsplit("/", 1)[-1] or self.name


@dataclass(frozen=True)
class MlflowTarget:
    """Where MLflow runs go. Credentials never appear here: the MLflow client reads them from
    MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN."""

    uri: str
    experiment: str = "envace"

    @classmethod
    def from_config(cls, cfg: Config) -> MlflowTarget | None:
        """`mlflow_tracking_uri`, else the MLFLOW_TRACKING_URI environment variable; None: off."""
        uri = cfg.mlflow_tracking_uri or os.environ.get(MLFLOW_URI_ENV, "").strip()
        return cls(uri, cfg.mlflow_experiment) if uri else None


MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"


class Tracker(Protocol):
    """An external sink of the per-iteration scalars (metrics.jsonl is written before it)."""

    def log(self, scalars: Mapping[str, float], step: int) -> None: ...

    def truncate_after(self, iteration: int) -> None:
        """A resume from the checkpoint of `iteration`: the later iterations will be redone."""

    def close(self, failed: bool) -> None: ...


class _TensorBoard:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.writer = self._writer(None)

    def _writer(self, purge_step: int | None) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def truncate_after(self, iteration: int) -> None:
        # A fresh event file that starts with a purge marker (SummaryWriter's purge_step):
        # readers drop every earlier event at a later step, however many kills there were.
        self.writer.close()
        self.writer = self._writer(iteration + 1)

    def close(self, failed: bool) -> None:
        self.writer.close()


class _Wandb:
    """One W&B run per EnvACE run: `id` is the run's stable key and `resume="allow"` continues
    it after a restart. W&B keeps its steps increasing, so an iteration it already holds from
    the attempt before a resume keeps that attempt's values (skipped here, with a warning)."""

    def __init__(self, project: str, run: TrackedRun, config: Any, out: Path) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError(
                f"wandb_project: {project!r} is set but wandb is not installed; "
                "`pip install 'envace[tracking]'` or unset wandb_project"
            ) from exc
        self.run = wandb.init(**wandb_init_args(project, run, config, out))
        self.skipped = False

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        if step < self.run.step:  # resumed online: W&B would drop it with its own warning
            if not self.skipped:
                log.warning("W&B already holds iteration %d (before the resume); kept", step)
            self.skipped = True
            return
        self.run.log(dict(scalars), step=step)

    def truncate_after(self, iteration: int) -> None:
        pass

    def close(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


def wandb_init_args(project: str, run: TrackedRun, config: Any, out: Path) -> dict[str, Any]:
    """The arguments of `wandb.init`: the same id for every restart and resume of `run`."""
    return {
        "project": project,
        "id": run.key,
        "name": run.title,
        "resume": "allow",
        "config": config,
        "dir": str(out),
    }


def flat_params(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested config as MLflow params: dotted keys (`train.lr`), JSON values (strings as they
    are), an empty mapping as `{}`. Characters MLflow refuses in a key become `_`."""
    params: dict[str, str] = {}
    for key, value in config.items():
        name = prefix + re.sub(r"[^\w./ -]", "_", str(key))
        if isinstance(value, Mapping) and value:
            params.update(flat_params(value, name + "."))
        else:
            params[name] = value if isinstance(value, str) else json.dumps(value)
    return params


class MlflowTracker:
    """One MLflow run per EnvACE run, found again by its `envace.run_key` tag (`TrackedRun.key`)
    after a restart or resume and continued (status RUNNING again), else created with the tags
    `envace.run` (the run's name) and `envace.run_key`. Params: the flattened config, logged
    once (MLflow refuses to change a param: a setting changed at a resume is kept as first
    logged, with a warning). Metrics: each iteration's scalars at step = iteration; an
    iteration the run already holds (logged before a kill, redone after the resume) is not
    sent again, since MLflow can only append: the run keeps one value per step. A continued
    run's history is read per metric when that metric is first logged again (a pipeline step
    that logs 3 metrics into a run holding 60 makes 3 history requests, not 60)."""

    RUN_TAG = "envace.run"
    KEY_TAG = "envace.run_key"

    def __init__(self, target: MlflowTarget, run: TrackedRun, params: Mapping[str, str]) -> None:
        check_mlflow_uri(target.uri)
        try:
            from mlflow import MlflowClient
            from mlflow.exceptions import MlflowException
        except ImportError as exc:
            raise ConfigError(
                f"MLflow tracking is on (mlflow_tracking_uri or ${MLFLOW_URI_ENV}) but mlflow"
                " is not installed; `pip install 'envace[tracking]'` or unset both"
            ) from exc
        self.client = MlflowClient(tracking_uri=target.uri)
        try:
            self.run_id, self.found = self._open(target, run, params)
        except MlflowException as exc:
            raise UserInputError(
                f"MLflow at {target.uri}: {exc.message}; check mlflow_tracking_uri (or"
                f" ${MLFLOW_URI_ENV}) and the credentials in MLFLOW_TRACKING_USERNAME /"
                " MLFLOW_TRACKING_PASSWORD or MLFLOW_TRACKING_TOKEN"
            ) from None
        log.info("MLflow: run %s (%s) in experiment %r", self.run_id, run.title, target.experiment)
        self.held: dict[str, set[int]] = {}  # the steps a metric holds, read when first logged
        self.skipped = False

    def _open(
        self, target: MlflowTarget, run: TrackedRun, params: Mapping[str, str]
    ) -> tuple[str, set[str]]:
        """The run's id and the metrics it held when found (none for a new run)."""
        experiment_id = self._experiment(target.experiment)
        found = self.client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{self.KEY_TAG}` = '{run.key}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        if found:
            run_id = found[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
            self._log_params(run_id, params, dict(found[0].data.params))
            return run_id, set(found[0].data.metrics)
        tags = {self.RUN_TAG: run.name, self.KEY_TAG: run.key, "envace.started": run.started}
        created = self.client.create_run(experiment_id, run_name=run.title, tags=tags)
        self._log_params(created.info.run_id, params, {})
        return created.info.run_id, set()

    def _experiment(self, name: str) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment is None:
            try:
                return str(self.client.create_experiment(name))
            except MlflowException:  # created meanwhile by another run
                experiment = self.client.get_experiment_by_name(name)
                if experiment is None:
                    raise
        if experiment.lifecycle_stage != "active":
            raise ConfigError(
                f"mlflow_experiment: {name!r} is deleted on the MLflow server; restore it"
                " (`mlflow experiments restore`) or choose another name"
            )
        return str(experiment.experiment_id)

    def _log_params(self, run_id: str, params: Mapping[str, str], held: dict[str, str]) -> None:
        from mlflow.entities import Param

        changed = sorted(k for k, v in params.items() if k in held and held[k] != _cut(v))
        if changed:
            log.warning(
                "MLflow keeps the params a run was started with; changed at this resume and"
                " not updated there: %s (config.json holds the values in use)",
                ", ".join(changed),
            )
        new = [Param(k, _cut(v)) for k, v in params.items() if k not in held]
        for param in new:
            if param.value != params[param.key]:
                log.warning("MLflow param %s: cut to %d characters", param.key, _PARAM_MAX)
        for i in range(0, len(new), 100):  # MLflow's limit of params per request
            self.client.log_batch(run_id, params=new[i : i + 100])

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric
        from mlflow.exceptions import MlflowException

        now = int(time.time() * 1000)
        try:
            fresh = {k: v for k, v in scalars.items() if step not in self._held(k)}
            if len(fresh) < len(scalars) and not self.skipped:
                log.warning("MLflow already holds iteration %d (before the resume); kept", step)
                self.skipped = True
            metrics = [Metric(k, float(v), now, step) for k, v in fresh.items()]
            for i in range(0, len(metrics), 1000):  # MLflow's limit of metrics per request
                self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
        except MlflowException as exc:  # the client retried already; training goes on
            log.warning(
                "MLflow: iteration %d not logged (%s); metrics.jsonl holds it", step, exc.message
            )
            return
        for k in fresh:
            self.held[k].add(step)

    def _held(self, key: str) -> set[int]:
        if key not in self.held:
            history = self.client.get_metric_history(self.run_id, key) if key in self.found else []
            self.held[key] = {m.step for m in history}
        return self.held[key]

    def truncate_after(self, iteration: int) -> None:
        pass  # the steps MLflow holds are known (`held`): none is sent twice

    def close(self, failed: bool) -> None:
        from mlflow.exceptions import MlflowException

        status = "FAILED" if failed else "FINISHED"
        try:
            self.client.set_terminated(self.run_id, status)
        except MlflowException as exc:  # must not hide the error a failed run is ending with
            log.warning("MLflow: run %s not marked %s (%s)", self.run_id, status, exc.message)


_PARAM_MAX = 6000  # characters of an MLflow param value
_CREDENTIALS_IN_URI = (
    "mlflow_tracking_uri (or $MLFLOW_TRACKING_URI) holds credentials (user:password@host);"
    " remove them and set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or"
    " MLFLOW_TRACKING_TOKEN) in the environment instead (a Secret on the cluster)"
)


def check_mlflow_uri(uri: str | None) -> None:
    """ConfigError when an MLflow URI holds credentials (they would reach config.json and the
    logs); the message does not show the URI."""
    from envace.storage.uri import redact_url

    if uri is not None and redact_url(uri) != uri:
        raise ConfigError(_CREDENTIALS_IN_URI)


TRACKING_SECRET_DIR_ENV = "ENVACE_TRACKING_SECRET_DIR"  # a pipeline step's tracking Secret
# The variables a mounted tracking Secret may hold, one file per variable (its key is the name).
TRACKING_SECRET_VARS = (
    MLFLOW_URI_ENV,
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "MLFLOW_TRACKING_TOKEN",
    "WANDB_API_KEY",
    "WANDB_BASE_URL",
)


def export_tracking_secrets(folder: Path) -> list[str]:
    """Set the tracking clients' environment from a mounted Secret: each file of `folder` named
    as one of TRACKING_SECRET_VARS becomes that variable (a variable already set wins).
    Returns the names set; values are never logged. Other files: a warning naming them. A
    missing folder (an optional Secret that does not exist): nothing."""
    from envace.storage.settings import read_secret_file

    if not folder.is_dir():
        return []
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    unknown = [n for n in names if n not in TRACKING_SECRET_VARS]
    if unknown:
        log.warning(
            "%s: ignored keys %s (a tracking Secret holds %s)",
            folder,
            ", ".join(unknown),
            ", ".join(TRACKING_SECRET_VARS),
        )
    exported = []
    for name in (n for n in names if n in TRACKING_SECRET_VARS and not os.environ.get(n)):
        os.environ[name] = read_secret_file(str(folder / name), f"{folder}/{name}")
        exported.append(name)
    if exported:
        log.info("tracking: %s from %s", ", ".join(exported), folder)
    return exported


def _cut(value: str) -> str:
    return value if len(value) <= _PARAM_MAX else value[: _PARAM_MAX - 3] + "..."


class MetricsLogger:
    """Appends one JSON line per iteration to metrics.jsonl, then mirrors its scalars to every
    tracker: TensorBoard (OUT/tensorboard), MLflow and W&B when set."""

    def __init__(
        self,
        out: Path,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        config: Any = None,
        *,
        run: TrackedRun | None = None,
        mlflow: MlflowTarget | None = None,
    ) -> None:
        self.path = out / "metrics.jsonl"
        self.tb_dir = out / "tensorboard"
        out.mkdir(parents=True, exist_ok=True)
        run = run or TrackedRun(str(out.resolve()))
        self.trackers: list[Tracker] = []
        try:
            if tensorboard:
                self.trackers.append(_TensorBoard(self.tb_dir))
            if mlflow is not None:
                self.trackers.append(MlflowTracker(mlflow, run, flat_params(config or {})))
            if wandb_project:
                self.trackers.append(_Wandb(wandb_project, run, config, out))
        except BaseException:
            self.close(failed=True)
            raise

    @classmethod
    def from_config(cls, out: Path, cfg: Config, run: TrackedRun) -> MetricsLogger:
        """The sinks `cfg` asks for (tensorboard, mlflow_*, wandb_project), for `run`."""
        mlflow = MlflowTarget.from_config(cfg)
        return cls(out, cfg.tensorboard, cfg.wandb_project, cfg.to_dict(), run=run, mlflow=mlflow)

    def truncate_after(self, iteration: int) -> None:
        """On resume from the checkpoint of `iteration`: its later iterations will be redone,
        so no sink may show them twice. metrics.jsonl keeps the records up to `iteration`, one
        per iteration (a torn last line is cut, with a warning), rewritten atomically;
        TensorBoard gets a purge marker; MLflow and W&B keep the values they already hold."""
        for tracker in self.trackers:
            tracker.truncate_after(iteration)
        if not self.path.exists():
            return
        from envace.tasks.io import atomic_write_text

        records, torn = read_metrics(self.path)
        if torn is not None:
            log.warning("%s: cut a torn last line: %s", self.path, torn)
        once: dict[int, dict[str, Any]] = {}
        for record in records:
            step = int(record["iteration"])
            if step <= iteration:
                once[step] = record  # a repeated iteration: its last record
        text = "".join(json.dumps(r) + "\n" for _, r in sorted(once.items()))
        atomic_write_text(self.path, text)

    def log(self, record: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        step = int(record.get("iteration", 0))
        scalars = {
            k: v for k, v in record.items() if isinstance(v, int | float) and k != "iteration"
        }
        for tracker in self.trackers:
            tracker.log(scalars, step)

    def close(self, failed: bool = False) -> None:
        """Close every sink; `failed`: the run ended with an error (MLflow: FAILED)."""
        for tracker in self.trackers:
            tracker.close(failed)
        self.trackers = []


def plot_progress(records: Sequence[dict[str, Any]], evals: dict[str, float], path: Path) -> Path:
    """Reward and success over RL iterations, with held-out success per stage as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    its = [r["iteration"] for r in records]
    ax.plot(its, [r.get("reward/mean", 0.0) for r in records], label="train reward (mean)")
    ax.plot(its, [r.get("reward/success_rate", 0.0) for r in records], label="train success")
    held = [(r["iteration"], r["eval/success_rate"]) for r in records if "eval/success_rate" in r]
    if held:
        ax.plot(*zip(*held, strict=True), "o-", label="held-out success")
    for i, (name, value) in enumerate(evals.items()):
        ax.axhline(value, linestyle="--", color=f"C{i + 3}", label=f"held-out success: {name}")
    ax.set_xlabel("RL iteration")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("EnvACE: world-rehearsal RL")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
