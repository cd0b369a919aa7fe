"""Test-time private rehearsal: imagined attempts, condensed notes, gain and extra-token accounting."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from envace.cli import main
from envace.errors import UserInputError
from envace.evaluate.benchmarks import run_synthetic
from envace.evaluate.rehearsal import (
    MAX_REHEARSAL_N,
    NOTES_HEADER,
    DigestMemoryWriter,
    ModelMemoryWriter,
    RehearsalConfig,
    RehearsalOutcome,
    TaskRehearsal,
    WrittenMemory,
    apply_memories,
    attempt_lines,
    build_memory_prompt,
    memory_writer_for,
    parse_rehearsal,
    rehearsal_gain,
    rehearse,
    with_memory,
)
from envace.policy.chat import ChatRenderer
from envace.policy.hf_backend import TransformersBackend
from envace.policy.types import Generation, SamplingParams, ToolCall
from envace.rollout.engine import RolloutConfig
from envace.rollout.policies import GenRequest, ModelPolicy, OraclePolicy
from envace.rollout.types import CallRecord, EndReason, Role, Trajectory
from envace.tasks.generate import generate_splits
from envace.tasks.io import task_from_dict
from envace.tasks.model import Task, Turn


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return [task_from_dict(t) for t in generate_splits(4, 6, seed=11).test]


class RecordingOracle(OraclePolicy):
    """The oracle, remembering the system prompt every caller request was made with."""

    def __init__(self) -> None:
        super().__init__()
        self.systems: list[str | None] = []

    def generate(self, requests: Sequence[GenRequest], params: SamplingParams) -> list[Generation]:
        for r in requests:
            if r.role is Role.CALLER and r.episode.steps_in_turn == 1 and r.episode.turn == 0:
                first = r.messages[0]
                self.systems.append(first["content"] if first["role"] == "system" else None)
        return super().generate(requests, params)


def test_parse_rehearsal_flag() -> None:
    cfg = parse_rehearsal("sequential:3", memory_tokens=40)
    assert (cfg.mode, cfg.n, cfg.memory_tokens) == ("sequential", 3, 40)
    assert parse_rehearsal("parallel:1").mode == "parallel"
    for bad in ("parallel", "parallel:x", "beam:2", "parallel:-1", "parallel:0"):
        with pytest.raises(UserInputError):
            parse_rehearsal(bad)
    with pytest.raises(UserInputError, match="memory_tokens"):
        RehearsalConfig(memory_tokens=0)
    # `str.isdigit` accepts superscripts and other non-ASCII digits that `int` refuses
    for bad in ("parallel:\u00b2", "sequential:\u0663", "parallel: 2", "parallel:2 "):
        with pytest.raises(UserInputError, match="parallel:N or sequential:N"):
            parse_rehearsal(bad)
    assert parse_rehearsal(f"parallel:{MAX_REHEARSAL_N}").n == MAX_REHEARSAL_N
    for huge in (
        f"parallel:{MAX_REHEARSAL_N + 1}",
        "parallel:99999999",
        "sequential:" + "9" * 5000,
    ):
        with pytest.raises(UserInputError) as info:
            parse_rehearsal(huge)
        assert f"N must be 1 to {MAX_REHEARSAL_N} imagined attempts" in str(info.value)
        assert str(info.value).startswith("--rehearsal ")
    with pytest.raises(UserInputError, match=str(MAX_REHEARSAL_N)):
        RehearsalConfig(n=MAX_REHEARSAL_N + 1)
    with pytest.raises(UserInputError, match="empty"):
        RehearsalConfig(memory_prompt="  ")


def test_with_memory_appends_notes_to_the_system_prompt() -> None:
    task = Task(id="t", tools=(), turns=(Turn("hi"),), system="Be kind.")
    assert with_memory(task, "  ") is task
    noted = with_memory(task, "Plan: f().")
    assert noted.system == f"Be kind.\n\n{NOTES_HEADER}\nPlan: f()."
    bare = with_memory(Task(id="u", tools=(), turns=(Turn("hi"),)), "x")
    assert bare.system == f"{NOTES_HEADER}\nx"


def test_parallel_oracle_rehearses_n_imagined_attempts(tasks: list[Task]) -> None:
    rcfg = RehearsalConfig(mode="parallel", n=3)
    outcome = rehearse(OraclePolicy(), tasks, RolloutConfig(), rcfg)
    assert set(outcome.tasks) == {t.id for t in tasks}
    for task in tasks:
        rec = outcome.tasks[task.id]
        assert len(rec.attempts) == 3 and len(rec.writes) == 1
        # imagined: every result was written by the policy, nothing ran in a real world
        assert all(c.source == "rehearsal" for a in rec.attempts for c in a.calls)
        assert all(a.final_state is None for a in rec.attempts)
        expected = [c.name for turn in task.turns for c in turn.expected_calls]
        assert rec.memory.startswith("Plan: ")
        assert [n for n in expected if n in rec.memory] == expected
        # no tokenizer: nothing counted as tokens, every generation counted
        assert rec.extra_tokens == 0
        assert rec.generations == sum(len(a.rows) for a in rec.attempts) + 1


def test_sequential_attempts_see_the_notes_of_earlier_attempts(tasks: list[Task]) -> None:
    policy = RecordingOracle()
    outcome = rehearse(policy, tasks[:2], RolloutConfig(), RehearsalConfig("sequential", n=2))
    first, second = policy.systems[:2], policy.systems[2:4]
    assert all(s is None or NOTES_HEADER not in s for s in first)
    for task, system in zip(tasks[:2], second, strict=True):
        rec = outcome.tasks[task.id]
        assert len(rec.writes) == 2 and len(rec.attempts) == 2
        assert system is not None and f"{NOTES_HEADER}\n{rec.writes[0].text}" in system


def test_oracle_keeps_full_success_with_rehearsal(tasks: list[Task]) -> None:
    run = run_synthetic(
        OraclePolicy(),
        tasks,
        RolloutConfig(),
        probe_fidelity=False,
        rehearsal=RehearsalConfig(n=2),
    )
    assert run.rehearsed is not None and run.outcome is not None
    systems = [t.messages[0]["content"] for t in run.rehearsed.trajectories]
    assert all(NOTES_HEADER in s for s in systems)
    gain = rehearsal_gain(run.baseline.trajectories, run.rehearsed.trajectories, run.outcome)
    assert (gain.success_without, gain.success_with, gain.gain) == (1.0, 1.0, 0.0)
    assert gain.n_tasks == len(tasks) and gain.extra_tokens == 0


def test_attempt_lines_show_calls_results_errors_and_the_end() -> None:
    task = Task(id="t", tools=(), turns=(Turn("a"), Turn("b")))
    traj = Trajectory(task=task, traj_id="t#0", end_reason=EndReason.CALLER_FORMAT_ERROR)
    traj.calls = [
        CallRecord(0, ToolCall("f", {"x": 1}), {"ok": True}, "rehearsal", True),
        CallRecord(1, ToolCall("g", {}), {"error": {"code": "E"}}, "rehearsal", True),
    ]
    traj.messages = [{"role": "assistant", "content": "<tool_call>\n{bad"}]
    assert attempt_lines(traj, max_result_chars=12) == [
        '- turn 1: f({"x":1}) -> {"ok":true}',
        '- turn 2: g({}) -> ERROR {"error":...',
        "- malformed output: <tool_cal...",
        "- ended: caller_format_error",
    ]


def _traj(task: Task, success: bool) -> Trajectory:
    return Trajectory(task=task, traj_id=f"{task.id}#0", success=success, reward=float(success))


def test_gain_and_cost_by_hand() -> None:
    a, b, c = (Task(id=i, tools=(), turns=(Turn("u"),)) for i in "abc")
    without = [_traj(a, False), _traj(b, True), _traj(c, False)]
    with_r = [_traj(a, True), _traj(b, True), _traj(c, True)]
    recs = {
        "a": TaskRehearsal("a", attempt_tokens=100, generations=5),
        "b": TaskRehearsal("b", attempt_tokens=50, generations=3),
        "c": TaskRehearsal("c", attempt_tokens=30, generations=2),
    }
    recs["a"].writes = [WrittenMemory("x", 7), WrittenMemory("y", 9)]
    outcome = RehearsalOutcome(RehearsalConfig("sequential", 2), recs)
    g = rehearsal_gain(without, with_r, outcome)
    assert g.success_without == pytest.approx(1 / 3) and g.success_with == 1.0
    assert g.gain == pytest.approx(2 / 3)
    assert g.extra_tokens == 100 + 7 + 9 + 50 + 30
    assert g.extra_tokens_per_task == pytest.approx(196 / 3)
    assert g.memory_tokens_per_task == pytest.approx(9 / 3)  # only the final notes enter context
    sub = rehearsal_gain(without, with_r, outcome, ["b"])
    assert (sub.n_tasks, sub.gain, sub.extra_tokens) == (1, 0.0, 50)


def test_memory_prompt_is_fitted_without_cutting_the_instructions(tasks: list[Task]) -> None:
    rcfg = RehearsalConfig(n=3)
    attempts = rehearse(OraclePolicy(), tasks[:1], RolloutConfig(), rcfg).tasks[tasks[0].id]

    def size(messages: list[dict[str, Any]]) -> int:
        return sum(len(m["content"]) for m in messages)

    full = build_memory_prompt(tasks[0], attempts.attempts, rcfg)
    budget = size(full.messages) - 40
    fitted = build_memory_prompt(
        tasks[0], attempts.attempts, rcfg, count_tokens=size, max_tokens=budget
    )
    assert size(fitted.messages) <= budget
    assert fitted.messages[0]["content"] == rcfg.memory_prompt
    user = fitted.messages[1]["content"]
    assert user.startswith("Task:\n") and tasks[0].turns[0].user in user
    assert "Imagined attempt 3" in user and fitted.fits
    tight = build_memory_prompt(tasks[0], attempts.attempts, rcfg, count_tokens=size, max_tokens=9)
    assert not tight.fits and "- " not in tight.messages[1]["content"]


class NoRoomWriter(DigestMemoryWriter):
    """A writer whose model context can never hold the condensation request."""

    def count_tokens(self) -> Callable[[list[dict[str, Any]]], int] | None:
        return lambda messages: 10**9


def test_a_request_that_cannot_fit_gives_no_notes(tasks: list[Task]) -> None:
    outcome = rehearse(
        OraclePolicy(), tasks[:2], RolloutConfig(), RehearsalConfig(n=1), writer=NoRoomWriter()
    )
    assert all(r.memory == "" and len(r.writes) == 1 for r in outcome.tasks.values())
    assert apply_memories(tasks[:2], outcome) == tasks[:2]


def test_digest_is_cut_to_the_token_budget(tasks: list[Task], tiny_tokenizer: Any) -> None:
    renderer = ChatRenderer(tiny_tokenizer)
    outcome = rehearse(OraclePolicy(renderer), tasks[:2], RolloutConfig(), RehearsalConfig(n=1))
    prompts = [
        build_memory_prompt(t, outcome.tasks[t.id].attempts, RehearsalConfig()) for t in tasks[:2]
    ]
    written = DigestMemoryWriter(renderer).write(prompts, SamplingParams(max_new_tokens=5))
    for w in written:
        assert w.generated_tokens > 0 and len(renderer.encode(w.text)) <= 5
    words = DigestMemoryWriter().write(prompts, SamplingParams(max_new_tokens=3))
    assert all(len(w.text.split(" ")) <= 3 for w in words)
    # with a tokenizer, the oracle's imagined attempts cost tokens too
    assert all(r.attempt_tokens > 0 for r in outcome.tasks.values())


@pytest.mark.slow
def test_model_policy_writes_bounded_notes_and_counts_every_token(
    tasks: list[Task], tiny_tokenizer: Any, micro_model: Any
) -> None:
    renderer = ChatRenderer(tiny_tokenizer)
    policy = ModelPolicy(TransformersBackend(micro_model, tiny_tokenizer), renderer, False)
    assert isinstance(memory_writer_for(policy), ModelMemoryWriter)
    sampling = SamplingParams(max_new_tokens=6, temperature=1.0, seed=0)
    cfg = RolloutConfig(
        caller_sampling=sampling,
        simulator_sampling=sampling,
        max_steps_per_turn=2,
        max_context_tokens=2000,
        max_sim_prompt_tokens=2000,
    )
    rcfg = RehearsalConfig("parallel", n=2, memory_tokens=5)
    outcome = rehearse(policy, tasks[:2], cfg, rcfg, seed=3)
    for rec in outcome.tasks.values():
        assert len(rec.attempts) == 2 and len(rec.writes) == 1
        assert 1 <= rec.writes[0].generated_tokens <= 5
        rows = [r for a in rec.attempts for r in a.rows]
        assert rows and rec.attempt_tokens == sum(len(r.response_ids) for r in rows) > 0
        assert rec.extra_tokens == rec.attempt_tokens + rec.writes[0].generated_tokens
        assert rec.generations == len(rows) + 1
        # the condensation prompt fits the context with room for the notes
        task = next(t for t in tasks if t.id == rec.task_id)
        p = build_memory_prompt(
            task,
            rec.attempts,
            rcfg,
            count_tokens=lambda m: len(renderer.prompt_ids(m)),
            max_tokens=cfg.max_context_tokens - rcfg.memory_tokens,
        )
        assert len(renderer.prompt_ids(p.messages)) + rcfg.memory_tokens <= cfg.max_context_tokens
    again = rehearse(policy, tasks[:2], cfg, rcfg, seed=3)
    assert [r.memory for r in again.tasks.values()] == [r.memory for r in outcome.tasks.values()]


@pytest.fixture(scope="module")
def task_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tasks")
    args = ["tasks", "generate", "--out", str(out), "--n-train", "4", "--n-test", "8"]
    assert main([*args, "--seed", "2"]) == 0
    return out / "test.jsonl"


def test_cli_reports_the_gain_per_world(
    task_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "ev"
    code = main(
        [
            "evaluate",
            "--policy",
            "oracle",
            "--tasks",
            str(task_file),
            "--out",
            str(out),
            "--rehearsal",
            "sequential:2",
            "--rehearsal-memory-tokens",
            "32",
        ]
    )
    assert code == 0
    report = json.loads((out / "report.json").read_text())
    assert report["benchmark"] == "synthetic" and report["overall"]["score_micro"] == 1.0
    worlds = report["categories"]
    assert sum(c["n"] for c in worlds.values()) == 8
    assert all(c["score"] == 1.0 for c in worlds.values())
    reh = report["rehearsal"]
    assert reh["config"] == {
        "mode": "sequential",
        "n": 2,
        "memory_tokens": 32,
        "temperature": 1.0,
        "max_result_chars": 160,
    }
    assert reh["overall"]["gain"] == 0.0 and reh["overall"]["n_tasks"] == 8
    assert set(reh["categories"]) == set(worlds)
    assert (out / "metrics.json").is_file()  # the plain evaluation outputs stay
    memories = (out / "rehearsal" / "memories.jsonl").read_text().splitlines()
    assert len(memories) == 8 and len(json.loads(memories[0])["notes_per_step"]) == 2
    md = (out / "report.md").read_text()
    assert "| category | n | success_rate | with rehearsal | gain |" in md
    assert "Rehearsal sequential:2" in capsys.readouterr().out


def test_cli_rejects_bad_rehearsal_and_benchmark_flags(
    task_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["evaluate", "--policy", "oracle", "--out", str(tmp_path)]
    assert main([*base, "--tasks", str(task_file), "--rehearsal", "parallel"]) == 2
    assert "parallel:N" in capsys.readouterr().err
    assert main(base) == 2
    assert "--tasks" in capsys.readouterr().err
    assert main([*base, "--benchmark", "gaia"]) == 2
    assert "bfcl:CATEGORIES" in capsys.readouterr().err
    missing = tmp_path / "nope.txt"
    args = [*base, "--tasks", str(task_file), "--rehearsal", "parallel:2"]
    assert main([*args, "--rehearsal-prompt", str(missing)]) == 2
    assert "nope.txt" in capsys.readouterr().err
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Notes de r\u00e9p\u00e9tition".encode("latin-1"))
    assert main([*args, "--rehearsal-prompt", str(latin1)]) == 2
    err = capsys.readouterr().err
    assert "latin1.txt" in err and "must be UTF-8 text" in err and "Traceback" not in err
    assert main([*args[:-1], "parallel:\u00b2"]) == 2
    assert "parallel:N" in capsys.readouterr().err
