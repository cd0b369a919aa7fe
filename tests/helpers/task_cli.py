"""Shared by the `envace tasks` CLI tests: run a command in-process, and a minimal valid task."""

from __future__ import annotations

from typing import Any

import pytest

from envace.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `envace ARGV`; never a traceback."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def task(task_id: str, **changes: Any) -> dict[str, Any]:
    """A one-tool, one-turn task that validates, with `changes` applied on top."""
    data: dict[str, Any] = {
        "id": task_id,
        "tools": [{"type": "function", "function": {"name": "ping", "parameters": {}}}],
        "turns": [{"user": "ping", "expected_calls": [{"name": "ping", "arguments": {}}]}],
    }
    data.update(changes)
    return data
