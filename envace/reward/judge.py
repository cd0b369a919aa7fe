"""The checklist LLM judge: grades one completed user turn against that turn's checklist.

For every assistant step s of the turn and every checklist item k the judge model answers one
yes/no question, in JSON constrained by a schema: does step s (seen with the whole conversation
up to it) satisfy item k? An item passes the turn when it passes at any step; the turn score is
the sum of the weights of the passing items.

Unlike the reference, a failed judge call (HTTP error after retries, output that is not JSON or
does not fit the schema) never turns into a silent 0: the turn comes back unscored (score None)
so that the trajectory's rows are masked out of training and counted in the metrics.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from envace.policy.types import SamplingParams
from envace.tasks.model import ChecklistItem

if TYPE_CHECKING:
    from envace.policy.openai_http import ChatError

__all__ = [
    "JUDGE_RESPONSE_FORMAT",
    "JUDGE_SAMPLING",
    "JUDGE_SCHEMA",
    "BatchChatBackend",
    "ChecklistJudge",
    "JudgeOutputError",
    "TurnJudgement",
    "TurnToGrade",
    "build_judge_prompt",
    "parse_judge_answer",
    "serialise_messages",
    "split_turn_steps",
]

logger = logging.getLogger(__name__)

Message = dict[str, Any]

_ANALYSIS_FIELDS = (
    "high_level_understanding_of_the_question",
    "analysis_of_if_focus_on",
    "analysis_of_pass_condition",
    "analysis_of_failure_examples",
)

JUDGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        **{name: {"type": "string"} for name in _ANALYSIS_FIELDS},
        "answer": {"type": "boolean"},
    },
    "required": [*_ANALYSIS_FIELDS, "answer"],
    "additionalProperties": False,
}

JUDGE_RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {"name": "checklist_item_verdict", "schema": JUDGE_SCHEMA, "strict": True},
}

# The reference judge's sampling: T 0.6, top_p 0.8, up to 6000 tokens for the four analyses.
JUDGE_SAMPLING = SamplingParams(max_new_tokens=6000, temperature=0.6, top_p=0.8)

# Items about calls or tool results fail outright at a step whose call was rejected as malformed:
# there is no valid call or result to judge, so asking the model would only add noise and cost.
_SHORTCUT_FOCUS = frozenset({"assistant.tool_calls", "tool.content"})

_FOCUS_MEANING = {
    "assistant.tool_calls": "the tool calls the assistant actually issued (tool_call lines)",
    "assistant.content": "the assistant's own text: its thinking and its user-visible reply",
    "tool.content": "the content returned by the tools (Role: tool)",
}

_ROLE_LINE = (
    "You are a precise checklist evaluator. You decide whether one step of an assistant's work "
    "in a tool-use conversation satisfies one checklist item, and you answer in the requested "
    "JSON format only."
)

_SPECIAL_RULES = """\
- Only issued tool calls count. A tool call that appears only inside the assistant's thinking \
(content.thinking) was never made and is invalid.
- If a tool response of the latest step reports an error, the tool calls of that step are \
invalid."""

_PROCEDURE = """\
1. Say in one or two sentences what the question checks \
(high_level_understanding_of_the_question).
2. Find the part named in "Focus on" in the current messages, latest step first. If it is \
absent, the answer is false (analysis_of_if_focus_on).
3. Check the pass condition against that part, point by point (analysis_of_pass_condition).
4. Check whether any failure example applies (analysis_of_failure_examples).
5. Set answer to true only if the focus part is present, the pass condition is fully met and \
no failure example applies; otherwise set it to false."""


class BatchChatBackend(Protocol):
    """What the judge needs from a chat client (OpenAIChatClient implements it)."""

    def chat_many(
        self,
        conversations: Sequence[Sequence[Message]],
        params: SamplingParams,
        response_format: dict[str, Any] | None = None,
    ) -> list[str | ChatError]:
        """One reply per conversation, in order; a failed request is a ChatError value."""
        ...


class JudgeOutputError(ValueError):
    """The judge's reply is not a JSON object of the required shape."""


