"""The BFCL adapter: bfcl-eval's own data and checkers, in a worker process of their own venv.

Every test that talks to the worker needs the bfcl-eval venv (`bash scripts/setup_bfcl.sh`; `make
test` builds it) and is skipped, saying so, where it cannot exist. The unit tests at the top need
nothing.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from envace.cli import main
from envace.errors import UserInputError
from envace.evaluate.bfcl import (
    SUPPORTED_CATEGORIES,
    BfclEnvironment,
    BfclOraclePolicy,
    BfclWorker,
    EmptyPolicy,
    bfcl_python,
    episode_output,
    load_bfcl_tasks,
    parse_categories,
    run_bfcl,
    summarize_bfcl,
)
from envace.policy.types import ToolCall
from envace.rollout.engine import RolloutConfig
from envace.rollout.types import Trajectory
from envace.tasks.model import Task

needs_bfcl = pytest.mark.skipif(
    bfcl_python() is None,
    reason="no bfcl-eval venv (.cache/bfcl-venv): run `bash scripts/setup_bfcl.sh`",
)
SAMPLE = 12  # evenly spaced entries per category


def test_categories_parse_with_aliases_and_errors() -> None:
    assert parse_categories("simple, multi_turn_base,simple") == [
        "simple_python",
        "multi_turn_base",
    ]
    assert parse_categories("all") == list(SUPPORTED_CATEGORIES)
    for bad in ("live_simple", "", "simple_java"):
        with pytest.raises(UserInputError):
            parse_categories(bad)


def test_episode_output_takes_parsed_calls_per_turn_and_step() -> None:
    task = Task(id="e", tools=(), turns=())

    def calls(*names: str) -> list[dict[str, object]]:
        return [ToolCall(n, {"x": 1}).to_message_dict(f"c{i}") for i, n in enumerate(names)]

    traj = Trajectory(task=task, traj_id="e#0")
    traj.messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "", "tool_calls": calls("a", "b")},
        {"role": "tool", "content": "{}"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "", "tool_calls": calls("c")},
    ]
    one = {"arguments": {"x": 1}}
    assert episode_output(traj, multi_turn=False) == [
        {"name": "a", **one},
        {"name": "b", **one},
    ]
    assert episode_output(traj, multi_turn=True) == [
        [[{"name": "a", **one}, {"name": "b", **one}], []],
        [[{"name": "c", **one}]],
    ]


def test_missing_venv_is_a_clear_user_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ENVACE_BFCL_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(UserInputError, match=r"setup_bfcl\.sh"):
        BfclWorker()
    args = ["evaluate", "--policy", "oracle", "--benchmark", "bfcl:simple"]
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    assert "setup_bfcl.sh" in capsys.readouterr().err


@pytest.fixture(scope="module")
def worker() -> Iterator[BfclWorker]:
    with BfclWorker() as w:
        yield w


@pytest.fixture(scope="module")
def tasks(worker: BfclWorker) -> dict[str, list[Task]]:
    return load_bfcl_tasks(worker, SUPPORTED_CATEGORIES, limit=SAMPLE)


def _flat(tasks: dict[str, list[Task]]) -> list[Task]:
    return [t for ts in tasks.values() for t in ts]


@needs_bfcl
@pytest.mark.slow
def test_oracle_replay_scores_100_percent_on_every_category(
    worker: BfclWorker, tasks: dict[str, list[Task]]
) -> None:
    episodes = run_bfcl(BfclOraclePolicy(), _flat(tasks), RolloutConfig(), worker)
    scores = summarize_bfcl(episodes)
    assert list(scores) == list(SUPPORTED_CATEGORIES)
    for cat, s in scores.items():
        assert (s.n, s.accuracy, s.error_types) == (SAMPLE, 1.0, {}), cat
    multi = [e for e in episodes if e.category == "multi_turn_base"]
    # the calls really ran in bfcl-eval's classes: results are theirs, not a stub
    results = [c.result for e in multi for c in e.trajectory.calls]
    assert results and all(r != {"status": "recorded"} for r in results)
    assert all(e.trajectory.final_state for e in multi)
    assert "bfcl_eval" not in sys.modules  # grading happened in the worker, not here


@needs_bfcl
@pytest.mark.slow
def test_empty_policy_scores_zero(worker: BfclWorker, tasks: dict[str, list[Task]]) -> None:
    scores = summarize_bfcl(run_bfcl(EmptyPolicy(), _flat(tasks), RolloutConfig(), worker))
    assert {c: s.accuracy for c, s in scores.items()} == dict.fromkeys(SUPPORTED_CATEGORIES, 0.0)


def _gorilla_task(tasks: dict[str, list[Task]]) -> Task:
    return next(t for t in tasks["multi_turn_base"] if t.id == "multi_turn_base_0")


@needs_bfcl
@pytest.mark.slow
def test_multi_turn_episodes_are_isolated(worker: BfclWorker, tasks: dict[str, list[Task]]) -> None:
    task = _gorilla_task(tasks)
    a, b = (BfclEnvironment(worker, task, key) for key in ("iso-a", "iso-b"))
    for env in (a, b):
        env.reset({})
        assert "error" not in env.call("cd", {"folder": "document"})
        assert "error" not in env.call("mkdir", {"dir_name": "temp"})
    again = a.call("mkdir", {"dir_name": "temp"})  # state persists inside one episode
    assert "error" in again and "exists" in json.dumps(again)
    a.reset({})  # a new episode on the same key starts from the entry's initial state
    assert "error" not in a.call("cd", {"folder": "document"})
    assert "error" not in a.call("mkdir", {"dir_name": "temp"})
    state = a.snapshot()["GorillaFileSystem"]
    assert "temp" in json.dumps(state)
    # grading re-executes in fresh instances: the same output grades the same twice
    truth = [
        [{"name": c.name, "arguments": c.arguments} for c in t.expected_calls] for t in task.turns
    ]
    output = [[calls] for calls in truth]
    first = worker.request("grade", id=task.id, output=output)
    second = worker.request("grade", id=task.id, output=output)
    assert first == second == {"valid": True, "error_type": None, "error": None}
    for env in (a, b):
        env.close()


@needs_bfcl
@pytest.mark.slow
def test_model_output_is_data_never_code(
    worker: BfclWorker, tasks: dict[str, list[Task]], tmp_path: Path
) -> None:
    task = _gorilla_task(tasks)
    env = BfclEnvironment(worker, task, "hostile")
    env.reset({})
    marker = tmp_path / "pwned"
    payload = f"x'); open({str(marker)!r}, 'w'); ('"
    # unknown names never reach eval: builtins, dunders, other classes' methods
    for name in ("open", "exec", "__import__", "eval", "kill"):
        result = env.call(name, {"file": str(marker), "mode": "w"})
        assert result["error"]["code"] == "UNKNOWN_TOOL", name
    # an argument key that is not an identifier is refused
    bad_key = env.call("cd", {"folder='x'), open('" + str(marker) + "', 'w'), ('": 1})
    assert bad_key["error"]["code"] == "UNKNOWN_TOOL"
    # a hostile string value stays a string: it becomes file content in the simulated disk
    assert "error" not in env.call("touch", {"file_name": "notes.txt"})
    assert "error" not in env.call("echo", {"content": payload, "file_name": "notes.txt"})
    assert env.call("cat", {"file_name": "notes.txt"}) == {"file_content": payload}
    # and in grading too
    verdict = worker.request(
        "grade", id=task.id, output=[[[{"name": "__import__", "arguments": {"name": "os"}}]]]
    )
    assert verdict["valid"] is False
    assert not marker.exists()
    env.close()


@needs_bfcl
@pytest.mark.slow
def test_cli_writes_per_category_reports_with_rehearsal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bfcl"
    args = ["evaluate", "--policy", "oracle", "--benchmark", "bfcl:simple,multi_turn_base"]
    assert main([*args, "--limit", "3", "--out", str(out), "--rehearsal", "parallel:2"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["benchmark"] == "bfcl" and report["score_name"] == "accuracy"
    assert {c: v["score"] for c, v in report["categories"].items()} == {
        "simple_python": 1.0,
        "multi_turn_base": 1.0,
    }
    assert report["overall"] == {"n": 6, "score_micro": 1.0, "score_macro": 1.0}
    gain = report["rehearsal"]["overall"]
    assert (gain["success_without"], gain["success_with"], gain["gain"]) == (1.0, 1.0, 0.0)
    assert gain["extra_generations"] > 0
    assert set(report["rehearsal"]["categories"]) == {"simple_python", "multi_turn_base"}
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 6
    assert len((out / "rehearsal" / "memories.jsonl").read_text().splitlines()) == 6
    md = (out / "report.md").read_text()
    assert "| simple_python | 3 | 1.000 | 1.000 | 0.000 |" in md
    assert "bfcl-eval" in capsys.readouterr().out
