"""Checks before the first write of `envace run`: bad inputs and refused folders leave OUT as
it was; `--resume` refuses settings its checkpoint was not trained with."""

from __future__ import annotations

import importlib.util
import json
import socket
from pathlib import Path

import pytest

from envace.cli import main
from envace.config import load_config
from envace.errors import ConfigError, UserInputError
from envace.tasks.generate import write_splits
from envace.tasks.loader import load_gold
from envace.train.preflight import (
    LOCK_NAME,
    check_inputs,
    check_resume_config,
    previous_run,
    run_lock,
)
from tests.helpers.micro import MICRO
from tests.helpers.silent_server import silent_server


def _snapshot(root: Path) -> dict[Path, bytes]:
    """Every file's bytes, but the run lock's (a refused run may take the lock to look)."""
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.name != LOCK_NAME}


@pytest.fixture
def old_run(tmp_path: Path) -> Path:
    """A folder as a finished run leaves it (history and a committed checkpoint)."""
    out = tmp_path / "run"
    (out / "checkpoints" / "rl" / "iter_000002").mkdir(parents=True)
    (out / "checkpoints" / "rl" / "iter_000002" / "MANIFEST.json").write_text("{}")
    (out / "metrics.jsonl").write_text('{"iteration": 1}\n')
    (out / "config.json").write_text("{}")
    return out


def _run(out: Path, *extra: str) -> int:
    sets = [a for kv in MICRO for a in ("--set", kv)]
    return main(["run", "--out", str(out), *sets, "--set", "train.iterations=0", *extra])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ((), "already holds a run"),
        (("--overwrite", "--set", "model.path=./no/such/ckpt"), "no such checkpoint folder"),
        (("--overwrite", "--store", "ftp://x/y"), "ftp"),
        (("--overwrite", "--set", "tasks.train_file=/no/such.jsonl"), "no such file"),
        (("--overwrite", "--set", "tasks.gold_file=/g.jsonl"), "tasks.train_file is not"),
    ],
)
def test_refusals_leave_the_folder_untouched(
    old_run: Path, extra: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _snapshot(old_run)
    assert _run(old_run, *extra) == 2
    assert message in capsys.readouterr().err
    assert _snapshot(old_run) == before


def test_out_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "file"
    target.write_text("keep")
    assert _run(target) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    assert target.read_text() == "keep"


def test_previous_run_markers(tmp_path: Path, old_run: Path) -> None:
    assert previous_run(tmp_path / "empty", None) is None
    assert previous_run(old_run, None) == str(old_run / "metrics.jsonl")
    (old_run / "metrics.jsonl").unlink()
    assert previous_run(old_run, None) == str(old_run / "checkpoints" / "rl" / "iter_000002")
    # a store elsewhere holding a committed checkpoint counts too (a fresh pod, same run name)
    store = tmp_path / "store"
    (store / "checkpoints" / "init").mkdir(parents=True)
    (store / "checkpoints" / "init" / "MANIFEST.json").write_text("{}")
    found = previous_run(tmp_path / "fresh", str(store))
    assert found is not None and found.endswith("checkpoints/init")


def _task_files(tmp_path: Path) -> Path:
    write_splits(tmp_path / "t", 4, 2, 0)
    return tmp_path / "t"


def test_task_files_are_checked_where_the_user_gave_them(tmp_path: Path) -> None:
    t = _task_files(tmp_path)
    ok = [f"tasks.train_file={t / 'train.jsonl'}", f"tasks.gold_file={t / 'gold_train.jsonl'}"]
    check_inputs(load_config(None, ok), tmp_path / "out", None)
    with pytest.raises(ConfigError, match=r"set tasks\.gold_file"):
        check_inputs(load_config(None, ok[:1]), tmp_path / "out", None)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    with pytest.raises(UserInputError) as err:
        check_inputs(load_config(None, [f"tasks.train_file={bad}"]), tmp_path / "out", None)
    assert str(bad) in str(err.value)  # the user's file, not OUT's copy
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"task_id": "a", "messages": []}\n{oops\n', "gold.jsonl:2: not valid JSON"),
        ("[1, 2]\n", "gold.jsonl:1: expected an object with a string task_id"),
        ('{"task_id": 3, "messages": []}\n', "gold.jsonl:1: expected an object"),
    ],
)
def test_gold_lines_name_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "gold.jsonl"
    path.write_text(text)
    with pytest.raises(UserInputError, match=message):
        load_gold(path)


def test_resume_refuses_other_model_or_sharing(tmp_path: Path) -> None:
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps(load_config(None, MICRO).to_dict()))
    check_resume_config(load_config(None, [*MICRO, "train.iterations=9"]), saved)  # allowed
    with pytest.raises(ConfigError, match=r"model\.preset is 'tiny-4m' but the run was started"):
        check_resume_config(load_config(None, [*MICRO, "model.preset=tiny-4m"]), saved)
    with pytest.raises(ConfigError, match=r"algo\.sharing is 'noshare'"):
        check_resume_config(load_config(None, [*MICRO, "algo.sharing=noshare"]), saved)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _external(url: str) -> list[str]:
    return [*MICRO, "rollout.mode=external", f"rollout.external_endpoint={url}"]


def test_external_endpoint_must_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake server is a test double for a remote OpenAI-compatible endpoint."""
    import envace.train.preflight as preflight
    from tests.helpers.fake_openai import running_fake_openai

    monkeypatch.setattr(preflight, "SERVICE_CHECK_TIMEOUT_S", 0.5)
    with running_fake_openai() as server:  # any HTTP answer (here 501 to GET) will do
        check_inputs(load_config(None, _external(server.base_url)), tmp_path / "o", None)
    dead = f"http://127.0.0.1:{_free_port()}/v1"
    with pytest.raises(ConfigError, match=r"rollout\.external_endpoint: no answer from"):
        check_inputs(load_config(None, _external(dead)), tmp_path / "o", None)
    with silent_server() as port, pytest.raises(ConfigError, match=r"within 0\.5 s"):
        check_inputs(
            load_config(None, _external(f"http://127.0.0.1:{port}/v1")), tmp_path / "o", None
        )


def test_vllm_must_be_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vllm = [*MICRO, "rollout.backend=vllm"]
    with pytest.raises(ConfigError, match=r"rollout\.vllm\.python: /no/python: no such"):
        check_inputs(
            load_config(None, [*vllm, "rollout.vllm={python: /no/python}"]), tmp_path, None
        )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="vllm is not installed in this Python"):
        check_inputs(load_config(None, vllm), tmp_path, None)


def test_a_folder_in_use_is_refused(
    tmp_path: Path, old_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """While one run holds the folder, a second (even with --overwrite) stops at once."""
    before = _snapshot(old_run)
    with run_lock(old_run):
        assert _run(old_run, "--overwrite") == 2
        assert "another envace run (pid " in capsys.readouterr().err
    assert _snapshot(old_run) == before
    with run_lock(old_run):  # released: it can be taken again
        pass
