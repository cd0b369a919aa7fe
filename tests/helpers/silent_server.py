"""A TCP server on 127.0.0.1 that accepts connections and never answers: a hung service (an
S3 endpoint, a KFP API, a model server) for the tests of bounded waits. Connections are held
open until the context ends, so clients wait for a reply rather than seeing a reset."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["silent_server"]


@contextmanager
def silent_server() -> Iterator[int]:
    """The port of a started silent server, stopped on exit."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(0.05)
    held: list[socket.socket] = []
    stop = threading.Event()

    def hold() -> None:
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        listener.close()
