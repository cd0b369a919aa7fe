"""Checklist judge: prompts, scoring, the shortcut, and unscored turns on judge failure.

The judge model is played by tests/helpers/fake_openai.py, a test double for a remote LLM
endpoint (which cannot run here) that answers with scripted JSON. The HTTP client between them
is the real OpenAIChatClient.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from envace.policy.openai_http import OpenAIChatClient
from envace.reward.judge import (
    JUDGE_RESPONSE_FORMAT,
    JUDGE_SCHEMA,
    ChecklistJudge,
    JudgeOutputError,
    TurnToGrade,
    build_judge_prompt,
    parse_judge_answer,
    serialise_messages,
    split_turn_steps,
)
from envace.tasks.model import ChecklistItem
from tests.helpers import fake_openai as fake

FIELDS = {
    "high_level_understanding_of_the_question": "checks the transfer",
    "analysis_of_if_focus_on": "present",
    "analysis_of_pass_condition": "met",
    "analysis_of_failure_examples": "none apply",
}

PREVIOUS: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a bank assistant."},
    {"role": "user", "content": "What is my balance?"},
    {"role": "assistant", "content": "<think>look it up</think>\n\nYour balance is 10."},
]
USER: dict[str, Any] = {"role": "user", "content": "Send 5 to Bob."}
STEP1: list[dict[str, Any]] = [
    USER,
    {
        "role": "assistant",
        "content": "<think>transfer now</think>",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "transfer", "arguments": '{"to": "Bob", "amount": 5}'},
            }
        ],
    },
    {"role": "tool", "name": "transfer", "content": '{"status": "ok", "tx": "TX-1"}'},
]
STEP2: list[dict[str, Any]] = [
    {"role": "assistant", "content": "<think>done</think>\n\nSent 5 to Bob (TX-1)."}
]
BAD_CALL_STEP: list[dict[str, Any]] = [
    USER,
    {"role": "assistant", "content": "<tool_call>\n{broken\n</tool_call>"},
    {"role": "tool", "content": '{"error_tool_call": "JSON_DECODE_ERROR"}'},
]


def item(
    qid: str, focus: str = "assistant.content", weight: float = 0.5, required: bool = False
) -> ChecklistItem:
    return ChecklistItem(
        id=qid,
        question=f"{qid}: did the assistant do it?",
        focus_on=focus,  # type: ignore[arg-type]
        pass_condition=f"pass-{qid}",
        weight=weight,
        failure_examples=(f"fail-{qid}-1", f"fail-{qid}-2"),
        required_for_next_turn=required,
    )


def verdict(answer: object, **overrides: object) -> str:
    return json.dumps({**FIELDS, "answer": answer, **overrides})


def prompt_of(body: dict[str, Any]) -> str:
    messages = body["messages"]
    assert len(messages) == 1 and messages[0]["role"] == "user"
    return str(messages[0]["content"])


def asked(body: dict[str, Any]) -> tuple[str, int]:
    """(item id, step number) a judge request is about."""
    prompt = prompt_of(body)
    qid = re.search(r"- Question: (\w+):", prompt)
    current = prompt.split("# Current Messages to Evaluate")[1].split("# Special Rules")[0]
    assert qid is not None
    return qid.group(1), max(int(n) for n in re.findall(r"## Step: (\d+)", current))


def answering(table: dict[tuple[str, int], str]) -> Callable[[dict[str, Any]], Any]:
    """A judge answering from (item id, step) -> raw reply text; unlisted cells say False."""
    return lambda body: fake.reply(table.get(asked(body), verdict(False)))


@pytest.fixture
def server() -> Iterator[Any]:
    with fake.running_fake_openai() as srv:
        yield srv


@pytest.fixture
def judge(server: Any) -> Iterator[ChecklistJudge]:
    client = OpenAIChatClient(
        server.base_url, "judge", max_retries=1, backoff_base_s=0.001, backoff_max_s=0.01
    )
    with client:
        yield ChecklistJudge(client)


def test_score_is_the_weight_of_items_passed_at_any_step(
    server: Any, judge: ChecklistJudge
) -> None:
    server.responder = answering({("A", 2): verdict(True), ("B", 1): verdict(True)})
    items = [item("A", weight=0.5), item("B", weight=0.3), item("C", weight=0.2, required=True)]
    result = judge.grade_turn(items, PREVIOUS, [STEP1, STEP2])
    assert result.score == pytest.approx(0.8)
    assert result.passed == {"A": True, "B": True, "C": False}
    assert result.by_step == {"A": (False, True), "B": (True, False), "C": (False, False)}
    assert result.required_failed  # C is required and passed at no step
    assert (result.failed_calls, result.judge_calls, result.errors) == (0, 6, ())
    assert server.request_count == 6  # 2 steps x 3 items
    assert sorted(asked(b) for b in server.requests) == [(q, s) for q in "ABC" for s in (1, 2)]


def test_required_item_passed_at_one_step_is_not_failed(server: Any, judge: ChecklistJudge) -> None:
    server.responder = answering({("A", 1): verdict(True)})
    result = judge.grade_turn([item("A", weight=1.0, required=True)], PREVIOUS, [STEP1, STEP2])
    assert (result.score, result.required_failed) == (1.0, False)


def test_requests_carry_the_schema_sampling_and_full_prompt(
    server: Any, judge: ChecklistJudge
) -> None:
    judge.grade_turn([item("A", weight=1.0)], PREVIOUS, [STEP1, STEP2])
    bodies = {asked(b)[1]: b for b in server.requests}
    for body in bodies.values():
        assert body["response_format"] == JUDGE_RESPONSE_FORMAT
        assert body["response_format"]["json_schema"]["strict"] is True
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.6, 0.8, 6000)
        prompt = prompt_of(body)
        for needle in ("A: did the assistant do it?", "pass-A", "fail-A-1", "fail-A-2"):
            assert needle in prompt
        assert "precise checklist evaluator" in prompt
        assert "only inside the assistant's thinking" in prompt
        previous = prompt.split("# Previous Messages")[1].split("# Current Messages")[0]
        assert "You are a bank assistant." in previous
        assert "# Turn: 1\nRole: user\nWhat is my balance?" in previous
        assert "content.user_visible_reply: Your balance is 10." in previous
    step1 = prompt_of(bodies[1]).split("# Current Messages to Evaluate")[1]
    step2 = prompt_of(bodies[2]).split("# Current Messages to Evaluate")[1]
    call_line = 'tool_call: {"name": "transfer", "arguments": {"to": "Bob", "amount": 5}}'
    for current in (step1, step2):
        assert "# Turn: 2\nRole: user\nSend 5 to Bob." in current  # numbering continues
        assert call_line in current
        assert 'content: {"status": "ok", "tx": "TX-1"}' in current  # step 1's tool response
    assert "Sent 5 to Bob" not in step1  # step 1 does not see the future
    assert "## Step: 2" in step2 and "content.user_visible_reply: Sent 5 to Bob (TX-1)." in step2


def test_call_error_shortcut_skips_tool_items(server: Any, judge: ChecklistJudge) -> None:
    items = [
        item("T", focus="assistant.tool_calls", weight=0.4),
        item("R", focus="tool.content", weight=0.3),
        item("C", focus="assistant.content", weight=0.3),
    ]
    server.responder = lambda body: fake.reply(verdict(True))  # would pass everything it is asked
    result = judge.grade_turn(items, PREVIOUS, [BAD_CALL_STEP, STEP2])
    # step 1 (the rejected call): only C is asked; step 2: all three
    assert server.request_count == 4
    assert result.judge_calls == 4
    assert sorted(asked(b) for b in server.requests) == [("C", 1), ("C", 2), ("R", 2), ("T", 2)]
    assert result.by_step == {"T": (False, True), "R": (False, True), "C": (True, True)}
    assert result.score == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("bad_reply", "reason"),
    [
        ("{not json", "not JSON"),
        ("```json\n" + verdict(True) + "\n```", "not JSON"),
        (verdict("true"), "wrong type"),
        (json.dumps({"answer": True}), "missing"),
        (verdict(True, extra="x"), "extra ['extra']"),
        ("[true]", "not an object"),
    ],
)
def test_unusable_reply_makes_the_turn_unscored(
    server: Any, judge: ChecklistJudge, bad_reply: str, reason: str
) -> None:
    server.responder = answering({("A", 1): verdict(True), ("B", 2): bad_reply})
    result = judge.grade_turn([item("A"), item("B")], PREVIOUS, [STEP1, STEP2])
    assert result.score is None  # masked, not a silent 0 or 0.5
    assert result.failed_calls == 1
    assert result.judge_calls == 4
    assert result.passed == {"A": True, "B": False}
    assert result.by_step["B"] == (False, None)
    assert len(result.errors) == 1
    assert result.errors[0].startswith("item B at step 2: unusable judge reply")
    assert reason in result.errors[0]


def test_http_failure_after_retries_makes_the_turn_unscored(
    server: Any, judge: ChecklistJudge
) -> None:
    def respond(body: dict[str, Any]) -> Any:
        if asked(body) == ("A", 2):
            return fake.error(503, "judge overloaded")
        return fake.reply(verdict(True))

    server.responder = respond
    result = judge.grade_turn([item("A"), item("B")], PREVIOUS, [STEP1, STEP2])
    assert result.score is None
    assert result.failed_calls == 1
    assert server.request_count == 5  # 4 cells + 1 retry of the failing one (max_retries=1)
    assert "HTTP 503: judge overloaded" in result.errors[0]
    assert server.base_url in result.errors[0]


def test_transient_failure_is_retried_and_the_turn_scored(
    server: Any, judge: ChecklistJudge
) -> None:
    server.queue(fake.error(500, "hiccup"))
    server.responder = lambda body: fake.reply(verdict(True))
    result = judge.grade_turn([item("A", weight=1.0)], PREVIOUS, [STEP1])
    assert (result.score, result.failed_calls, server.request_count) == (1.0, 0, 2)


def test_grade_turns_batches_many_turns_in_order(server: Any, judge: ChecklistJudge) -> None:
    server.responder = answering({("A", 1): verdict(True), ("B", 2): verdict(True)})
    turns = [
        TurnToGrade([item("A", weight=1.0)], PREVIOUS, [STEP1, STEP2]),
        TurnToGrade([item("B", weight=0.6), item("C", weight=0.4)], [], [STEP1, STEP2]),
        TurnToGrade([item("A", weight=1.0)], PREVIOUS, [BAD_CALL_STEP]),
    ]
    results = judge.grade_turns(turns)
    assert [r.score for r in results] == [1.0, 0.6, 1.0]
    assert [r.judge_calls for r in results] == [2, 4, 1]
    assert server.request_count == 7


def test_a_turn_without_steps_or_items_makes_no_call(server: Any, judge: ChecklistJudge) -> None:
    empty = judge.grade_turn([item("A")], PREVIOUS, [])
    assert (empty.score, empty.passed, empty.judge_calls) == (0.0, {"A": False}, 0)
    no_items = judge.grade_turn([], PREVIOUS, [STEP1])
    assert (no_items.score, no_items.passed, no_items.required_failed) == (0.0, {}, False)
    assert server.request_count == 0


def test_bad_step_layout_is_rejected(judge: ChecklistJudge) -> None:
    with pytest.raises(ValueError, match="2 assistant messages"):
        judge.grade_turn([item("A")], PREVIOUS, [STEP1 + STEP2])
    with pytest.raises(ValueError, match="last step group"):
        judge.grade_turn([item("A")], PREVIOUS, [STEP1, [USER]])
    with pytest.raises(ValueError, match="unique"):
        judge.grade_turn([item("A"), item("A")], PREVIOUS, [STEP1])


def test_user_message_may_be_its_own_group(server: Any, judge: ChecklistJudge) -> None:
    judge.grade_turn([item("A")], PREVIOUS, [[USER], STEP1[1:], STEP2])
    assert server.request_count == 2
    for body in server.requests:
        assert "# Turn: 2\nRole: user\nSend 5 to Bob." in prompt_of(body)


def test_split_turn_steps() -> None:
    flat = STEP1 + STEP2 + [{"role": "tool", "content": "late"}]
    assert split_turn_steps(flat) == [STEP1, [*STEP2, {"role": "tool", "content": "late"}]]
    assert split_turn_steps(STEP1[1:]) == [STEP1[1:]]
    assert split_turn_steps([USER]) == []


def test_serialisation_splits_thinking_and_renders_calls() -> None:
    text = serialise_messages([*PREVIOUS[1:], *STEP1], turns_before=4)
    assert text == (
        "# Turn: 5\nRole: user\nWhat is my balance?\n\n"
        "## Step: 1\nRole: assistant\ncontent.thinking: look it up\n"
        "content.user_visible_reply: Your balance is 10.\n\n"
        "# Turn: 6\nRole: user\nSend 5 to Bob.\n\n"
        "## Step: 1\nRole: assistant\ncontent.thinking: transfer now\n"
        "content.user_visible_reply:\n"
        'tool_call: {"name": "transfer", "arguments": {"to": "Bob", "amount": 5}}\n\n'
        'Role: tool\nname: transfer\ncontent: {"status": "ok", "tx": "TX-1"}'
    )
    assert serialise_messages([]) == "(none)"


def test_serialisation_handles_missing_open_tag_and_reasoning_field() -> None:
    text = serialise_messages(
        [
            {"role": "assistant", "content": "plan quietly</think>\n\nHello!"},
            {"role": "assistant", "reasoning_content": "separate", "content": "Hi",
             "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]},
        ]
    )  # fmt: skip
    assert "content.thinking: plan quietly\ncontent.user_visible_reply: Hello!" in text
    assert "content.thinking: separate\ncontent.user_visible_reply: Hi" in text
    assert 'tool_call: {"name": "f", "arguments": "{oops"}' in text


def test_prompt_without_failure_examples_says_so() -> None:
    bare = ChecklistItem("X", "Is it polite?", "assistant.content", "Polite tone.", 1.0)
    prompt = build_judge_prompt(bare, [], STEP2)
    assert "- Failure examples:\n  - (none given)" in prompt
    assert "# Previous Messages\n(none)" in prompt


def test_parse_judge_answer_is_strict() -> None:
    assert parse_judge_answer(verdict(True)) is True
    assert parse_judge_answer("  " + verdict(False) + "\n") is False
    for bad in ("", "True", verdict(1), verdict(True, high_level_understanding_of_the_question=3)):
        with pytest.raises(JudgeOutputError):
            parse_judge_answer(bad)


def test_schema_lists_exactly_the_five_fields() -> None:
    assert set(JUDGE_SCHEMA["required"]) == set(JUDGE_SCHEMA["properties"]) == {*FIELDS, "answer"}
    assert JUDGE_SCHEMA["additionalProperties"] is False
    assert JUDGE_SCHEMA["properties"]["answer"] == {"type": "boolean"}


def test_deeply_nested_text_is_data_not_a_crash() -> None:
    """100,000 `[` (RecursionError in json) in a judge reply, a call's arguments or a tool
    message: an unusable reply / verbatim text, never an exception that ends grading."""
    from envace.reward.judge import _call_line, _has_call_error, _verdict

    deep = "[" * 100_000
    verdict = _verdict(deep)
    assert isinstance(verdict, str) and verdict.startswith("unusable judge reply")
    assert deep in _call_line({"name": "a", "arguments": deep})
    assert _has_call_error([{"role": "tool", "content": deep}]) is False
