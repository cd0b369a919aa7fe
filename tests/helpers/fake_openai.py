"""A test double for a remote OpenAI-compatible LLM endpoint, which cannot run here.

A real HTTP server (`http.server.ThreadingHTTPServer` on 127.0.0.1, a free port, serving in a
background thread) that answers `POST /v1/chat/completions` with scripted behaviour: a fixed
reply, an HTTP error with an OpenAI-style error body, a delay (to trip client timeouts), or a reply
computed from the request (for judge tests whose requests run in parallel, in any order).

It records every request body and its headers, and the largest number of requests it was serving
at once, so tests can check what a client sent and how many requests it kept in flight.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeOpenAI", "Scripted", "error", "reply", "running_fake_openai"]


@dataclass(frozen=True)
class Scripted:
    """One scripted answer: wait `delay_s`, then send `status` with `content` or `error_message`."""

    status: int = 200
    content: str | None = "ok"
    error_message: str = ""
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: str | None = None  # sent verbatim instead of the OpenAI layout


def reply(content: str, delay_s: float = 0.0) -> Scripted:
    """A successful chat completion whose message content is `content`."""
    return Scripted(content=content, delay_s=delay_s)


def error(status: int, message: str = "scripted failure", **headers: str) -> Scripted:
    """An HTTP error with the OpenAI error layout `{"error": {"message": ...}}`."""
    return Scripted(status=status, content=None, error_message=message, headers=headers)


Responder = Callable[[dict[str, Any]], Scripted]


class FakeOpenAI:
    """The server state. Answers come from `queue(...)` first, then from `responder(body)`."""

    def __init__(self, responder: Responder | None = None) -> None:
        self.responder: Responder = responder or (lambda body: reply("ok"))
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.max_in_flight = 0
        self._in_flight = 0
        self._script: deque[Scripted] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        # A short poll interval keeps shutdown (once per test) fast.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    @property
    def request_count(self) -> int:
        with self._lock:
            return len(self.requests)

    def queue(self, *answers: Scripted) -> None:
        """Answer the next requests with `answers`, in order."""
        with self._lock:
            self._script.extend(answers)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()  # wakes handlers sleeping on a scripted delay
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _begin(self, body: dict[str, Any], headers: dict[str, str]) -> Scripted:
        with self._lock:
            self.requests.append(body)
            self.headers.append(headers)
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
            scripted = self._script.popleft() if self._script else None
        return scripted if scripted is not None else self.responder(body)

    def _end(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _wait(self, seconds: float) -> None:
        self._stopping.wait(seconds)


def _completion(content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "model": "fake",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
    }


def _handler_for(server: FakeOpenAI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            if self.path != "/v1/chat/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            answer = server._begin(body, dict(self.headers.items()))
            try:
                server._wait(answer.delay_s)
            finally:
                # Ended before the reply is sent: a client that reads it may send its next
                # request at once, before this thread would run again.
                server._end()
            try:
                if answer.raw_body is not None:
                    self._send_text(answer.status, answer.raw_body, answer.headers)
                elif answer.status == 200 and answer.content is not None:
                    self._send(200, _completion(answer.content), answer.headers)
                else:
                    payload = {"error": {"message": answer.error_message, "type": "scripted"}}
                    self._send(answer.status, payload, answer.headers)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout): exactly what timeout tests provoke

        def _send(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            self._send_text(status, json.dumps(payload), headers or {})

        def _send_text(self, status: int, text: str, headers: dict[str, str]) -> None:
            data = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            """Silence the per-request access log."""

    return Handler


@contextmanager
def running_fake_openai(responder: Responder | None = None) -> Iterator[FakeOpenAI]:
    """A started FakeOpenAI, stopped on exit."""
    server = FakeOpenAI(responder)
    server.start()
    try:
        yield server
    finally:
        server.stop()
