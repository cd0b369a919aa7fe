"""Metrics sinks: metrics.jsonl (one line per iteration), TensorBoard, optional W&B, a PNG plot."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "NullLogger", "plot_progress", "read_metrics"]

log = logging.getLogger(__name__)


class NullLogger:
    """The metrics sink of ranks other than 0 (only rank 0 writes reports)."""

    def truncate_after(self, iteration: int) -> None:
        pass

    def log(self, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def read_metrics(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The records of a metrics.jsonl, and a description of a torn last line cut from them
    (None when the file ends cleanly).

    A kill can interrupt the append of the last line only, so a last line that is not a JSON
    object with an integer "iteration" is the write that was cut short and is dropped. A bad line anywhere else means the
    file was damaged some other way: UserInputError naming the line (nothing is changed)."""
    from envace.errors import UserInputError

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


class MetricsLogger:
    """Appends one JSON line per iteration; mirrors scalars to TensorBoard (and W&B if set)."""

    def __init__(
        self,
        out: Path,
        tensorboard: bool = True,
        wandb_project: str | None = None,
        config: Any = None,
    ) -> None:
        self.path = out / "metrics.jsonl"
        self.tb_dir = out / "tensorboard"
        out.mkdir(parents=True, exist_ok=True)
        self.tb: Any = None
        self.wandb: Any = None
        if tensorboard:
            self.tb = self._writer(None)
        if wandb_project:
            try:
                import wandb
            except ImportError as exc:
                from envace.errors import ConfigError

                raise ConfigError(
                    f"wandb_project: {wandb_project!r} is set but wandb is not installed; "
                    "`pip install wandb` or unset wandb_project"
                ) from exc
            self.wandb = wandb.init(project=wandb_project, config=config, dir=str(out))

    def _writer(self, purge_step: int | None) -> Any:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=str(self.tb_dir), purge_step=purge_step)

    def truncate_after(self, iteration: int) -> None:
        """On resume from the checkpoint of `iteration`: its later iterations will be redone,
        so neither sink may show them twice. metrics.jsonl keeps the records up to
        `iteration`, one per iteration (a torn last line is cut, with a warning), rewritten
        atomically. TensorBoard gets a fresh event file that starts with a purge marker
        (SummaryWriter's purge_step): readers drop every earlier event at a later step, so
        the steps of a killed attempt are hidden, however many kills there were."""
        if self.tb is not None:
            self.tb.close()
            self.tb = self._writer(iteration + 1)
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
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


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
