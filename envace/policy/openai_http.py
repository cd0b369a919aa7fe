"""A synchronous client for OpenAI-compatible `/v1/chat/completions` endpoints.

Used where EnvACE talks to a model it does not host: the checklist judge (an sglang / vLLM server
or the OpenAI API) and, in the "caller-only" baseline, an external tool simulator.

Behaviour worth knowing:
- Several base URLs may be given (replicas of one model): every attempt picks one at random, so
  the load spreads and a retry can land on a healthy replica.
- Connect errors, timeouts, HTTP 408, 429 and 5xx are retried with capped exponential backoff and
  full jitter (`envace.retry.backoff_delay`, the store's too;
  a `Retry-After` header is honoured up to the cap); other 4xx fail at once, because
  repeating a bad request cannot help.
- A bounded semaphore caps the requests in flight per client, across all threads using it; a
  request waiting in backoff does not hold a slot.
- The API key travels only in the `Authorization` header. It is never part of an error, a log
  line or the client's repr.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from envace.errors import ConfigError, EnvaceError
from envace.policy.types import SamplingParams
from envace.retry import backoff_delay
from envace.storage.uri import redact_url as _redact

__all__ = [
    "ChatError",
    "ChatRequestError",
    "OpenAIChatClient",
    "json_schema_format",
    "normalise_base_urls",
]

logger = logging.getLogger(__name__)

# 408 (request timeout) and 429 (rate limit) are transient by definition; 5xx is the server's fault.
_RETRYABLE_STATUS = frozenset({408, 429})
_MAX_ERROR_CHARS = 500


class ChatRequestError(EnvaceError):
    """A chat request failed for good (after retries, or at once for a client error).

    `endpoint` is the URL without any credentials; `reason` says what went wrong and, where we
    can tell, what to do; `status` is the last HTTP status, None when no response arrived.
    """

    def __init__(self, endpoint: str, reason: str, status: int | None = None) -> None:
        super().__init__(f"chat request to {endpoint} failed: {reason}")
        self.endpoint = endpoint
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class ChatError:
    """A failed request of `chat_many`, returned as a value so the caller can mask that item."""

    endpoint: str
    reason: str
    status: int | None = None

    def __str__(self) -> str:
        return f"chat request to {self.endpoint} failed: {self.reason}"


@dataclass(frozen=True)
class _Failure:
    """One failed attempt: what happened and whether trying again may help."""

    endpoint: str
    reason: str
    retryable: bool
    status: int | None = None
    retry_after_s: float | None = None


def json_schema_format(name: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The `response_format` that asks the server for JSON matching `schema` (strict mode)."""
    return {
        "type": "json_schema",
        "json_schema": {"name": name, "schema": dict(schema), "strict": True},
    }


def normalise_base_urls(base_url: str | Sequence[str]) -> list[str]:
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    if not urls:
        raise ConfigError("base_url: empty list; give at least one URL like http://host:port/v1")
    for url in urls:
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - parses the port: ValueError when out of range
        except ValueError as exc:  # an unclosed IPv6 bracket, a bad address, a port past 65535
            raise ConfigError(
                f"base_url: {_redact(url)!r} is not a valid URL ({exc}); "
                "give the API root, e.g. http://judge:10001/v1 or http://[::1]:8000/v1"
            ) from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"base_url: {_redact(url)!r} is not an http(s) URL with a host; "
                "give the API root, e.g. http://judge:10001/v1"
            )
    return [url.rstrip("/") for url in urls]


def _server_message(response: httpx.Response) -> str:
    """The error message a server put in its body (OpenAI layout or plain text), shortened."""
    text = response.text
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:_MAX_ERROR_CHARS] or "(empty body)"
    message: Any = body
    if isinstance(body, dict):
        message = body.get("error", body.get("message", body.get("detail", body)))
        if isinstance(message, dict):
            message = message.get("message", message)
    rendered = message if isinstance(message, str) else json.dumps(message)
    return rendered[:_MAX_ERROR_CHARS]


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from LLM servers, and the backoff still applies


def _message_content(response: httpx.Response) -> str:
    """`choices[0].message.content` of a successful response; ValueError when it has none."""
    body = response.json()
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError(f"no choices[0].message.content in the response ({exc!r})") from exc
    if not isinstance(content, str):
        raise ValueError(f"choices[0].message.content is {type(content).__name__}, not text")
    return content


