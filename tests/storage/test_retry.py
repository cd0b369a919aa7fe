"""RetryPolicy: backoff bounds, attempt limit, time budget, and which errors are retried.

The clock and sleep are injected so the time budget is checked exactly, without waiting.
"""

from __future__ import annotations

import random

import pytest
from minio.error import ServerError
from urllib3.exceptions import NewConnectionError, ProtocolError, ReadTimeoutError

from envace.errors import ConfigError
from envace.storage import RetryEvent, RetryPolicy, StoreUnavailableError
from envace.storage.retry import call_with_retry
from envace.storage.s3 import is_transient


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def test_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay=0.5, max_delay=4.0, total_budget_s=100)
    rng = random.Random(1)
    for retry, cap in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (8, 4.0)]:
        draws = [policy.backoff(retry, rng) for _ in range(200)]
        assert all(0.0 <= d <= cap for d in draws)
        assert max(draws) > 0.8 * cap  # it really spreads over the whole range


def test_transient_errors_are_retried_until_success() -> None:
    clock = FakeClock()
    calls = []
    events: list[RetryEvent] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionResetError("reset by peer")
        return "ok"

    result = call_with_retry(
        flaky,
        policy=RetryPolicy(max_attempts=5, base_delay=1.0, max_delay=1.0, total_budget_s=60),
        is_transient=is_transient,
        operation="upload",
        target="minio://b0b/k",
        endpoint="http://h:1",
        on_retry=events.append,
        sleep=clock.sleep,
        clock=clock,
    )
    assert result == "ok" and len(calls) == 3
    assert [e.attempt for e in events] == [1, 2]
    assert all(isinstance(e.error, ConnectionResetError) for e in events)
    assert len(clock.sleeps) == 2


def test_attempts_are_bounded_and_the_error_names_operation_and_endpoint() -> None:
    clock = FakeClock()

    def down() -> None:
        raise ConnectionRefusedError("[Errno 111] Connection refused")

    with pytest.raises(StoreUnavailableError) as info:
        call_with_retry(
            down,
            policy=RetryPolicy(max_attempts=3, base_delay=0.1, max_delay=0.1, total_budget_s=60),
            is_transient=is_transient,
            operation="download",
            target="minio://b0b/k",
            endpoint="http://10.0.0.9:9000",
            sleep=clock.sleep,
            clock=clock,
        )
    message = str(info.value)
    assert "download minio://b0b/k" in message and "http://10.0.0.9:9000" in message
    assert "after 3 attempt(s)" in message and "ConnectionRefusedError" in message
    assert len(clock.sleeps) == 2
    assert isinstance(info.value.__cause__, ConnectionRefusedError)


def test_time_budget_stops_retries_before_max_attempts() -> None:
    clock = FakeClock()
    attempts = []

    def slow_failure() -> None:
        attempts.append(clock.now)
        clock.now += 4.0  # each attempt burns 4 s (a timeout)
        raise TimeoutError("timed out")

    policy = RetryPolicy(max_attempts=100, base_delay=0.0, max_delay=0.0, total_budget_s=10)
    with pytest.raises(StoreUnavailableError, match="after 3 attempt"):
        call_with_retry(
            slow_failure,
            policy=policy,
            is_transient=is_transient,
            operation="list",
            target="t",
            endpoint="e",
            sleep=clock.sleep,
            clock=clock,
        )
    assert len(attempts) == 3 and clock.now == pytest.approx(12.0)


def test_permanent_errors_are_not_retried() -> None:
    calls = []

    def bad() -> None:
        calls.append(1)
        raise ValueError("not transient")

    with pytest.raises(ValueError):
        call_with_retry(
            bad,
            policy=RetryPolicy(),
            is_transient=is_transient,
            operation="o",
            target="t",
            endpoint="e",
            sleep=lambda _: None,
        )
    assert calls == [1]


def test_transient_classification() -> None:
    assert is_transient(NewConnectionError(None, "refused"))  # type: ignore[arg-type]
    assert is_transient(ReadTimeoutError(None, "/k", "read timed out"))  # type: ignore[arg-type]
    assert is_transient(ProtocolError("Connection aborted."))
    assert is_transient(ServerError("server failed with HTTP status code 502", 502))
    assert not is_transient(ServerError("server failed with HTTP status code 418", 418))
    assert not is_transient(KeyError("x"))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base_delay": -1.0},
        {"base_delay": 2.0, "max_delay": 1.0},
        {"total_budget_s": 0.0},
    ],
)
def test_bad_policies_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
