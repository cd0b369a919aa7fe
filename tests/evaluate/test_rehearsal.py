"""Test-time private rehearsal: imagined attempts, condensed notes, gain and extra-token accounting."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from envace.cli import main
from envace.errors import UserInputError
from envace.evaluate.benchmarks import rehearse_synthetic, run_synthetic
from envace.evaluate.rehearsal import (
    MAX_REHEARSAL_N,
    NOTES_HEADER,
    DigestMemoryWriter,
    MemoryPrompt,
    ModelMemoryWriter,
    RehearsalConfig,
    RehearsalOutcome,
    TaskRehearsal,
    TurnRehearsal,
    WrittenMemory,
    attempt_lines,
    build_memory_prompt,
    memory_writer_for,
    parse_rehearsal,
    rehearsal_gain,
    with_memory,
)
from envace.evaluate.runner import evaluate_policy
from envace.policy.chat import ChatRenderer
from envace.policy.hf_backend import TransformersBackend
from envace.policy.types import Generation, SamplingParams, ToolCall
from envace.rollout.engine import Episode, RolloutConfig
from envace.rollout.policies import ChatPolicy, GenRequest, ModelPolicy, OraclePolicy
from envace.rollout.types import CallRecord, EndReason, Role, Trajectory
from envace.tasks.generate import generate_splits
from envace.tasks.io import task_from_dict
from envace.tasks.model import Task, Turn


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    return [task_from_dict(t) for t in generate_splits(4, 6, seed=11).test]


class ImaginingOracle(OraclePolicy):
    """The oracle's caller with a simulator that imagines every result as a plain success: a
    scripted policy that may rehearse privately (the real oracle replays real calls)."""

    rehearses_privately = True

    def _text(self, req: GenRequest) -> str:
        if req.role is Role.SIMULATOR:
            return '<execution_result>\n{"status": "imagined"}\n</execution_result>'
        return super()._text(req)


def _rehearsed(
    policy: Any, tasks: Sequence[Task], rcfg: RehearsalConfig, **kw: Any
) -> tuple[RehearsalOutcome, list[Trajectory]]:
    outcome, result = rehearse_synthetic(
        policy, tasks, kw.pop("cfg", RolloutConfig()), rcfg, probe_fidelity=False, **kw
    )
    return outcome, result.trajectories


def _turn_starts(messages: Sequence[dict[str, Any]]) -> list[int]:
    return [i for i, m in enumerate(messages) if m["role"] == "user"]


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


def test_parallel_rehearses_every_committed_turn_from_the_real_history(
    tasks: list[Task],
) -> None:
    outcome, committed = _rehearsed(ImaginingOracle(), tasks, RehearsalConfig("parallel", n=3))
    assert set(outcome.tasks) == {t.id for t in tasks}
    for task, traj in zip(tasks, committed, strict=True):
        rec = outcome.tasks[task.id]
        turns = len(task.turns)
        assert (len(rec.attempts), len(rec.writes), rec.episodes) == (3 * turns, turns, 1)
        real = [m for m in traj.messages if m["role"] != "system"]
        starts = _turn_starts(real)
        for k, attempt in enumerate(rec.attempts):
            t = k // 3
            # the attempt plays turn t alone, after the real conversation up to it
            assert attempt.task.turns == (task.turns[t],)
            mine = [m for m in attempt.messages if m["role"] != "system"]
            assert mine[: starts[t] + 1] == real[: starts[t] + 1]
            assert all(c.source == "rehearsal" for c in attempt.calls)
            assert attempt.final_state is None
        # the committed episode still solves the task, in its real world
        assert traj.success is True and traj.final_state is not None
        # no tokenizer: nothing counted as tokens, every generation counted
        assert rec.extra_tokens == 0 and rec.context_tokens == 0 and rec.context_chars > 0
        assert rec.generations == sum(len(a.rows) for a in rec.attempts) + turns


class RevealChecker(TurnRehearsal):
    """Remembers which turn each committed task has reached when its rehearsal starts."""

    def __init__(self, policy: Any, rcfg: RehearsalConfig, **kw: Any) -> None:
        super().__init__(policy, rcfg, **kw)
        self.revealed: dict[str, int] = {}

    def __call__(self, episodes: Sequence[Episode]) -> None:
        for e in episodes:
            self.revealed[e.task.id] = e.turn
        super().__call__(episodes)


class NoPeekingOracle(ImaginingOracle):
    """Fails a test if any rehearsal prompt, or a committed prompt, holds a user turn that has
    not been revealed yet."""

    def __init__(self, tasks: dict[str, Task]) -> None:
        super().__init__()
        self.tasks = tasks
        self.checker: RevealChecker | None = None
        self.prompts = 0

    def generate(self, requests: Sequence[GenRequest], params: SamplingParams) -> list[Generation]:
        assert self.checker is not None
        for r in requests:
            ep = r.episode
            turn = self.checker.revealed[ep.task.id] if ep.cfg.mode == "rehearsal" else ep.turn
            _assert_unrevealed(ep.task.id, json.dumps(r.messages), turn, self.tasks)
            self.prompts += 1
        return super().generate(requests, params)


def _assert_unrevealed(task_id: str, text: str, turn: int, tasks: dict[str, Task]) -> None:
    for later in tasks[task_id].turns[turn + 1 :]:
        assert json.dumps(later.user)[1:-1] not in text, (task_id, turn, later.user)


class CheckingWriter(DigestMemoryWriter):
    def __init__(self, checker: RevealChecker | None, tasks: dict[str, Task]) -> None:
        super().__init__()
        self.checker, self.tasks, self.prompts = checker, tasks, 0

    def write(self, prompts: Sequence[MemoryPrompt], params: SamplingParams) -> list[WrittenMemory]:
        assert self.checker is not None
        for p in prompts:
            text = json.dumps(p.messages)
            _assert_unrevealed(p.task.id, text, self.checker.revealed[p.task.id], self.tasks)
            self.prompts += 1
        return super().write(prompts, params)


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_no_prompt_holds_a_user_turn_before_it_is_revealed(mode: str) -> None:
    raw = generate_splits(2, 40, seed=5).test
    tasks = [task_from_dict(t) for t in raw if len(t["turns"]) > 1][:8]
    by_id = {t.id: t for t in tasks}
    policy = NoPeekingOracle(by_id)
    writer = CheckingWriter(None, by_id)
    rcfg = RehearsalConfig(mode, n=2)  # type: ignore[arg-type]
    checker = RevealChecker(policy, rcfg, writer=writer, seed=1)
    policy.checker = writer.checker = checker
    result = evaluate_policy(
        policy, tasks, RolloutConfig(), probe_fidelity=False, before_turn=checker
    )
    assert policy.prompts > 0 and writer.prompts == sum(len(t.turns) for t in tasks) * (
        1 if mode == "parallel" else 2
    )
    # the wrong-PIN task: before turn 2 nothing (prompt or notes) knows the corrected PIN
    pin_tasks = [t for t in tasks if t.meta.get("template") == "wrong_pin"]
    assert pin_tasks, "the sample must hold a wrong_pin task"
    for traj in result.trajectories:
        if traj.task in pin_tasks:
            rec = checker.outcome.tasks[traj.uid]
            correct = traj.task.turns[1].user.split()[-1].rstrip(".")
            assert correct not in rec.writes[0].text and correct in rec.writes[-1].text


def test_sequential_attempts_see_the_notes_of_earlier_attempts(tasks: list[Task]) -> None:
    class Recording(ImaginingOracle):
        def __init__(self) -> None:
            super().__init__()
            self.systems: dict[tuple[str, int], list[str]] = {}

        def generate(
            self, requests: Sequence[GenRequest], params: SamplingParams
        ) -> list[Generation]:
            for r in requests:
                ep = r.episode
                if ep.cfg.mode == "rehearsal" and r.role is Role.CALLER and ep.steps_in_turn == 1:
                    turn = len(_turn_starts(r.messages)) - 1
                    first = r.messages[0]
                    text = first["content"] if first["role"] == "system" else ""
                    self.systems.setdefault((ep.task.id, turn), []).append(text)
            return super().generate(requests, params)

    policy = Recording()
    outcome, _ = _rehearsed(policy, tasks[:2], RehearsalConfig("sequential", n=2))
    for task in tasks[:2]:
        rec = outcome.tasks[task.id]
        assert len(rec.writes) == 2 * len(task.turns) and len(rec.attempts) == 2 * len(task.turns)
        for t in range(len(task.turns)):
            first, second = policy.systems[(task.id, t)]
            assert NOTES_HEADER not in first
            assert f"{NOTES_HEADER}\n{rec.writes[2 * t].text}" in second


class SeedRecorder:
    """A stand-in for an OpenAI-compatible endpoint (no such server runs in the unit tier):
    records the seed of every request and answers without a tool call."""

    def __init__(self) -> None:
        self.seeds: list[tuple[str, int | None]] = []

    def chat(
        self,
        messages: Sequence[dict[str, Any]],
        params: SamplingParams,
        response_format: dict[str, Any] | None = None,
    ) -> str:
        user = [m["content"] for m in messages if m["role"] == "user"][-1]
        self.seeds.append((user, params.seed))
        return "All set."


def test_parallel_attempts_of_an_endpoint_policy_get_distinct_seeds(tasks: list[Task]) -> None:
    client = SeedRecorder()
    hook = TurnRehearsal(ChatPolicy(client), RehearsalConfig("parallel", n=4), seed=7)
    task = dataclasses.replace(tasks[0], turns=tasks[0].turns[:1])
    evaluate_policy(
        ChatPolicy(client), [task], RolloutConfig(), probe_fidelity=False, before_turn=hook
    )
    attempts = [s for u, s in client.seeds if u == task.turns[0].user and s is not None]
    assert sorted(attempts) == [7, 8, 9, 10]


def test_the_oracle_cannot_rehearse_privately() -> None:
    with pytest.raises(UserInputError, match="cannot rehearse privately"):
        TurnRehearsal(OraclePolicy(), RehearsalConfig())


def test_oracle_keeps_full_success_with_rehearsal(tasks: list[Task]) -> None:
    run = run_synthetic(
        ImaginingOracle(),
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
    for r, (episodes, tokens) in zip(recs.values(), ((1, 30), (1, 0), (1, 12)), strict=True):
        r.episodes, r.context_tokens = episodes, tokens
    outcome = RehearsalOutcome(RehearsalConfig("sequential", 2), recs)
    g = rehearsal_gain(without, with_r, outcome)
    assert g.success_without == pytest.approx(1 / 3) and g.success_with == 1.0
    assert g.gain == pytest.approx(2 / 3)
    assert g.extra_tokens == 100 + 7 + 9 + 50 + 30
    assert g.extra_tokens_per_task == pytest.approx(196 / 3)
    # what entered the committed contexts, per committed episode (not what was generated)
    assert g.memory_tokens_per_task == pytest.approx(42 / 3)
    sub = rehearsal_gain(without, with_r, outcome, ["b"])
    assert (sub.n_tasks, sub.gain, sub.extra_tokens) == (1, 0.0, 50)


def test_memory_prompt_is_fitted_without_cutting_the_instructions(tasks: list[Task]) -> None:
    rcfg = RehearsalConfig(n=3)
    attempts = _rehearsed(ImaginingOracle(), tasks[:1], rcfg)[0].tasks[tasks[0].id]

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
    hook = TurnRehearsal(ImaginingOracle(), RehearsalConfig(n=1), writer=NoRoomWriter())
    result = evaluate_policy(
        ImaginingOracle(), tasks[:2], RolloutConfig(), probe_fidelity=False, before_turn=hook
    )
    for task, traj in zip(tasks[:2], result.trajectories, strict=True):
        rec = hook.outcome.tasks[task.id]
        assert rec.memory == "" and len(rec.writes) == len(task.turns)
        assert (rec.context_tokens, rec.context_chars) == (0, 0)
        assert NOTES_HEADER not in json.dumps(traj.messages)


class BlankWriter(DigestMemoryWriter):
    """Writes 32 newlines: generated tokens, but nothing that enters the context."""

    def write(self, prompts: Sequence[MemoryPrompt], params: SamplingParams) -> list[WrittenMemory]:
        return [WrittenMemory("\n" * 32, 32) for _ in prompts]


def test_notes_are_measured_as_the_tokens_that_enter_the_context(
    tasks: list[Task], tiny_tokenizer: Any
) -> None:
    renderer = ChatRenderer(tiny_tokenizer)
    policy = ImaginingOracle(renderer)
    hook = TurnRehearsal(policy, RehearsalConfig(n=1), seed=0)
    result = evaluate_policy(
        policy, tasks[:3], RolloutConfig(), probe_fidelity=False, before_turn=hook
    )
    for task, traj in zip(tasks[:3], result.trajectories, strict=True):
        rec = hook.outcome.tasks[task.id]
        blocks = [f"{NOTES_HEADER}\n{w.text.strip()}" for w in rec.writes if w.text.strip()]
        assert blocks and rec.context_tokens == sum(len(renderer.encode(b)) for b in blocks)
        assert rec.context_chars == sum(len(b) for b in blocks)
        assert blocks[-1] in traj.messages[0]["content"]  # the last turn's notes, in place
    blank = TurnRehearsal(policy, RehearsalConfig(n=1), writer=BlankWriter())
    evaluate_policy(policy, tasks[:2], RolloutConfig(), probe_fidelity=False, before_turn=blank)
    gain = rehearsal_gain([], [], blank.outcome)
    assert gain.extra_tokens > 0 and gain.memory_tokens_per_task == 0.0


def test_digest_is_cut_to_the_token_budget(tasks: list[Task], tiny_tokenizer: Any) -> None:
    renderer = ChatRenderer(tiny_tokenizer)
    outcome, _ = _rehearsed(ImaginingOracle(renderer), tasks[:2], RehearsalConfig(n=1))
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
    outcome, _ = _rehearsed(policy, tasks[:2], rcfg, cfg=cfg, seed=3)
    for rec in outcome.tasks.values():
        turns = len(rec.writes)  # one condensation per committed turn reached
        assert turns >= 1 and len(rec.attempts) == 2 * turns
        assert all(1 <= w.generated_tokens <= 5 for w in rec.writes)
        rows = [r for a in rec.attempts for r in a.rows]
        assert rows and rec.attempt_tokens == sum(len(r.response_ids) for r in rows) > 0
        assert rec.extra_tokens == rec.attempt_tokens + rec.memory_tokens
        assert rec.generations == len(rows) + turns
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
    again, _ = _rehearsed(policy, tasks[:2], rcfg, cfg=cfg, seed=3)
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
            "random",
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
    assert report["benchmark"] == "synthetic" and report["policy"] == "random"
    worlds = report["categories"]
    assert sum(c["n"] for c in worlds.values()) == 8
    reh = report["rehearsal"]
    assert reh["config"] == {
        "mode": "sequential",
        "n": 2,
        "memory_tokens": 32,
        "temperature": 1.0,
        "max_result_chars": 160,
    }
    assert reh["overall"]["n_tasks"] == 8 and reh["overall"]["extra_generations"] > 0
    assert reh["overall"]["gain"] == pytest.approx(
        reh["overall"]["success_with"] - reh["overall"]["success_without"]
    )
    assert set(reh["categories"]) == set(worlds)
    assert (out / "metrics.json").is_file()  # the plain evaluation outputs stay
    memories = [
        json.loads(line) for line in (out / "rehearsal" / "memories.jsonl").read_text().splitlines()
    ]
    # sequential:2 condenses twice before every committed turn the episode reached
    assert len(memories) == 8 and all(len(m["notes_per_step"]) % 2 == 0 for m in memories)
    assert any(len(m["notes_per_step"]) > 2 for m in memories)
    md = (out / "report.md").read_text()
    assert "| category | n | success_rate | with rehearsal | gain |" in md
    assert "Rehearsal sequential:2" in capsys.readouterr().out


def test_cli_rejects_bad_rehearsal_and_benchmark_flags(
    task_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    oracle = ["evaluate", "--policy", "oracle", "--out", str(tmp_path), "--tasks", str(task_file)]
    assert main([*oracle, "--rehearsal", "parallel:2"]) == 2
    err = capsys.readouterr().err
    assert "--policy oracle --rehearsal" in err and "cannot rehearse privately" in err
    base = ["evaluate", "--policy", "random", "--out", str(tmp_path)]
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
