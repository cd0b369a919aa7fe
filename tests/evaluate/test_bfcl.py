"""The BFCL adapter: bfcl-eval's own data and checkers, in a worker process of their own venv.

Every test that talks to the worker needs the bfcl-eval venv (`bash scripts/setup_bfcl.sh`; `make
test` builds it) and is skipped, saying so, where it cannot exist. The unit tests at the top need
nothing.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from envace.cli import main
from envace.errors import UserInputError
from envace.evaluate.benchmarks import BenchmarkReport, bfcl_overall_line
from envace.evaluate.bfcl import (
    CATEGORY_ALIASES,
    SUPPORTED_CATEGORIES,
    BfclEnvironment,
    BfclOraclePolicy,
    BfclWorker,
    EmptyPolicy,
    bfcl_overall,
    bfcl_python,
    category_weights,
    episode_output,
    load_bfcl_tasks,
    parse_categories,
    run_bfcl,
    summarize_bfcl,
    task_from_record,
)
from envace.evaluate.bfcl.adapter import model_context
from envace.policy.chat import ChatRenderer, format_assistant_response
from envace.policy.types import Generation, SamplingParams, ToolCall
from envace.rollout.engine import RolloutConfig
from envace.rollout.policies import GenRequest, Policy
from envace.rollout.types import EndReason, Trajectory
from envace.tasks.model import Task

needs_bfcl = pytest.mark.skipif(
    bfcl_python() is None,
    reason="no bfcl-eval venv (.cache/bfcl-venv): run `bash scripts/setup_bfcl.sh`",
)
SAMPLE = 4  # evenly spaced entries per category
# BFCL's own broken ground truth: no output can pass bfcl-eval's checker on these entries, so
# the ground-truth replay fails them (all 5,000+ entries replayed, bfcl-eval 2026.3.23):
# - simple_java_36, simple_java_65: an ArrayList of `any` whose answer mixes numbers and booleans
#   with strings; bfcl-eval's java_type_converter turns every `any` element into a string.
# - simple_java_64: the HashMap answer {"format": "epoch_millis"} is a bare string where the dict
#   checker expects a list of accepted values (it compares the value with its characters).
# - live_simple_106-63-0, live_simple_112-68-0: a required parameter whose accepted values are
#   an empty list.
# - live_multiple_862-181-3: the answer needs `journey_start_time`, which the function lacks.
# - live_multiple_964-207-0: the answer names `question`; the function requires `statement`.
BROKEN_GROUND_TRUTH = {
    "simple_java_36",
    "simple_java_64",
    "simple_java_65",
    "live_simple_106-63-0",
    "live_simple_112-68-0",
    "live_multiple_862-181-3",
    "live_multiple_964-207-0",
}
IRRELEVANCE = ("irrelevance", "live_irrelevance")


# --- unit tests (no worker) ----------------------------------------------------------------------
def test_categories_parse_with_aliases_and_errors() -> None:
    assert parse_categories("simple, multi_turn_base,simple_python") == [
        "simple_python",
        "simple_java",
        "simple_javascript",
        "multi_turn_base",
    ]
    assert parse_categories("all") == list(SUPPORTED_CATEGORIES)
    assert parse_categories("live") == [
        "live_simple",
        "live_multiple",
        "live_parallel",
        "live_parallel_multiple",
        "live_irrelevance",
    ]
    assert parse_categories("memory") == ["memory_kv", "memory_rec_sum"]
    groups = [
        c for alias in ("non_live", "live", "multi_turn", "memory") for c in parse_categories(alias)
    ]
    assert groups == list(SUPPORTED_CATEGORIES) == list(CATEGORY_ALIASES["all"])
    with pytest.raises(UserInputError, match="network"):
        parse_categories("web_search_base")
    with pytest.raises(UserInputError, match="hub"):
        parse_categories("memory_vector")
    for bad in ("", "simple_rust", "exec_simple"):
        with pytest.raises(UserInputError):
            parse_categories(bad)


def _message(*calls: str, content: str = "") -> dict[str, Any]:
    tool_calls = [ToolCall(n, {"x": 1}).to_message_dict(f"c{i}") for i, n in enumerate(calls)]
    return {
        "role": "assistant",
        "content": content,
        **({"tool_calls": tool_calls} if calls else {}),
    }


def test_episode_output_takes_parsed_calls_per_turn_and_step() -> None:
    history = [{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "hi"}]
    task = Task(id="e", tools=(), turns=(), meta={"history": history})
    traj = Trajectory(task=task, traj_id="e#0")
    traj.messages = [
        {"role": "system", "content": "s"},
        *history,  # what came before the first question is not model output
        {"role": "user", "content": "u1"},
        _message("a", "b"),
        {"role": "tool", "content": "{}"},
        _message(content="ok"),
        {"role": "user", "content": "u2"},
        _message("c"),
    ]
    one = {"arguments": {"x": 1}}
    assert episode_output(traj, "ast") == [{"name": "a", **one}, {"name": "b", **one}]
    assert episode_output(traj, "irrelevance") == episode_output(traj, "ast")
    assert episode_output(traj, "multi_turn") == [
        [[{"name": "a", **one}, {"name": "b", **one}], []],
        [[{"name": "c", **one}]],
    ]
    assert episode_output(traj, "memory") == [
        {"calls": [{"name": "a", **one}, {"name": "b", **one}], "content": ""},
        {"calls": [], "content": "ok"},
    ]


def test_overall_weights_follow_bfcl_sections() -> None:
    counts = {
        "live_simple": 258,
        "live_multiple": 1053,
        "live_parallel": 16,
        "live_parallel_multiple": 24,
    }
    weights = category_weights(counts)
    assert sum(w for _, w in weights.values()) == pytest.approx(1.0)
    expected = {
        "simple_java": ("non_live", 0.10 / 12),
        "multiple": ("non_live", 0.025),
        "live_multiple": ("live", 0.10 * 1053 / 1351),
        "live_irrelevance": ("irrelevance", 0.05),
        "multi_turn_long_context": ("multi_turn", 0.075),
        "web_search_base": ("agentic", 0.10),
        "memory_kv": ("agentic", 0.20 / 3),
    }
    for cat, (section, share) in expected.items():
        assert weights[cat][0] == section and weights[cat][1] == pytest.approx(share), cat
    # categories not run count 0; coverage is the weight that ran; live_relevance weighs nothing
    only = bfcl_overall({"multi_turn_base": 1.0, "irrelevance": 0.5, "live_relevance": 1.0}, counts)
    assert only.bfcl_overall == pytest.approx(0.075 + 0.025)
    assert only.coverage == pytest.approx(0.075 + 0.05)
    assert only.sections == {
        "non_live": 0.0,
        "live": 0.0,
        "irrelevance": pytest.approx(0.25),
        "multi_turn": pytest.approx(0.25),
        "agentic": 0.0,
    }


def test_report_shows_bfcl_overall_and_coverage_not_micro_macro() -> None:
    overall = {"n": 6, "bfcl_overall": 0.1, "coverage": 0.4, "sections": {"live": 0.5}}
    report = BenchmarkReport(
        "bfcl", "oracle", 0, "accuracy", {"live_simple": {"n": 6, "score": 0.5}}, overall
    )
    md = report.markdown()
    assert bfcl_overall_line(overall, None) in md
    assert (
        "overall (bfcl-eval's weighted v4 score; categories not run count 0): 0.100, coverage 0.400"
        in md
    )
    assert "| overall |" not in md and "macro" not in md


def test_context_is_the_models_window_when_known() -> None:
    config = SimpleNamespace(max_position_embeddings=40960)
    model_policy = SimpleNamespace(backend=SimpleNamespace(model=SimpleNamespace(config=config)))
    assert model_context(model_policy) == 40960  # type: ignore[arg-type]
    assert model_context(BfclOraclePolicy()) is None


def test_missing_venv_is_a_clear_user_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ENVACE_BFCL_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(UserInputError, match=r"setup_bfcl\.sh"):
        BfclWorker()
    args = ["evaluate", "--policy", "oracle", "--benchmark", "bfcl:simple"]
    assert main([*args, "--out", str(tmp_path / "o")]) == 2
    assert "setup_bfcl.sh" in capsys.readouterr().err


# --- through the worker ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def worker() -> Iterator[BfclWorker]:
    with BfclWorker() as w:
        yield w


@pytest.fixture(scope="module")
def tasks(worker: BfclWorker) -> dict[str, list[Task]]:
    return load_bfcl_tasks(worker, SUPPORTED_CATEGORIES, limit=SAMPLE)


def _flat(tasks: dict[str, list[Task]]) -> list[Task]:
    return [t for ts in tasks.values() for t in ts]


def _load(worker: BfclWorker, category: str, *ids: str) -> list[Task]:
    return [task_from_record(r) for r in worker.request("load", category=category, ids=list(ids))]


@needs_bfcl
def test_worker_categories_and_step_limit_are_bfcl_evals(worker: BfclWorker) -> None:
    assert worker.info["categories"] == list(SUPPORTED_CATEGORIES)
    assert worker.info["step_limit"] == 20  # bfcl-eval's MAXIMUM_STEP_LIMIT
    assert worker.info["live_counts"] == {
        "live_simple": 258,
        "live_multiple": 1053,
        "live_parallel": 16,
        "live_parallel_multiple": 24,
    }


@needs_bfcl
@pytest.mark.slow
def test_oracle_replay_passes_every_category(
    worker: BfclWorker, tasks: dict[str, list[Task]]
) -> None:
    episodes = run_bfcl(BfclOraclePolicy(), _flat(tasks), RolloutConfig(), worker)
    scores = summarize_bfcl(episodes)
    assert list(scores) == list(SUPPORTED_CATEGORIES)
    failed = {e.task_id for e in episodes if not e.valid}
    assert failed <= BROKEN_GROUND_TRUTH  # every other entry passes bfcl-eval's checker
    broken = {
        c: sum(1 for e in episodes if e.category == c and e.task_id in failed) for c in scores
    }
    assert {c: (s.n, s.accuracy) for c, s in scores.items()} == {
        c: (SAMPLE, 1 - broken[c] / SAMPLE) for c in SUPPORTED_CATEGORIES
    }
    multi = [e for e in episodes if e.category.startswith("multi_turn")]
    # the calls really ran in bfcl-eval's classes: results are theirs, not a stub
    results = [c.result for e in multi for c in e.trajectory.calls]
    assert results and all(r != {"status": "recorded"} for r in results)
    assert all(e.trajectory.final_state for e in multi)
    assert "bfcl_eval" not in sys.modules  # grading happened in the worker, not here


@needs_bfcl
@pytest.mark.slow
def test_oracle_fails_only_bfcls_broken_ground_truth(worker: BfclWorker) -> None:
    by_cat: dict[str, list[str]] = {}
    for entry_id in sorted(BROKEN_GROUND_TRUTH):
        by_cat.setdefault(entry_id.rsplit("_", 1)[0], []).append(entry_id)
    broken = [t for cat, ids in by_cat.items() for t in _load(worker, cat, *ids)]
    episodes = run_bfcl(BfclOraclePolicy(), broken, RolloutConfig(), worker)
    assert {e.task_id for e in episodes} == BROKEN_GROUND_TRUTH
    assert not any(e.valid for e in episodes)


@needs_bfcl
@pytest.mark.slow
def test_empty_policy_passes_only_irrelevance(
    worker: BfclWorker, tasks: dict[str, list[Task]]
) -> None:
    scores = summarize_bfcl(run_bfcl(EmptyPolicy(), _flat(tasks), RolloutConfig(), worker))
    expected = {c: 1.0 if c in IRRELEVANCE else 0.0 for c in SUPPORTED_CATEGORIES}
    assert {c: s.accuracy for c, s in scores.items()} == expected


@needs_bfcl
def test_overall_matches_bfcl_evals_own_aggregation(worker: BfclWorker) -> None:
    """Hand-made score tables through bfcl-eval's `generate_leaderboard_csv` (data_overall.csv,
    percentages with two decimals) against `bfcl_overall`; missing categories count 0 in both."""
    counts = worker.info["live_counts"]
    every = list(category_weights(counts))
    rnd = random.Random(17)
    for dropped in (0, 4, 11):
        accuracy = {c: round(rnd.random(), 4) for c in every}
        for c in rnd.sample(every, dropped):
            del accuracy[c]
        table = {c: {"accuracy": a, "total_count": counts.get(c, 100)} for c, a in accuracy.items()}
        row = worker.request("leaderboard", scores=table)
        ours = bfcl_overall(accuracy, counts)
        assert float(row["Overall Acc"].rstrip("%")) == pytest.approx(
            ours.bfcl_overall * 100, abs=0.006
        )
        for column, section in (("Live Acc", "live"), ("Multi Turn Acc", "multi_turn")):
            assert float(row[column].rstrip("%")) == pytest.approx(
                ours.sections[section] * 100, abs=0.006
            )


@needs_bfcl
def test_miss_func_reveals_the_held_out_function_in_its_turn(worker: BfclWorker) -> None:
    (task,) = _load(worker, "multi_turn_miss_func", "multi_turn_miss_func_0")
    names = {t["function"]["name"] for t in task.tools}
    assert "sort" not in names and "mv" in names  # held back from the tools...
    reveal = task.turns[3]
    assert "'name': 'sort'" in reveal.user  # ...and shown in turn 3, as the Qwen3-FC handler does
    assert reveal.user.endswith(
        "I have updated some more functions you can choose from. What about now?"
    )
    assert [c.name for c in reveal.expected_calls] == ["sort"]
    assert task.turns[2].expected_calls == ()  # the turn it could not be done
    (episode,) = run_bfcl(BfclOraclePolicy(), [task], RolloutConfig(), worker)
    assert episode.valid
    assert "sort" in [c.call.name for c in episode.trajectory.calls if c.turn == 3]


@needs_bfcl
def test_earlier_messages_of_the_question_stay_in_order(worker: BfclWorker) -> None:
    (task,) = _load(worker, "live_irrelevance", "live_irrelevance_125-11-0")
    history = task.meta["history"]
    assert [m["role"] for m in history][-1] == "assistant" and len(task.turns) == 1
    (episode,) = run_bfcl(EmptyPolicy(), [task], RolloutConfig(), worker)
    msgs = [m for m in episode.trajectory.messages if m["role"] != "system"]
    assert msgs[: len(history)] == history
    assert msgs[len(history)] == {"role": "user", "content": task.turns[0].user}
    assert episode.valid  # no call is the right answer


class _Scripted(Policy):
    """Answers each caller request with `script(request)`: a test double for a model."""

    trainable = False

    def __init__(self, script: Callable[[GenRequest], str]) -> None:
        self.script = script
        self.renderer: ChatRenderer | None = None

    def generate(self, requests: Sequence[GenRequest], params: SamplingParams) -> list[Generation]:
        return [
            Generation(token_ids=[], logprobs=[], text=self.script(r), finish_reason="stop")
            for r in requests
        ]


@needs_bfcl
def test_an_undecodable_step_ends_its_turn_not_the_episode(worker: BfclWorker) -> None:
    (task,) = _load(worker, "multi_turn_base", "multi_turn_base_0")
    oracle = BfclOraclePolicy()

    def script(req: GenRequest) -> str:
        if req.episode.turn == 1 and not req.episode.turn_calls:
            return '<tool_call>\n{"name": "cd", "arguments": \n</tool_call>'  # broken JSON
        return oracle.generate([req], SamplingParams(64))[0].text

    (episode,) = run_bfcl(_Scripted(script), [task], RolloutConfig(), worker)
    traj = episode.trajectory
    assert traj.end_reason is EndReason.COMPLETED and traj.parse_errors == 1
    assert sum(1 for m in traj.messages if m["role"] == "user") == len(task.turns)
    assert episode_output(traj, "multi_turn")[1] == [[]]  # the turn's one step decoded to nothing
    assert not episode.valid and episode.error_type == "multi_turn:empty_turn_model_response"


@needs_bfcl
def test_a_turn_is_force_quit_after_bfcls_step_limit(worker: BfclWorker) -> None:
    (task,) = _load(worker, "multi_turn_base", "multi_turn_base_0")
    always = format_assistant_response("", [ToolCall("pwd", {})])
    (episode,) = run_bfcl(_Scripted(lambda _r: always), [task], RolloutConfig(), worker)
    steps = episode_output(episode.trajectory, "multi_turn")
    assert len(steps) == 1 and len(steps[0]) == 21  # 20 steps, then a 21st with calls: quit
    assert episode.trajectory.end_reason is EndReason.STEP_LIMIT
    assert episode.error_type == "multi_turn:force_terminated"


def _memory_writer(req: GenRequest) -> str:
    """Prerequisite conversations store a marker in memory (once per conversation); questions
    answer from the system prompt (where bfcl-eval shows the core memory)."""
    ep = req.episode
    if ep.task.meta["kind"] == "memory_prereq" and not ep.turn_calls and ep.turn == 0:
        call = ToolCall("core_memory_add", {"key": f"note_{ep.task.id[-1]}", "value": "MARKER42"})
        return format_assistant_response("", [call])
    return "I do not know."


@needs_bfcl
@pytest.mark.slow
def test_memory_prerequisites_leave_their_memory_to_the_questions(worker: BfclWorker) -> None:
    (question,) = _load(worker, "memory_kv", "memory_kv_30-healthcare-0")
    (episode,) = run_bfcl(_Scripted(_memory_writer), [question], RolloutConfig(), worker)
    system = episode.trajectory.messages[0]
    assert system["role"] == "system" and "MARKER42" in system["content"]
    # each of the scenario's 5 conversations started from the memory the previous one left
    assert all(f'"note_{k}": "MARKER42"' in system["content"] for k in range(5))
    assert "note_5" not in system["content"]
    assert episode.error_type == "agentic:answer_not_found"
    # a second run starts from an empty memory again: its snapshots are its own
    (again,) = run_bfcl(EmptyPolicy(), [question], RolloutConfig(), worker)
    assert "MARKER42" not in again.trajectory.messages[0]["content"]


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
def test_cli_reports_bfcl_overall_and_coverage_with_rehearsal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bfcl"
    args = ["evaluate", "--policy", "oracle", "--benchmark", "bfcl:simple_python,multi_turn_base"]
    assert main([*args, "--limit", "3", "--out", str(out), "--rehearsal", "parallel:2"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["benchmark"] == "bfcl" and report["score_name"] == "accuracy"
    assert {c: v["score"] for c, v in report["categories"].items()} == {
        "simple_python": 1.0,
        "multi_turn_base": 1.0,
    }
    overall = report["overall"]
    assert (overall["n"], overall["bfcl_overall"], overall["coverage"]) == (
        6,
        pytest.approx(0.10 / 12 + 0.30 / 4),
        pytest.approx(0.10 / 12 + 0.30 / 4),
    )
    assert "score_micro" not in overall and "score_macro" not in overall
    assert report["info"]["step limit per user turn (bfcl-eval)"] == 20
    with_rehearsal = report["rehearsal"]["bfcl_overall_with_rehearsal"]
    assert with_rehearsal["bfcl_overall"] == pytest.approx(overall["bfcl_overall"])
    gain = report["rehearsal"]["overall"]
    assert (gain["success_without"], gain["success_with"], gain["gain"]) == (1.0, 1.0, 0.0)
    assert gain["extra_generations"] > 0
    assert set(report["rehearsal"]["categories"]) == {"simple_python", "multi_turn_base"}
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 6
    assert len((out / "rehearsal" / "memories.jsonl").read_text().splitlines()) == 6
    md = (out / "report.md").read_text()
    assert "| simple_python | 3 | 1.000 | 1.000 | 0.000 |" in md
    assert (
        "BFCL overall (bfcl-eval's weighted v4 score; categories not run count 0): 0.083, coverage 0.083"
        in md
    )
    assert "bfcl-eval" in capsys.readouterr().out