@dataclass(frozen=True)
class TurnToGrade:
    """One completed user turn, as the judge sees it.

    previous_messages: OpenAI chat messages before this turn's user message.
    steps: one group of messages per assistant step, in order. A group holds the messages that
        lead up to the step's assistant message (for the first step: the user message), the
        assistant message itself, then the tool responses to its calls. `split_turn_steps`
        builds the groups from a flat list of the turn's messages. A group without an assistant
        message (the user message on its own) is context for the next step.
    """

    items: Sequence[ChecklistItem]
    previous_messages: Sequence[Message]
    steps: Sequence[Sequence[Message]]


@dataclass(frozen=True)
class TurnJudgement:
    """The judge's verdict on one turn.

    score: sum of the weights of the items passed at one step or more; None when any judge call
        failed (the turn is unscored and its trajectory must be masked, not scored 0).
    passed: item id -> passed at one step or more (a failed call counts as not passed here).
    required_failed: a `required_for_next_turn` item passed at no step (the episode stops).
    failed_calls: judge calls that failed (HTTP error after retries, bad JSON, wrong shape).
    judge_calls: judge calls made (steps x items, minus the shortcut ones).
    by_step: item id -> verdict per step: True / False, or None where the call failed.
    errors: one line per failed call, naming the item and the step.
    """

    score: float | None
    passed: dict[str, bool]
    required_failed: bool
    failed_calls: int
    judge_calls: int
    by_step: dict[str, tuple[bool | None, ...]]
    errors: tuple[str, ...] = ()


def split_turn_steps(turn_messages: Sequence[Message]) -> list[list[Message]]:
    """Group a turn's messages (user, assistant, tool, ..., assistant) by assistant step.

    A new group starts at every assistant message after the first; everything before the first
    one (the user message) belongs to the first group. `[u, a1, t, t, a2, t, a3]` gives
    `[[u, a1, t, t], [a2, t], [a3]]`.
    """
    groups: list[list[Message]] = [[]]
    for message in turn_messages:
        if message.get("role") == "assistant" and _assistant_index(groups[-1]) is not None:
            groups.append([])
        groups[-1].append(message)
    return groups if _assistant_index(groups[0]) is not None else []


def _assistant_index(group: Sequence[Message]) -> int | None:
    for i, message in enumerate(group):
        if message.get("role") == "assistant":
            return i
    return None


# Serialisation -----------------------------------------------------------------------------


def _text(content: Any) -> str:
    """Message content as text: a string, or the text parts of an OpenAI content-part list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return "".join(str(p) for p in parts)
    return json.dumps(content, ensure_ascii=False)


def _split_thinking(message: Message) -> tuple[str, str]:
    """(thinking, user-visible reply) of an assistant message.

    Qwen3-style `<think>...</think>` is cut from the content; the opening tag may be missing when
    the chat template put it in the prompt. A separate `reasoning_content` field also counts.
    """
    content = _text(message.get("content"))
    thinking = _text(message.get("reasoning_content")).strip()
    if "</think>" in content:
        head, _, content = content.rpartition("</think>")
        head = head.replace("<think>", "").strip()
        thinking = f"{thinking}\n{head}".strip()
    return thinking, content.strip()


def _call_line(call: dict[str, Any]) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        # A malformed argument string stays verbatim: it is itself worth judging.
        with contextlib.suppress(ValueError, RecursionError):
            arguments = json.loads(arguments)
    return json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)


def _render_assistant(message: Message, step: int) -> list[str]:
    thinking, reply = _split_thinking(message)
    lines = [f"## Step: {step}", "Role: assistant"]
    lines.append(f"content.thinking: {thinking}" if thinking else "content.thinking: (none)")
    lines.append(f"content.user_visible_reply: {reply}" if reply else "content.user_visible_reply:")
    lines += [f"tool_call: {_call_line(c)}" for c in message.get("tool_calls") or ()]
    return lines


def serialise_messages(messages: Sequence[Message], turns_before: int = 0) -> str:
    """The judge's text form of a conversation.

    Each user message opens `# Turn: i` (numbered from turns_before + 1); each assistant
    message is `## Step: j` within its turn (thinking, visible reply, one `tool_call:` line per
    call); tool responses follow as `Role: tool`. A system message is shown first.
    """
    blocks: list[list[str]] = []
    turn, step = turns_before, 0
    for message in messages:
        role = message.get("role")
        if role == "user":
            turn, step = turn + 1, 0
            blocks.append([f"# Turn: {turn}", "Role: user", _text(message.get("content"))])
        elif role == "assistant":
            step += 1
            blocks.append(_render_assistant(message, step))
        elif role == "tool":
            name = message.get("name")
            head = ["Role: tool"] + ([f"name: {name}"] if name else [])
            blocks.append([*head, f"content: {_text(message.get('content'))}"])
        else:
            blocks.append([f"Role: {role}", _text(message.get("content"))])
    return "\n\n".join("\n".join(block) for block in blocks) if blocks else "(none)"


# Prompt and answer --------------------------------------------------------------------------


def _criteria(item: ChecklistItem) -> str:
    meaning = _FOCUS_MEANING.get(item.focus_on)
    focus = f"{item.focus_on} ({meaning})" if meaning else item.focus_on
    examples = "\n".join(f"  - {e}" for e in item.failure_examples) or "  - (none given)"
    return (
        f"- Question: {item.question}\n"
        f"- Focus on: {focus}\n"
        f"- Pass condition: {item.pass_condition}\n"
        f"- Failure examples:\n{examples}"
    )


def build_judge_prompt(
    item: ChecklistItem, previous_messages: Sequence[Message], current_messages: Sequence[Message]
) -> str:
    """The judge's prompt for one item at one step (the step is the last assistant message)."""
    turns_before = sum(1 for m in previous_messages if m.get("role") == "user")
    sections = [
        _ROLE_LINE,
        f"# Checklist Item\n{_criteria(item)}",
        f"# Previous Messages\n{serialise_messages(previous_messages)}",
        f"# Current Messages to Evaluate\n{serialise_messages(current_messages, turns_before)}",
        f"# Special Rules\n{_SPECIAL_RULES}",
        f"# How to Evaluate\n{_PROCEDURE}",
        "# Output\nOne JSON object with exactly these fields: "
        + ", ".join(f"{name} (string)" for name in _ANALYSIS_FIELDS)
        + ", answer (boolean).",
    ]
    return "\n\n".join(sections)


