"""The EnvACE side of the BFCL worker: a subprocess of the bfcl-eval virtual environment.

bfcl-eval pins numpy 1.26.4 and pulls every vendor SDK, keeps environment instances in module
globals and executes calls with `eval()`. So it lives in its own venv (`scripts/setup_bfcl.sh`
builds `.cache/bfcl-venv`) and only `worker.py` imports it, in a child process. This module starts
that process and exchanges JSON lines with it; nothing from bfcl-eval is imported here.

Where the venv is: `$ENVACE_BFCL_PYTHON` (a Python executable), else `.cache/bfcl-venv/bin/python`
under the current directory or the repository root. bfcl-eval writes result/score/lock folders
under `BFCL_PROJECT_ROOT`; the worker gets a private temporary one unless the variable is set.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from envace.errors import EnvaceError, UserInputError

__all__ = ["BfclWorker", "BfclWorkerError", "bfcl_python", "bfcl_venv_hint"]

log = logging.getLogger(__name__)

_WORKER = Path(__file__).with_name("worker.py")
_REPO_ROOT = Path(__file__).resolve().parents[3]
_VENV_PYTHON = Path(".cache") / "bfcl-venv" / "bin" / "python"


class BfclWorkerError(EnvaceError):
    """The BFCL worker failed a request or died."""


def bfcl_venv_hint() -> str:
    return (
        "create the BFCL environment with `bash scripts/setup_bfcl.sh` (about 1 minute, ~560 MB "
        "in .cache/bfcl-venv), or point ENVACE_BFCL_PYTHON at a Python that has bfcl-eval"
    )


def bfcl_python() -> Path | None:
    """The Python of the bfcl-eval venv, or None when there is none."""
    explicit = os.environ.get("ENVACE_BFCL_PYTHON")
    if explicit:
        return Path(explicit) if Path(explicit).is_file() else None
    for base in (Path.cwd(), _REPO_ROOT):
        candidate = base / _VENV_PYTHON
        if candidate.is_file():
            return candidate
    return None


class BfclWorker:
    """One worker process; `request(op, **fields)` returns the worker's `result`.

    timeout_s bounds each request (a stuck bfcl-eval call kills the worker rather than the run).
    """

    def __init__(self, python: Path | None = None, timeout_s: float = 300.0) -> None:
        exe = python or bfcl_python()
        if exe is None:
            raise UserInputError(f"no bfcl-eval environment found; {bfcl_venv_hint()}")
        self.timeout_s = timeout_s
        env = dict(os.environ)
        self._root: tempfile.TemporaryDirectory[str] | None = None
        if "BFCL_PROJECT_ROOT" not in env:
            self._root = tempfile.TemporaryDirectory(prefix="envace-bfcl-")
            env["BFCL_PROJECT_ROOT"] = self._root.name
        self._proc = subprocess.Popen(
            [str(exe), str(_WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self._stderr: list[str] = []
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        self.info: dict[str, Any] = self.request("hello")

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)
            del self._stderr[:-200]  # keep the tail for error messages
            log.debug("bfcl worker: %s", line.rstrip())

    def request(self, op: str, **fields: Any) -> Any:
        if self._proc.poll() is not None:
            raise BfclWorkerError(f"the BFCL worker has exited:\n{self._tail()}")
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self._proc.stdin.flush()
        reply = self._read_reply(op)
        if not reply.get("ok"):
            raise BfclWorkerError(f"BFCL worker, op {op!r}: {reply.get('error')}")
        return reply.get("result")

    def _read_reply(self, op: str) -> dict[str, Any]:
        assert self._proc.stdout is not None
        box: list[str] = []
        reader = threading.Thread(target=lambda: box.append(self._proc.stdout.readline()))  # type: ignore[union-attr]
        reader.start()
        reader.join(self.timeout_s)
        if reader.is_alive() or not box or not box[0]:
            self.close()
            raise BfclWorkerError(
                f"BFCL worker gave no answer to {op!r} within {self.timeout_s:.0f} s:\n{self._tail()}"
            )
        reply: dict[str, Any] = json.loads(box[0])
        return reply

    def _tail(self) -> str:
        return "".join(self._stderr[-20:]) or "(no output on stderr)"

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write('{"op": "shutdown"}\n')
                self._proc.stdin.flush()
                self._proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None:
                stream.close()
        self._drain.join(timeout=5)
        if self._proc.stderr is not None:
            self._proc.stderr.close()
        if self._root is not None:
            self._root.cleanup()
            self._root = None

    def __enter__(self) -> BfclWorker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
