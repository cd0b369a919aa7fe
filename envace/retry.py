"""Exponential backoff with full jitter: the one wait every retry loop in EnvACE uses (the S3
store's `RetryPolicy`, the OpenAI-compatible chat client).

Full jitter (a uniform draw in [0, cap]) keeps many workers that failed together from retrying
in lockstep when the server comes back.
"""

from __future__ import annotations

import random

__all__ = ["backoff_delay"]


def backoff_delay(
    retry_index: int,
    base_s: float,
    cap_s: float,
    rng: random.Random,
    retry_after_s: float | None = None,
) -> float:
    """Seconds to wait before retry number `retry_index` (0 for the first retry): uniform in
    [0, min(cap_s, base_s * 2**retry_index)]. A server's `Retry-After` raises the wait, never
    above the cap."""
    nominal = min(cap_s, base_s * (2.0 ** min(retry_index, 64)))
    delay = rng.uniform(0.0, nominal)
    if retry_after_s is not None:
        delay = max(delay, min(cap_s, retry_after_s))
    return delay
