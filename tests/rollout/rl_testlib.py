"""Generated training tasks and a config whose context limits never end an episode: what the
tests that run `RLTrainer.collect` over scripted policies start from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envace.config import Config, load_config
from envace.run.layout import load_splits
from envace.tasks.generate import write_splits


def roomy_rl_setup(tmp_path: Path, n_tasks: int, n: int, *overrides: str) -> tuple[Any, Config]:
    """`n_tasks` generated training tasks (all in one RL batch, `n` rollouts each) and the
    config with `overrides`."""
    write_splits(tmp_path, n_tasks, 1, 0)
    cfg = load_config(
        None,
        [
            *overrides,
            "rollout.max_context_tokens=100000",
            "rollout.max_sim_prompt_tokens=100000",
            f"rollout.batch_tasks={n_tasks}",
            f"rollout.n={n}",
        ],
    )
    return load_splits(tmp_path), cfg
