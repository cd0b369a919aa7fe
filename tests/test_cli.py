"""The `envace` entry point turns errors a user can act on into one line and an exit code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envace.cli import main


def _refuse(*args: Any, **kwargs: Any) -> None:
    raise PermissionError(13, "Permission denied", "/data/tasks/train.jsonl")


def test_os_error_is_one_line_with_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import envace.tasks.generate

    monkeypatch.setattr(envace.tasks.generate, "write_splits", _refuse)
    args = ["tasks", "generate", "--out", str(tmp_path / "t"), "--n-train", "2", "--n-test", "1"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "envace: error: Permission denied: /data/tasks/train.jsonl" in err
    assert "Traceback" not in err
    with pytest.raises(PermissionError):  # -v: the traceback, for a bug report
        main(["-v", *args])


def test_envace_error_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failure EnvACE explains (not a user input): its message, exit 1, no traceback."""
    import envace.tasks.generate
    from envace.tasks.generate import GenerationError

    def fail(*args: Any, **kwargs: Any) -> None:
        raise GenerationError("could not build 2 distinct tasks for world 'bank'")

    monkeypatch.setattr(envace.tasks.generate, "write_splits", fail)
    args = ["tasks", "generate", "--out", str(tmp_path / "t"), "--n-train", "2", "--n-test", "1"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err == "envace: error: could not build 2 distinct tasks for world 'bank'\n"
    with pytest.raises(GenerationError):
        main(["-v", *args])


@pytest.mark.parametrize("name", ["../other", "/abs", "a b"])
def test_train_run_name_is_one_plain_key(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--run-name", name]) == 2
    assert "--run-name" in capsys.readouterr().err
