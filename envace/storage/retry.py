"""Bounded retries with exponential backoff and full jitter.

The S3 client's own urllib3 retries are switched off (see `s3.py`), so this policy is the only
one: its attempts and its time budget are the whole story. Full jitter (a uniform draw in
[0, cap]) keeps many workers that lost the same server from hammering it in lockstep when it
comes back.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from envace.errors import ConfigError
from envace.retry import backoff_delay
from envace.storage.errors import StoreUnavailableError

__all__ = ["RetryEvent", "RetryPolicy", "call_with_retry"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try before giving up on a transient failure.

    max_attempts: attempts in total, the first included (1 = no retry).
    base_delay / max_delay: the backoff cap is min(max_delay, base_delay * 2**(retry - 1));
        the actual sleep is uniform in [0, cap].
    total_budget_s: no retry starts once the time spent plus the next sleep would exceed it.
        One attempt in flight is bounded by the client's timeouts, not by this budget.
    """

    max_attempts: int = 6
    base_delay: float = 0.25
    max_delay: float = 8.0
    total_budget_s: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"retry.max_attempts={self.max_attempts}: must be >= 1")
        if self.base_delay < 0 or self.max_delay < self.base_delay:
            raise ConfigError(
                f"retry delays base={self.base_delay}, max={self.max_delay}: need 0 <= base <= max"
            )
        if self.total_budget_s <= 0:
            raise ConfigError(f"retry.total_budget_s={self.total_budget_s}: must be > 0")

    def backoff(self, retry: int, rng: random.Random) -> float:
        """Sleep before retry number `retry` (1-based): full jitter under an exponential cap."""
        return backoff_delay(retry - 1, self.base_delay, self.max_delay, rng)


@dataclass(frozen=True)
class RetryEvent:
    """One transient failure that is about to be retried (passed to `on_retry` hooks)."""

    operation: str
    target: str
    attempt: int
    delay_s: float
    error: BaseException


def _summary(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def _timeout_kind(exc: BaseException) -> str | None:
    """Which timeout `exc`, or an error it wraps, is: "connect", "read", or None for none.

    Matched by class name so this module does not import urllib3: its ConnectTimeoutError and
    ReadTimeoutError derive from a class named TimeoutError, as the built-in one is named.
    """
    pending: list[BaseException] = [exc]
    seen: set[int] = set()
    while pending:
        err = pending.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        names = {cls.__name__ for cls in type(err).__mro__}
        if "ConnectTimeoutError" in names:
            return "connect"
        if "TimeoutError" in names:
            return "read"
        # MaxRetryError keeps its cause in `reason`.
        for inner in (getattr(err, "reason", None), err.__cause__, err.__context__):
            if isinstance(inner, BaseException):
                pending.append(inner)
    return None


def _advice(exc: BaseException) -> str:
    """What to check after the last attempt failed with `exc`."""
    kind = _timeout_kind(exc)
    if kind == "connect":
        return (
            "No connection was made within ENVACE_S3_CONNECT_TIMEOUT_S: check that the endpoint"
            " (ENVACE_S3_ENDPOINT) is right and reachable from here, then re-run"
        )
    if kind == "read":
        return (
            "The server took the connection but did not answer within ENVACE_S3_READ_TIMEOUT_S:"
            " check that it is healthy (a stuck server holds each attempt that long; a shorter"
            " ENVACE_S3_READ_TIMEOUT_S gives up sooner), then re-run"
        )
    return "Check that the endpoint is reachable and healthy (ENVACE_S3_ENDPOINT), then re-run"


def call_with_retry(
    fn: Callable[[], T],
    *,
    policy: RetryPolicy,
    is_transient: Callable[[BaseException], bool],
    operation: str,
    target: str,
    endpoint: str,
    on_retry: Callable[[RetryEvent], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
) -> T:
    """Run `fn`; retry transient errors under `policy`; raise StoreUnavailableError at the end.

    Non-transient errors propagate unchanged on the first occurrence.
    """
    rng = rng or random.Random()
    start = clock()
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc):
                raise
            elapsed = clock() - start
            delay = policy.backoff(attempt, rng)
            if attempt >= policy.max_attempts or elapsed + delay > policy.total_budget_s:
                raise StoreUnavailableError(
                    f"{operation} {target} failed on endpoint {endpoint} after {attempt}"
                    f" attempt(s) in {elapsed:.1f}s ({_summary(exc)}). {_advice(exc)}"
                ) from exc
            log.warning(
                "%s %s on %s: %s; retry %d/%d in %.2fs",
                operation,
                target,
                endpoint,
                _summary(exc),
                attempt,
                policy.max_attempts - 1,
                delay,
            )
            if on_retry is not None:
                on_retry(RetryEvent(operation, target, attempt, delay, exc))
            sleep(delay)
