"""OpenAIChatClient against a real local HTTP server.

The server (tests/helpers/fake_openai.py) is a test double for a remote LLM endpoint, which cannot
run here; the client, its HTTP stack, retries, timeouts and concurrency limit are all real.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from envace.errors import ConfigError, EnvaceError
from envace.policy.openai_http import (
    ChatError,
    ChatRequestError,
    OpenAIChatClient,
    json_schema_format,
)
from envace.policy.types import ChatBackend, SamplingParams
from envace.retry import backoff_delay
from tests.helpers import fake_openai as fake

Server = fake.FakeOpenAI

PARAMS = SamplingParams(max_new_tokens=64, temperature=0.6, top_p=0.8)
MESSAGES = [{"role": "user", "content": "hello"}]
SECRET = "sk-test-very-secret-0123456789"


@pytest.fixture
def server() -> Iterator[Server]:
    with fake.running_fake_openai() as srv:
        yield srv


def make_client(base_url: str | list[str], **kwargs: object) -> OpenAIChatClient:
    options: dict[str, object] = {
        "timeout_s": 5.0,
        "max_retries": 3,
        "backoff_base_s": 0.001,
        "backoff_max_s": 0.01,
        "seed": 0,
    }
    options.update(kwargs)
    return OpenAIChatClient(base_url, "judge-model", **options)  # type: ignore[arg-type]


def test_reply_and_request_body(server: Server) -> None:
    server.queue(fake.reply("the answer"))
    fmt = json_schema_format("verdict", {"type": "object", "properties": {"answer": {}}})
    with make_client(server.base_url) as client:
        assert isinstance(client, ChatBackend)
        assert client.chat(MESSAGES, SamplingParams(top_k=5, seed=7), fmt) == "the answer"
    body = server.requests[0]
    assert body["model"] == "judge-model"
    assert body["messages"] == MESSAGES
    assert (body["temperature"], body["top_p"], body["max_tokens"]) == (1.0, 1.0, 256)
    assert (body["top_k"], body["seed"]) == (5, 7)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "verdict",
            "schema": {"type": "object", "properties": {"answer": {}}},
            "strict": True,
        },
    }


def test_optional_fields_are_left_out_and_extra_body_merged(server: Server) -> None:
    extra = {"chat_template_kwargs": {"enable_thinking": False}}
    with make_client(server.base_url, extra_body=extra) as client:
        client.chat(MESSAGES, PARAMS)
    body = server.requests[0]
    assert "top_k" not in body and "seed" not in body and "response_format" not in body
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "authorization" not in {k.lower() for k in server.headers[0]}


def test_500s_are_retried_until_success(server: Server) -> None:
    server.queue(fake.error(500), fake.error(502), fake.error(503), fake.reply("finally"))
    with make_client(server.base_url, max_retries=3) as client:
        assert client.chat(MESSAGES, PARAMS) == "finally"
    assert server.request_count == 4


def test_429_is_retried(server: Server) -> None:
    server.queue(fake.error(429, "slow down", retry_after="0"), fake.reply("ok now"))
    with make_client(server.base_url) as client:
        assert client.chat(MESSAGES, PARAMS) == "ok now"
    assert server.request_count == 2


def test_retries_exhausted_gives_a_clear_error(server: Server) -> None:
    server.queue(*[fake.error(500, "model crashed")] * 10)
    with (
        make_client(server.base_url, max_retries=2) as client,
        pytest.raises(ChatRequestError) as e,
    ):
        client.chat(MESSAGES, PARAMS)
    assert server.request_count == 3
    err = e.value
    assert isinstance(err, EnvaceError)
    assert err.endpoint == f"{server.base_url}/chat/completions"
    assert err.status == 500
    text = str(err)
    assert err.endpoint in text
    assert "gave up after 3 attempts" in text
    assert "HTTP 500: model crashed" in text


def test_400_is_not_retried_and_names_the_server_message(server: Server) -> None:
    server.queue(fake.error(400, "unknown model 'judge-model'"), fake.reply("never sent"))
    with make_client(server.base_url) as client, pytest.raises(ChatRequestError) as e:
        client.chat(MESSAGES, PARAMS)
    assert server.request_count == 1
    assert e.value.status == 400
    assert server.base_url in str(e.value)
    assert "HTTP 400: unknown model 'judge-model'" in str(e.value)
    assert "not retried" in str(e.value)


def test_timeout_is_retried_then_fails(server: Server) -> None:
    server.queue(*[fake.reply("too late", delay_s=3.0)] * 3)
    with make_client(server.base_url, timeout_s=0.2, max_retries=1) as client:
        start = time.monotonic()
        with pytest.raises(ChatRequestError) as e:
            client.chat(MESSAGES, PARAMS)
    assert time.monotonic() - start < 2.0  # two 0.2 s timeouts, not a full server delay
    assert server.request_count == 2
    assert e.value.status is None
    assert "no response within 0.2s" in str(e.value)


def test_timeout_then_success(server: Server) -> None:
    server.queue(fake.reply("too late", delay_s=3.0), fake.reply("in time"))
    with make_client(server.base_url, timeout_s=0.2) as client:
        assert client.chat(MESSAGES, PARAMS) == "in time"
    assert server.request_count == 2


def test_connection_refused_is_retried_then_fails() -> None:
    with fake.running_fake_openai() as srv:
        dead_url = srv.base_url  # a port nobody listens on once the server is stopped
    with make_client(dead_url, max_retries=2) as client, pytest.raises(ChatRequestError) as e:
        client.chat(MESSAGES, PARAMS)
    assert "gave up after 3 attempts" in str(e.value)
    assert "connection failed" in str(e.value)


def test_concurrency_never_exceeds_the_limit(server: Server) -> None:
    # a slow reply, so requests overlap even when a busy machine schedules threads late
    server.responder = lambda body: fake.reply(body["messages"][0]["content"], delay_s=0.3)
    conversations = [[{"role": "user", "content": f"q{i}"}] for i in range(12)]
    with make_client(server.base_url, max_concurrency=3) as client:
        # Two caller threads share one client: the limit is per client, not per call.
        results: list[list[str | ChatError]] = []
        threads = [
            threading.Thread(target=lambda: results.append(client.chat_many(conversations, PARAMS)))
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert 2 <= server.max_in_flight <= 3  # never above the limit; requests do overlap
    assert server.request_count == 24
    for result in results:
        assert result == [f"q{i}" for i in range(12)]


def test_chat_many_returns_failures_as_values(server: Server) -> None:
    def respond(body: dict[str, object]) -> Any:
        text = body["messages"][0]["content"]  # type: ignore[index]
        return fake.error(400, "bad item") if text == "bad" else fake.reply(text.upper())

    server.responder = respond
    conversations = [[{"role": "user", "content": c}] for c in ("a", "bad", "c")]
    with make_client(server.base_url) as client:
        results = client.chat_many(conversations, PARAMS)
    assert results[0] == "A" and results[2] == "C"
    failure = results[1]
    assert isinstance(failure, ChatError)
    assert failure.status == 400
    assert failure.endpoint == f"{server.base_url}/chat/completions"
    assert "bad item" in failure.reason
    assert client.chat_many([], PARAMS) == []


def test_api_key_is_sent_and_never_shown(
    server: Server, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ENVACE_JUDGE_API_KEY", SECRET)
    server.queue(fake.error(500, "boom"), fake.reply("ok"), fake.error(401, "invalid key"))
    caplog.set_level(logging.DEBUG)
    with make_client(server.base_url, api_key_env="ENVACE_JUDGE_API_KEY") as client:
        assert client.chat(MESSAGES, PARAMS) == "ok"
        with pytest.raises(ChatRequestError) as e:
            client.chat(MESSAGES, PARAMS)
        shown = repr(client)
    assert [h["Authorization"] for h in server.headers] == [f"Bearer {SECRET}"] * 3
    assert "invalid key" in str(e.value)
    assert "retrying" in caplog.text  # the 500 was logged ...
    for text in (str(e.value), repr(e.value), e.value.reason, caplog.text, shown):
        assert SECRET not in text  # ... and the key appears nowhere
    assert "api_key=set" in shown


def test_credentials_in_the_url_are_redacted_from_errors(server: Server) -> None:
    url = server.base_url.replace("http://", "http://user:hunter2@")
    server.queue(fake.error(404, "no such route"))
    with make_client(url) as client, pytest.raises(ChatRequestError) as e:
        client.chat(MESSAGES, PARAMS)
    assert "hunter2" not in str(e.value)
    assert e.value.endpoint == f"{server.base_url}/chat/completions"


def test_replicas_are_picked_at_random() -> None:
    with fake.running_fake_openai() as a, fake.running_fake_openai() as b:
        with make_client([a.base_url, b.base_url], seed=1) as client:
            for _ in range(20):
                client.chat(MESSAGES, PARAMS)
        assert a.request_count + b.request_count == 20
        assert a.request_count >= 3 and b.request_count >= 3


def test_unusable_200_body_is_an_error(server: Server) -> None:
    server.queue(fake.Scripted(raw_body='{"choices": []}'))
    with make_client(server.base_url) as client, pytest.raises(ChatRequestError) as e:
        client.chat(MESSAGES, PARAMS)
    assert "OpenAI-compatible" in str(e.value)
    assert server.request_count == 1


def test_backoff_grows_is_capped_and_jittered() -> None:
    rng = random.Random(0)
    for k in range(8):
        nominal = min(30.0, 2.0**k)
        delays = [backoff_delay(k, 1.0, 30.0, rng) for _ in range(100)]
        assert all(0.0 <= d <= nominal for d in delays)  # full jitter under the cap
        assert max(delays) > 0.8 * nominal
    assert backoff_delay(10_000, 1.0, 30.0, rng) <= 30.0
    assert backoff_delay(0, 1.0, 30.0, rng, retry_after_s=7.0) == 7.0
    assert backoff_delay(0, 1.0, 30.0, rng, retry_after_s=99.0) == 30.0


@pytest.mark.parametrize(
    ("base_url", "kwargs", "needle"),
    [
        ([], {}, "base_url: empty list"),
        ("judge:10001/v1", {}, "not an http(s) URL"),
        ("http:///v1", {}, "'http:///v1' is not an http(s) URL with a host"),
        ("http://[::1/v1", {}, "'http://[::1/v1' is not a valid URL (Invalid IPv6 URL)"),
        ("http://u:pw@[zz]:80/v1", {}, "'http://[zz]:80/v1' is not a valid URL"),
        ("http://judge:99999/v1", {}, "is not a valid URL (Port out of range 0-65535)"),
        ("http://judge/v1", {"max_concurrency": 0}, "max_concurrency: 0 must be > 0"),
        ("http://judge/v1", {"max_retries": -1}, "max_retries: -1 must be >= 0"),
    ],
)
def test_bad_settings_are_config_errors(
    base_url: str | list[str], kwargs: dict[str, object], needle: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(needle)):
        OpenAIChatClient(base_url, "m", **kwargs)  # type: ignore[arg-type]
