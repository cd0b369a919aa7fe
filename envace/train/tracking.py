"""Metrics sinks: metrics.jsonl (one line per iteration), TensorBoard, optional W&B, a PNG plot."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["MetricsLogger", "NullLogger", "plot_progress"]

log = logging.getLogger(__name__)


class NullLogger:
    """The metrics sink of ranks other than 0 (only rank 0 writes reports)."""

    def truncate_after(self, iteration: int) -> None:
        pass

    def log(self, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


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
        out.mkdir(parents=True, exist_ok=True)
        self.tb: Any = None
        self.wandb: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(out / "tensorboard"))
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

    def truncate_after(self, iteration: int) -> None:
        """On resume, drop lines of iterations after the checkpoint (they will be redone)."""
        if not self.path.exists():
            return
        keep = [
            line
            for line in self.path.read_text().splitlines()
            if line.strip() and json.loads(line).get("iteration", 0) <= iteration
        ]
        self.path.write_text("".join(f"{line}\n" for line in keep))

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
