"""Turn graders for the rollout engine: rules where the task has expected calls, the checklist
judge where it has a checklist (rules take precedence when a turn has both)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

from envace.envs.registry import read_only_tools
from envace.reward.judge import ChecklistJudge, TurnToGrade, split_turn_steps
from envace.reward.rules import turn_answers, turn_score_rules
from envace.reward.shown_world import shown_world_table, translate_turn
from envace.rollout.engine import TurnContext, TurnGrade, TurnGrader
from envace.tasks.model import ChecklistItem

__all__ = ["ChecklistGrader", "JudgeGrader", "ShownWorldGrader", "TaskGrader"]


class ChecklistGrader(Protocol):
    """Grades many turns' checklists at once (an LLM judge behind HTTP)."""

    def grade_turns(
        self,
        items: Sequence[Sequence[ChecklistItem]],
        previous: Sequence[Sequence[dict[str, Any]]],
        steps: Sequence[Sequence[Sequence[dict[str, Any]]]],
    ) -> list[TurnGrade]: ...


class JudgeGrader:
    """`ChecklistGrader` over the checklist LLM judge (one batch of judge calls per phase)."""

    def __init__(self, judge: ChecklistJudge) -> None:
        self.judge = judge

    def grade_turns(
        self,
        items: Sequence[Sequence[ChecklistItem]],
        previous: Sequence[Sequence[dict[str, Any]]],
        steps: Sequence[Sequence[Sequence[dict[str, Any]]]],
    ) -> list[TurnGrade]:
        batch = [TurnToGrade(i, p, s) for i, p, s in zip(items, previous, steps, strict=True)]
        return [TurnGrade(j.score, stop=j.required_failed) for j in self.judge.grade_turns(batch)]


class TaskGrader:
    """The engine's `TurnGrader`: expected calls by rules; checklists by `judge` (if given)."""

    def __init__(self, judge: ChecklistGrader | None = None) -> None:
        self.judge = judge

    def grade(self, contexts: Sequence[TurnContext]) -> list[TurnGrade]:
        grades: list[TurnGrade | None] = [None] * len(contexts)
        judged: list[int] = []
        for i, ctx in enumerate(contexts):
            turn = ctx.task.turns[ctx.turn]
            if turn.expected_calls or turn.answer_facts or not turn.checklist:
                env = ctx.task.environment
                answer = turn_answers(ctx.messages[ctx.turn_start :])[0]
                read_only = read_only_tools(env.name if env is not None else None)
                grades[i] = TurnGrade(turn_score_rules(turn, ctx.calls, answer, read_only))
            elif self.judge is None:
                grades[i] = TurnGrade(None)  # a checklist with no judge: unscored, never 0
            else:
                judged.append(i)
        if judged and self.judge is not None:
            results = self.judge.grade_turns(
                [contexts[i].task.turns[contexts[i].turn].checklist for i in judged],
                [contexts[i].messages[: contexts[i].turn_start] for i in judged],
                [split_turn_steps(contexts[i].messages[contexts[i].turn_start :]) for i in judged],
            )
            for i, g in zip(judged, results, strict=True):
                grades[i] = g
        return [g if g is not None else TurnGrade(None) for g in grades]


class ShownWorldGrader:
    """A `TurnGrader` for rehearsed episodes (`algo.rehearsal_grading: shown_world`): each
    turn's expected values translated to the ones the rehearsal showed the caller
    (`envace.reward.shown_world`), then graded by `base`. A turn with nothing to translate is
    graded exactly as `base` grades it."""

    def __init__(self, base: TurnGrader) -> None:
        self.base = base

    def grade(self, contexts: Sequence[TurnContext]) -> list[TurnGrade]:
        return self.base.grade([self._shown(ctx) for ctx in contexts])

    @staticmethod
    def _shown(ctx: TurnContext) -> TurnContext:
        table = shown_world_table(ctx.task, ctx.messages)
        if not table:
            return ctx
        turns = list(ctx.task.turns)
        turns[ctx.turn] = translate_turn(turns[ctx.turn], table)
        task = dataclasses.replace(ctx.task, turns=tuple(turns))
        return dataclasses.replace(ctx, task=task)