class OpenAIChatClient:
    """Messages-in / text-out over HTTP; implements `envace.policy.types.ChatBackend`.

    Args:
        base_url: the API root (`http://host:port/v1`), or a list of replicas of the same model.
        model: the `model` field of every request.
        api_key: sent as `Authorization: Bearer ...`. When None, read from the environment variable
            named by `api_key_env` (e.g. ENVACE_JUDGE_API_KEY); no key at all is fine for a local
            sglang / vLLM server.
        timeout_s: limit per network operation (connect, send, wait for the response).
        max_retries: retries after the first attempt (so at most max_retries + 1 attempts).
        backoff_base_s, backoff_max_s: wait before retry k is about base * 2**k, capped.
        max_concurrency: requests in flight at once from this client, over all threads.
        extra_body: fields merged into every request (e.g. {"chat_template_kwargs":
            {"enable_thinking": False}} for a Qwen3 judge on sglang).
        seed: seeds the replica choice and the jitter (tests); None draws from the OS.
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str,
        api_key: str | None = None,
        *,
        api_key_env: str | None = None,
        timeout_s: float = 120.0,
        max_retries: int = 5,
        backoff_base_s: float = 1.0,
        backoff_max_s: float = 30.0,
        max_concurrency: int = 8,
        extra_body: Mapping[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        _check_positive(timeout_s=timeout_s, max_concurrency=max_concurrency)
        _check_non_negative(
            max_retries=max_retries, backoff_base_s=backoff_base_s, backoff_max_s=backoff_max_s
        )
        self.base_urls = normalise_base_urls(base_url)
        self.model = model
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.max_concurrency = max_concurrency
        self._extra_body = dict(extra_body or {})
        self._rng = random.Random(seed)
        self._slots = threading.BoundedSemaphore(max_concurrency)
        key = api_key if api_key is not None else _key_from_env(api_key_env)
        self._has_key = bool(key)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout_s),
            limits=httpx.Limits(
                max_connections=max_concurrency, max_keepalive_connections=max_concurrency
            ),
        )

    def __repr__(self) -> str:
        key = "set" if self._has_key else "none"
        return (
            f"OpenAIChatClient(base_urls={self.base_urls!r}, model={self.model!r}, api_key={key})"
        )

    def __enter__(self) -> OpenAIChatClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool. The client is unusable afterwards."""
        self._http.close()

    def chat(
        self,
        messages: Sequence[dict[str, Any]],
        params: SamplingParams,
        response_format: dict[str, Any] | None = None,
    ) -> str:
        """The assistant message's text for one chat. Raises ChatRequestError when it fails."""
        body = self._request_body(messages, params, response_format)
        attempts = self.max_retries + 1
        failure: _Failure | None = None
        for attempt in range(attempts):
            if failure is not None:
                self._wait_before_retry(attempt, attempts, failure)
            outcome = self._attempt(body)
            if isinstance(outcome, str):
                return outcome
            if not outcome.retryable:
                raise ChatRequestError(outcome.endpoint, outcome.reason, outcome.status)
            failure = outcome
        assert failure is not None  # the loop ran at least once and never returned
        raise ChatRequestError(
            failure.endpoint,
            f"gave up after {attempts} attempts; last error: {failure.reason}. "
            "Check that the server is up and not overloaded, or raise max_retries / timeout_s.",
            failure.status,
        )

    def chat_many(
        self,
        conversations: Sequence[Sequence[dict[str, Any]]],
        params: SamplingParams,
        response_format: dict[str, Any] | None = None,
    ) -> list[str | ChatError]:
        """Run many chats concurrently (at most `max_concurrency` in flight), results in order.

        A request that fails for good comes back as a ChatError in its slot instead of raising,
        so one bad item does not sink the batch and the caller can mask it.
        """
        if not conversations:
            return []

        def one(messages: Sequence[dict[str, Any]]) -> str | ChatError:
            try:
                return self.chat(messages, params, response_format)
            except ChatRequestError as exc:
                return ChatError(exc.endpoint, exc.reason, exc.status)

        workers = min(self.max_concurrency, len(conversations))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="envace-chat") as pool:
            return list(pool.map(one, conversations))

    def _request_body(
        self,
        messages: Sequence[dict[str, Any]],
        params: SamplingParams,
        response_format: dict[str, Any] | None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": list(messages),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_new_tokens,
        }
        # top_k is an sglang / vLLM extension the OpenAI API rejects: send it only when asked for.
        if params.top_k > 0:
            body["top_k"] = params.top_k
        if params.seed is not None:
            body["seed"] = params.seed
        if response_format is not None:
            body["response_format"] = response_format
        body.update(self._extra_body)
        return body

    def _wait_before_retry(self, attempt: int, attempts: int, failure: _Failure) -> None:
        delay = backoff_delay(
            attempt - 1, self.backoff_base_s, self.backoff_max_s, self._rng, failure.retry_after_s
        )
        logger.warning(
            "chat request to %s failed (attempt %d/%d): %s; retrying in %.2fs",
            failure.endpoint,
            attempt,
            attempts,
            failure.reason,
            delay,
        )
        time.sleep(delay)

    def _attempt(self, body: dict[str, Any]) -> str | _Failure:
        url = f"{self._rng.choice(self.base_urls)}/chat/completions"
        endpoint = _redact(url)
        with self._slots:
            try:
                response = self._http.post(url, json=body)
            except httpx.TimeoutException as exc:
                reason = f"no response within {self.timeout_s}s ({type(exc).__name__})"
                return _Failure(endpoint, reason, retryable=True)
            except httpx.TransportError as exc:
                reason = f"connection failed ({type(exc).__name__}: {exc})"
                return _Failure(endpoint, reason, retryable=True)
        return _read_response(endpoint, response)


def _read_response(endpoint: str, response: httpx.Response) -> str | _Failure:
    status = response.status_code
    if status == 200:
        try:
            return _message_content(response)
        except ValueError as exc:
            reason = f"HTTP 200 with an unusable body: {exc}; is this an OpenAI-compatible server?"
            return _Failure(endpoint, reason, retryable=False, status=status)
    message = _server_message(response)
    if status in _RETRYABLE_STATUS or status >= 500:
        reason = f"HTTP {status}: {message}"
        return _Failure(endpoint, reason, True, status, _retry_after(response))
    reason = (
        f"HTTP {status}: {message} (a client error, not retried: check the model name, "
        "the API key and the request parameters)"
    )
    return _Failure(endpoint, reason, retryable=False, status=status)


def _key_from_env(name: str | None) -> str | None:
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        logger.info("environment variable %s is not set: sending requests without an API key", name)
        return None
    return key


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ConfigError(f"{name}: {value!r} must be > 0")


def _check_non_negative(**values: float) -> None:
    for name, value in values.items():
        if not value >= 0:
            raise ConfigError(f"{name}: {value!r} must be >= 0")