def parse_judge_answer(text: str) -> bool:
    """The `answer` of a judge reply. Strict: the reply must be exactly one JSON object with the
    five schema fields of the right types, nothing else (no prose, no code fence)."""
    try:
        reply = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise JudgeOutputError(f"reply is not JSON ({exc}): {text[:200]!r}") from exc
    if not isinstance(reply, dict):
        raise JudgeOutputError(f"reply is a JSON {type(reply).__name__}, not an object")
    expected = {*_ANALYSIS_FIELDS, "answer"}
    if set(reply) != expected:
        missing, extra = sorted(expected - set(reply)), sorted(set(reply) - expected)
        raise JudgeOutputError(
            f"reply fields do not match the schema: missing {missing}, extra {extra}"
        )
    wrong = [name for name in _ANALYSIS_FIELDS if not isinstance(reply[name], str)]
    if wrong or not isinstance(reply["answer"], bool):
        raise JudgeOutputError(f"reply fields of the wrong type: {wrong or ['answer']}")
    return bool(reply["answer"])


def _has_call_error(messages: Sequence[Message]) -> bool:
    """True when a tool response says the call itself was rejected (`error_tool_call`)."""
    for message in messages:
        if message.get("role") != "tool":
            continue
        content = message.get("content")
        if isinstance(content, str):
            try:
                content = json.loads(content)
            except (ValueError, RecursionError):
                continue
        if isinstance(content, dict) and "error_tool_call" in content:
            return True
    return False


# The judge ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Query:
    """One (turn, step, item) cell; `prompt` is None when the shortcut decided it."""

    turn: int
    step: int
    item: int
    prompt: str | None


