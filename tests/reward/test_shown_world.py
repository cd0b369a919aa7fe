"""Grading rehearsed turns against the world the rehearsal showed (`algo.rehearsal_grading:
shown_world`). Scripted policies stand in for the model: the oracle plays perfectly, and a
renaming oracle plays perfectly in a world whose account and order ids were consistently
renamed — a caller acting faithfully on imagined ids."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from envace.policy.chat import ChatRenderer
from envace.reward.shown_world import aligned_values, shown_world_table, translate_turn
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.rollout.grading import TaskGrader
from envace.rollout.policies import GenRequest, OraclePolicy
from envace.run.layout import load_splits
from envace.tasks.generate import write_splits
from envace.tasks.model import ExpectedCall, Turn
from envace.train.rl import RLTrainer
from tests.rollout.rl_testlib import roomy_rl_setup

IDS = re.compile(r"\b(ACC|ORD)-([0-9a-f]{4})\b")


class RenamingOracle(OraclePolicy):
    """The oracle, with every account and order id it writes (in calls and in rehearsed
    results alike) reversed: a consistent imagined world and a caller faithful to it."""

    def _text(self, req: GenRequest) -> str:
        return _renamed(super()._text(req))


def test_alignment_and_translation() -> None:
    real = {"accounts": [{"id": "ACC-12ab", "balance": 50, "open": True}], "n": 1}
    imagined = {"accounts": [{"id": "ACC-ba21", "balance": 50.0, "open": False}], "n": 2}
    table = aligned_values(real, imagined)
    # the id and the count differ; equal numbers (50 == 50.0) and flags are not values
    assert table == {("str", "ACC-12ab"): "ACC-ba21", ("num", "1.0"): 2}
    turn = Turn(
        "move 5",
        expected_calls=(ExpectedCall("transfer", {"src": "ACC-12ab", "amount": 5}),),
        answer_facts=("ACC-12ab", "7"),
    )
    moved = translate_turn(turn, table)
    assert moved.expected_calls[0].arguments == {"src": "ACC-ba21", "amount": 5}
    assert moved.answer_facts == ("ACC-ba21", "7") and moved.user == "move 5"
    # a value the user stated is the caller's own knowledge, not the rehearsal's
    assert aligned_values(real, imagined, said="I have 1 account") == {
        ("str", "ACC-12ab"): "ACC-ba21"
    }
    assert translate_turn(turn, {}) is turn


def test_only_calls_the_logged_conversation_made_are_aligned(tmp_path: Path) -> None:
    """The table comes from the task's logged results, never a world: a call the log does not
    hold (other arguments) aligns nothing, and an honest rehearsal aligns nothing either."""
    write_splits(tmp_path, 12, 1, 0)
    tasks = load_splits(tmp_path).train
    cfg = RolloutConfig(mode="rehearsal")
    renamed = RolloutEngine(RenamingOracle(), cfg, TaskGrader()).run(tasks)
    honest = RolloutEngine(OraclePolicy(), cfg, TaskGrader()).run(tasks)
    tables = [shown_world_table(t.task, t.messages) for t in renamed]
    aligned = [(t, table) for t, table in zip(renamed, tables, strict=True) if table]
    assert aligned, "no generated task carried an id from a tool result"
    for _, table in aligned:  # real id -> the id the rehearsal showed, and nothing else
        assert {k[1]: v for k, v in table.items()} == {k[1]: _renamed(k[1]) for k in table}
    assert not any(shown_world_table(t.task, t.messages) for t in honest)
    traj = aligned[0][0]
    unlogged = [
        {
            **m,
            "tool_calls": [
                {**c, "function": {**c["function"], "arguments": {"x": 1}}} for c in m["tool_calls"]
            ],
        }
        if m.get("tool_calls")
        else m
        for m in traj.messages
    ]
    assert shown_world_table(traj.task, unlogged) == {}


def _renamed(text: str) -> str:
    return IDS.sub(lambda m: f"{m.group(1)}-{m.group(2)[::-1]}", text)


@pytest.mark.parametrize("grading", ["task", "shown_world"])
def test_rl_rollouts_are_graded_as_configured(
    grading: str, tmp_path: Path, tiny_tokenizer: object
) -> None:
    """Task grading fails the renaming oracle wherever an id mattered; shown-world grading gives
    it every turn, and grades the honest oracle exactly as task grading does (all 1.0)."""
    splits, cfg = roomy_rl_setup(tmp_path, 12, 1, f"algo.rehearsal_grading={grading}")
    renderer = ChatRenderer(tiny_tokenizer)
    trainer = RLTrainer(cfg, splits.train, RenamingOracle(renderer), [], TaskGrader())
    trainer.collect(0)
    rewards = [t.reward for t in trainer.last_trajectories]
    assert len(rewards) == 12
    if grading == "shown_world":
        assert rewards == [1.0] * 12
    else:
        assert min(r or 0.0 for r in rewards) < 1.0
    honest = RLTrainer(cfg, splits.train, OraclePolicy(renderer), [], TaskGrader())
    honest.collect(0)
    assert [t.reward for t in honest.last_trajectories] == [1.0] * 12
