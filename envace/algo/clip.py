"""The PPO clip ranges' one rule, torch-free: the config checks it when it loads, the loss when
it is built."""

from __future__ import annotations

import math

from envace.errors import ConfigError

__all__ = ["check_clip"]


def check_clip(clip_low: float, clip_high: float, dual_clip: float | None) -> None:
    """The PPO clip ranges' one rule (the config and the loss both use it)."""
    if not 0 <= clip_low < 1:
        raise ConfigError(f"clip_low={clip_low} must be in [0, 1): the ratio floor is 1 - clip_low")
    if not (math.isfinite(clip_high) and clip_high >= 0):
        raise ConfigError(f"clip_high={clip_high} must be a finite number >= 0")
    if dual_clip is not None and not (math.isfinite(dual_clip) and dual_clip > 1):
        raise ConfigError(
            f"dual_clip={dual_clip} must be > 1 (it caps the loss of negative-advantage tokens "
            "at dual_clip * |A|); use None to turn dual clip off"
        )