class ChecklistJudge:
    """Grades turns with an LLM behind `client` (one call per step x item, run concurrently)."""

    def __init__(
        self,
        client: BatchChatBackend,
        params: SamplingParams = JUDGE_SAMPLING,
        response_format: dict[str, Any] | None = JUDGE_RESPONSE_FORMAT,
    ) -> None:
        self.client = client
        self.params = params
        self.response_format = response_format

    def grade_turn(
        self,
        items: Sequence[ChecklistItem],
        previous_messages: Sequence[Message],
        turn_messages_by_step: Sequence[Sequence[Message]],
    ) -> TurnJudgement:
        """Grade one turn; see TurnToGrade for the message layout."""
        return self.grade_turns([TurnToGrade(items, previous_messages, turn_messages_by_step)])[0]

    def grade_turns(self, turns: Sequence[TurnToGrade]) -> list[TurnJudgement]:
        """Grade many turns (e.g. every episode that finished a turn at this rollout step) with
        one concurrent batch of judge calls. Results are in the order of `turns`."""
        views = [_step_views(turn) for turn in turns]
        queries = [q for t, turn in enumerate(turns) for q in _queries(t, turn, views[t])]
        asked = [q for q in queries if q.prompt is not None]
        replies = self.client.chat_many(
            [[{"role": "user", "content": q.prompt}] for q in asked],
            self.params,
            self.response_format,
        )
        # Shortcut cells are False; asked cells get the parsed answer or the failure reason.
        verdicts: dict[tuple[int, int, int], bool | str] = {
            (q.turn, q.step, q.item): False for q in queries
        }
        for q, reply in zip(asked, replies, strict=True):
            verdicts[(q.turn, q.step, q.item)] = _verdict(reply)
        asked_per_turn = Counter(q.turn for q in asked)
        return [
            _judgement(t, turn, len(views[t]), verdicts, asked_per_turn[t])
            for t, turn in enumerate(turns)
        ]


@dataclass(frozen=True)
class _StepView:
    """What the judge sees at one assistant step: the turn so far, and the step's tool replies."""

    current: list[Message]
    tool_responses: list[Message]


def _step_views(turn: TurnToGrade) -> list[_StepView]:
    """One view per assistant step. A group without an assistant message (say, the user message
    on its own) is context for the next step rather than a step."""
    ids = [item.id for item in turn.items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"checklist item ids must be unique within a turn, got {ids}")
    views: list[_StepView] = []
    current: list[Message] = []
    for s, group in enumerate(turn.steps):
        current.extend(group)
        roles = [m.get("role") for m in group]
        if roles.count("assistant") > 1:
            raise ValueError(
                f"step group {s} holds {roles.count('assistant')} assistant messages; "
                "group the turn's messages with split_turn_steps"
            )
        at = _assistant_index(group)
        if at is not None:
            views.append(_StepView(list(current), list(group[at + 1 :])))
    if turn.steps and _assistant_index(turn.steps[-1]) is None:
        raise ValueError("the last step group of the turn has no assistant message")
    return views


def _queries(t: int, turn: TurnToGrade, views: Sequence[_StepView]) -> list[_Query]:
    queries: list[_Query] = []
    for s, view in enumerate(views):
        call_error = _has_call_error(view.tool_responses)
        for k, item in enumerate(turn.items):
            if call_error and item.focus_on in _SHORTCUT_FOCUS:
                queries.append(_Query(t, s, k, None))
            else:
                prompt = build_judge_prompt(item, turn.previous_messages, view.current)
                queries.append(_Query(t, s, k, prompt))
    return queries


def _verdict(reply: str | ChatError) -> bool | str:
    """True / False, or the reason the call failed (a string)."""
    if not isinstance(reply, str):
        return str(reply)
    try:
        return parse_judge_answer(reply)
    except JudgeOutputError as exc:
        return f"unusable judge reply: {exc}"


def _judgement(
    t: int,
    turn: TurnToGrade,
    n_steps: int,
    verdicts: dict[tuple[int, int, int], bool | str],
    asked: int,
) -> TurnJudgement:
    by_step: dict[str, tuple[bool | None, ...]] = {}
    errors: list[str] = []
    for k, item in enumerate(turn.items):
        cells: list[bool | None] = []
        for s in range(n_steps):
            verdict = verdicts[(t, s, k)]
            if isinstance(verdict, str):
                errors.append(f"item {item.id} at step {s + 1}: {verdict}")
                cells.append(None)
            else:
                cells.append(verdict)
        by_step[item.id] = tuple(cells)
    passed = {item.id: any(v is True for v in by_step[item.id]) for item in turn.items}
    score = sum(item.weight for item in turn.items if passed[item.id])
    if errors:
        logger.warning(
            "judge: %d of the calls for a turn failed, the turn is unscored; first: %s",
            len(errors),
            errors[0],
        )
    return TurnJudgement(
        score=None if errors else score,
        passed=passed,
        required_failed=any(i.required_for_next_turn and not passed[i.id] for i in turn.items),
        failed_calls=len(errors),
        judge_calls=asked,
        by_step=by_step,
        errors=tuple(errors),
    )
