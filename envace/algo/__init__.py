"""Role-wise GRPO: advantages (pure Python) and the PPO-clip policy loss (torch).

`import envace.algo` and `envace.algo.advantages` never import torch: the loss names below are
loaded from `envace.algo.losses` / `envace.algo.kl` on first access, so the rollout and reward
side can use advantages on a CPU-only, torch-free install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from envace.algo.advantages import (
    AdvantageResult,
    Baseline,
    GroupStats,
    RoleStats,
    Singleton,
    apply_empty_penalty,
    compute_advantages,
)

if TYPE_CHECKING:
    from envace.algo.kl import KLKind, kl_penalty
    from envace.algo.losses import (
        AggMode,
        LossConfig,
        advantages_to_tensor,
        aggregate,
        masked_mean,
        policy_loss,
        ppo_clip_loss,
    )

__all__ = [
    "AdvantageResult",
    "AggMode",
    "Baseline",
    "GroupStats",
    "KLKind",
    "LossConfig",
    "RoleStats",
    "Singleton",
    "advantages_to_tensor",
    "aggregate",
    "apply_empty_penalty",
    "compute_advantages",
    "kl_penalty",
    "masked_mean",
    "policy_loss",
    "ppo_clip_loss",
]

# Torch-backed names and the module each lives in, imported on first attribute access.
_LAZY = {
    "KLKind": "envace.algo.kl",
    "kl_penalty": "envace.algo.kl",
    "AggMode": "envace.algo.losses",
    "LossConfig": "envace.algo.losses",
    "advantages_to_tensor": "envace.algo.losses",
    "aggregate": "envace.algo.losses",
    "masked_mean": "envace.algo.losses",
    "policy_loss": "envace.algo.losses",
    "ppo_clip_loss": "envace.algo.losses",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'envace.algo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
