"""The world-rehearsal rollout engine: roles, rows, modes, limits and token-in / token-out."""

from __future__ import annotations

from typing import Any

from envace.evaluate.runner import make_task_environment
from envace.policy.chat import ChatRenderer, format_assistant_response
from envace.policy.types import Generation, SamplingParams, ToolCall
from envace.rollout.engine import RolloutConfig, RolloutEngine, TurnContext, TurnGrade
from envace.rollout.grading import TaskGrader
from envace.rollout.policies import GenRequest, OraclePolicy, Policy
from envace.rollout.types import EndReason, Role
from envace.tasks.model import Task

from .conftest import ScriptedPolicy


def _by_role(traj: Any, role: Role) -> list[Any]:
    return [r for r in traj.rows if r.role is role]


def test_oracle_rehearsal_writes_one_row_per_generation(train_tasks: list[Task]) -> None:
    engine = RolloutEngine(OraclePolicy(), RolloutConfig(mode="rehearsal"), TaskGrader())
    trajs = engine.run(train_tasks, n=2)
    assert len(trajs) == 2 * len(train_tasks)
    for t in trajs:
        assert t.reward == 1.0 and t.success and t.end_reason is EndReason.COMPLETED
        n_calls = sum(len(turn.expected_calls) for turn in t.task.turns)
        assert len(_by_role(t, Role.SIMULATOR)) == n_calls == len(t.calls)
        assert len(_by_role(t, Role.CALLER)) == n_calls + len(t.task.turns)  # + one answer per turn
        assert {r.uid for r in t.rows} == {t.task.id}
        assert {r.traj_id for r in t.rows} == {t.traj_id}
        assert all(c.source == "rehearsal" for c in t.calls)
    assert trajs[0].traj_id != trajs[1].traj_id and trajs[0].uid == trajs[1].uid


def test_real_mode_executes_in_the_world_and_checks_final_state(test_tasks: list[Task]) -> None:
    engine = RolloutEngine(
        OraclePolicy(), RolloutConfig(mode="real"), TaskGrader(), make_env=make_task_environment
    )
    trajs = engine.run(test_tasks)
    assert all(t.success for t in trajs)
    assert all(not _by_role(t, Role.SIMULATOR) for t in trajs)  # no rehearsal in real mode
    assert all(c.source == "real" for t in trajs for c in t.calls)
    assert all(t.final_state is not None for t in trajs)


def test_a_wrong_call_fails_the_final_state_rule(test_tasks: list[Task]) -> None:
    def script(req: GenRequest) -> str:
        ep = req.episode
        if ep.turn_calls:
            return "Done."
        first = ep.task.turns[ep.turn].expected_calls[0]
        return format_assistant_response("", [ToolCall(first.name, dict(first.arguments))])

    engine = RolloutEngine(
        ScriptedPolicy(script),
        RolloutConfig(mode="real"),
        TaskGrader(),
        make_env=make_task_environment,
    )
    trajs = engine.run(test_tasks)
    multi = [
        t for t in trajs if sum(len(x.expected_calls) for x in t.task.turns) > len(t.task.turns)
    ]
    assert multi and all(not t.success for t in multi)
    assert all(0 < (t.reward or 0) < 1 for t in multi)


def test_malformed_caller_output_ends_the_episode(train_tasks: list[Task]) -> None:
    policy = ScriptedPolicy(lambda r: "<tool_call>\n{oops}\n</tool_call>")
    trajs = RolloutEngine(policy, RolloutConfig(), TaskGrader()).run(train_tasks[:3])
    for t in trajs:
        assert t.end_reason is EndReason.CALLER_FORMAT_ERROR
        assert t.turn_scores == [0.0] and t.reward == 0.0 and not t.success
        assert len(t.rows) == 1 and not t.rows[0].valid


def test_malformed_simulator_output_ends_the_episode(train_tasks: list[Task]) -> None:
    def script(req: GenRequest) -> str:
        if req.role is Role.SIMULATOR:
            return "the balance is 5"
        return OraclePolicy()._text(req)

    trajs = RolloutEngine(ScriptedPolicy(script), RolloutConfig(), TaskGrader()).run(
        train_tasks[:2]
    )
    for t in trajs:
        assert t.end_reason is EndReason.SIMULATOR_FORMAT_ERROR
        assert t.reward == 0.0
        tool_msg = t.messages[-1]
        assert tool_msg["role"] == "tool" and "NO_EXECUTION_RESULT_TAG_FOUND" in tool_msg["content"]


