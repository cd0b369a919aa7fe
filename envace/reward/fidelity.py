"""How closely a rehearsed tool result matches the real world's: the rehearsal fidelity.

One definition for the two places that measure it: evaluation (`envace.evaluate.metrics`,
fidelity probes of committed executions) and RL rollouts in rehearsal mode, where a training
task has a world and each rehearsed result is compared with that world's answer to the same
calls (`envace.rollout.engine.Episode.shadow_result`), which `algo.simulator_reward` may turn
into the simulator rows' reward.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["canonical_json", "field_agreement"]


def canonical_json(value: Any) -> str:
    """The JSON text two results are compared by (sorted keys, no spacing)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def field_agreement(real: Any, rehearsed: Any) -> float:
    """Fraction of top-level fields (union of keys) with equal values; non-objects: 0 or 1."""
    if isinstance(real, dict) and isinstance(rehearsed, dict):
        keys = set(real) | set(rehearsed)
        if not keys:
            return 1.0
        same = sum(
            1
            for k in keys
            if k in real
            and k in rehearsed
            and canonical_json(real[k]) == canonical_json(rehearsed[k])
        )
        return same / len(keys)
    return 1.0 if canonical_json(real) == canonical_json(rehearsed) else 0.0
