"""Scripted policies for BFCL: the ground-truth replay (scores 1.0 wherever BFCL's ground truth
is passable) and the empty floor (1.0 on irrelevance, 0 elsewhere)."""

from __future__ import annotations

from collections.abc import Sequence

from envace.policy.chat import ChatRenderer, format_assistant_response
from envace.policy.types import Generation, SamplingParams, ToolCall
from envace.rollout.policies import GenRequest, Policy
from envace.rollout.types import Role

__all__ = ["BfclOraclePolicy", "EmptyPolicy"]

_REHEARSED_OK = '<execution_result>\n{"status": "ok"}\n</execution_result>'


def _text_generation(text: str, renderer: ChatRenderer | None) -> Generation:
    ids: list[int] = []
    if renderer is not None:
        ids = [*renderer.encode(text), renderer.eos_id]
    return Generation(token_ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason="stop")


class BfclOraclePolicy(Policy):
    """Replays BFCL's ground truth: each turn's answer calls in ONE message, then "Done." (a
    memory question: its first accepted answer instead).

    One message per turn is BFCL's own single-turn format (parallel answers are one response)
    and, for multi-turn entries, a valid sequence of steps (the world executes the calls of a
    message in order). As simulator it rehearses every call as a plain success.
    """

    trainable = False

    def __init__(self, renderer: ChatRenderer | None = None) -> None:
        self.renderer = renderer

    def generate(self, requests: Sequence[GenRequest], params: SamplingParams) -> list[Generation]:
        return [_text_generation(self._text(r), self.renderer) for r in requests]

    def _text(self, req: GenRequest) -> str:
        if req.role is Role.SIMULATOR:
            return _REHEARSED_OK
        ep = req.episode
        turn = ep.task.turns[ep.turn]
        expected = turn.expected_calls
        if ep.turn_calls or not expected:
            return turn.answer_facts[0] if turn.answer_facts else "Done."
        return format_assistant_response(
            "", [ToolCall(c.name, dict(c.arguments)) for c in expected]
        )


class EmptyPolicy(Policy):
    """Answers nothing (an empty message) in both roles: the floor (no call: right only where no
    call is the answer, BFCL's irrelevance categories)."""

    trainable = False

    def __init__(self, renderer: ChatRenderer | None = None) -> None:
        self.renderer = renderer

    def generate(self, requests: Sequence[GenRequest], params: SamplingParams) -> list[Generation]:
        return [_text_generation("", self.renderer) for _ in requests]