def test_step_call_and_context_limits(train_tasks: list[Task]) -> None:
    task = train_tasks[0]
    call = task.turns[0].expected_calls[0]
    one = format_assistant_response("", [ToolCall(call.name, dict(call.arguments))])
    many = format_assistant_response("", [ToolCall(call.name, dict(call.arguments))] * 5)
    oracle_sim = OraclePolicy()
    sim = ScriptedPolicy(lambda r: oracle_sim._text(r))
    cfg = RolloutConfig(max_steps_per_turn=3)
    t = RolloutEngine(ScriptedPolicy(lambda r: one), cfg, TaskGrader(), simulator=sim).run([task])[
        0
    ]
    assert t.end_reason is EndReason.STEP_LIMIT and len(_by_role(t, Role.CALLER)) == 3
    t = RolloutEngine(ScriptedPolicy(lambda r: many), RolloutConfig(), TaskGrader()).run([task])[0]
    assert t.end_reason is EndReason.CALL_LIMIT


def test_context_limit(train_tasks: list[Task], tiny_tokenizer: Any) -> None:
    r = ChatRenderer(tiny_tokenizer)
    policy = ScriptedPolicy(lambda req: OraclePolicy()._text(req), renderer=r)
    cfg = RolloutConfig(max_context_tokens=50, caller_sampling=SamplingParams(16))
    t = RolloutEngine(policy, cfg, TaskGrader()).run(train_tasks[:1])[0]
    assert t.end_reason is EndReason.CONTEXT_LIMIT and not t.rows


def test_external_mode_rows_are_not_trainable(train_tasks: list[Task]) -> None:
    oracle = OraclePolicy()
    external = ScriptedPolicy(lambda r: oracle._text(r), trainable=False)
    engine = RolloutEngine(oracle, RolloutConfig(mode="external"), TaskGrader(), simulator=external)
    trajs = engine.run(train_tasks[:2])
    sims = [r for t in trajs for r in _by_role(t, Role.SIMULATOR)]
    assert sims and not any(r.trainable for r in sims)
    assert all(c.source == "external" for t in trajs for c in t.calls)
    assert {req.role for req in external.requests} == {Role.SIMULATOR}


def test_sibling_calls_see_earlier_results(train_tasks: list[Task]) -> None:
    task = next(t for t in train_tasks if len(t.turns[0].expected_calls) >= 2)
    calls = [ToolCall(c.name, dict(c.arguments)) for c in task.turns[0].expected_calls[:2]]

    def caller(req: GenRequest) -> str:
        if req.role is Role.SIMULATOR:
            return '<execution_result>\n{"ok": 1}\n</execution_result>'
        return "Done." if req.episode.turn_calls else format_assistant_response("", calls)

    policy = ScriptedPolicy(caller)
    RolloutEngine(policy, RolloutConfig(), TaskGrader()).run([task])
    sims = [r for r in policy.requests if r.role is Role.SIMULATOR]
    assert "Results of earlier calls" not in sims[0].messages[1]["content"]
    assert '-> {"ok":1}' in sims[1].messages[1]["content"]


class _Unscored:
    def grade(self, contexts: list[TurnContext]) -> list[TurnGrade]:
        return [TurnGrade(None) for _ in contexts]


def test_an_ungradable_turn_leaves_the_episode_unscored(train_tasks: list[Task]) -> None:
    t = RolloutEngine(OraclePolicy(), RolloutConfig(), _Unscored()).run(train_tasks[:1])[0]
    assert t.reward is None and t.success is None and t.end_reason is EndReason.UNSCORED


def test_rows_keep_the_generated_token_ids(train_tasks: list[Task], tiny_tokenizer: Any) -> None:
    """Later caller prompts contain earlier responses as the exact generated ids, even when
    decoding and re-encoding them would give other ids (no re-tokenisation drift)."""
    r = ChatRenderer(tiny_tokenizer)
    call = train_tasks[0].turns[0].expected_calls[0]
    text = format_assistant_response("", [ToolCall(call.name, dict(call.arguments))])
    # One id per character: decodes to `text`, but encoding `text` merges characters.
    char_ids = [i for ch in text for i in r.encode(ch)] + [r.eos_id]
    assert [*r.encode(r.decode(char_ids)), r.eos_id] != char_ids

    class CharPolicy(Policy):
        renderer = r
        trainable = True

        def generate(self, requests: list[GenRequest], params: SamplingParams) -> list[Generation]:
            out = []
            for q in requests:
                first = not any(m["role"] == "assistant" for m in q.episode.traj.messages)
                ids = char_ids if first else [*r.encode("Done."), r.eos_id]
                out.append(Generation(ids, [0.0] * len(ids), r.decode(ids), "stop"))
            return out

    engine = RolloutEngine(
        CharPolicy(), RolloutConfig(mode="real"), TaskGrader(), make_env=make_task_environment
    )
    t = engine.run(train_tasks[:1])[0]
    first, second = _by_role(t, Role.CALLER)[:2]
    assert first.response_ids == char_ids
    prefix = first.prompt_ids + first.response_ids
    assert second.prompt_ids[: len(prefix)] == prefix
    assert t.calls[0].call == ToolCall(call.name, dict(call.arguments))
