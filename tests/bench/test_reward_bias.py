"""bench/reward_bias.py: how often rehearsal's grading marks a caller wrong for acting on what
the rehearsal showed it. Scripted policies stand in for the model (no GPU or training needed):
the oracle plays perfectly, and a renaming oracle plays perfectly in a world whose account and
order ids were consistently renamed — the situation of a caller acting on an imagined id."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import ModuleType

import pytest

from envace.evaluate.report import write_trajectories
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.rollout.grading import TaskGrader
from envace.rollout.policies import GenRequest, OraclePolicy
from envace.run.layout import load_splits
from envace.tasks.generate import write_splits
from envace.tasks.model import ExpectedCall, Turn
from tests.bench.bench_testlib import load_bench

IDS = re.compile(r"\b(ACC|ORD)-([0-9a-f]{4})\b")


def _bench() -> ModuleType:
    return load_bench("reward_bias.py")


class RenamingOracle(OraclePolicy):
    """The oracle, with every account and order id it writes (in calls and in rehearsed
    results alike) reversed: a consistent imagined world and a caller faithful to it."""

    def _text(self, req: GenRequest) -> str:
        return IDS.sub(lambda m: f"{m.group(1)}-{m.group(2)[::-1]}", super()._text(req))


def test_alignment_and_translation() -> None:
    bench = _bench()
    real = {"accounts": [{"id": "ACC-12ab", "balance": 50, "open": True}], "n": 1}
    imagined = {"accounts": [{"id": "ACC-ba21", "balance": 50.0, "open": False}], "n": 2}
    table = bench.aligned_values(real, imagined)
    # the id and the count differ; equal numbers (50 == 50.0) and flags are not values
    assert table == {("str", "ACC-12ab"): "ACC-ba21", ("num", "1.0"): 2}
    turn = Turn(
        "move 5",
        expected_calls=(ExpectedCall("transfer", {"src": "ACC-12ab", "amount": 5}),),
        answer_facts=("ACC-12ab", "7"),
    )
    moved = bench.translate_turn(turn, table)
    assert moved.expected_calls[0].arguments == {"src": "ACC-ba21", "amount": 5}
    assert moved.answer_facts == ("ACC-ba21", "7") and moved.user == "move 5"
    # a value the user stated is the caller's own knowledge, not the rehearsal's
    assert bench.aligned_values(real, imagined, said="I have 1 account") == {
        ("str", "ACC-12ab"): "ACC-ba21"
    }


def _run_folder(tmp_path: Path, policy: OraclePolicy) -> Path:
    """An `envace run`-like folder: tasks/ and one iteration's saved rollouts (4 per task)."""
    run = tmp_path / "run"
    write_splits(run / "tasks", 12, 1, 0)
    tasks = load_splits(run / "tasks").train
    cfg = RolloutConfig(mode="rehearsal")
    trajs = RolloutEngine(policy, cfg, TaskGrader()).run(tasks, n=2)
    write_trajectories(trajs, run / "rollouts" / "iter-000001.jsonl", rows=True)
    return run


def test_a_faithful_caller_in_a_renamed_world_is_graded_wrong_and_made_whole(
    tmp_path: Path,
) -> None:
    bench = _bench()
    run = _run_folder(tmp_path, RenamingOracle())
    out = tmp_path / "bias.json"
    assert bench.main(["--run", str(run), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    s = data["runs"][str(run)]
    assert s["episodes"] == 24 and s["groups"] == 12
    # graded against the world it was shown, the renaming oracle is perfect ...
    assert s["reward_consistent"] == pytest.approx(1.0) and s["success_consistent"] == 1.0
    # ... and the rules, which hold the real ids, fail it wherever an id mattered
    renamed = [e for e in data["episodes"]["run"] if e["aligned_values"] > 0]
    assert renamed, "no generated task carried an id from a tool result"
    assert s["reward_rehearsed"] < 1.0 and s["failed_turns"] > 0
    assert s["failed_turns_made_whole"] == s["failed_turns"] == s["failed_turns_raised"]
    assert all(e["rehearsed"] < 1.0 for e in renamed)
    assert s["turns_lowered"] == 0
    # the oracle's look-ups are the logged conversation's, so the logged results align as well
    assert s["reward_consistent_ref"] == pytest.approx(1.0)
    assert all(e["aligned_values_ref"] > 0 for e in renamed)


def test_no_bias_where_the_rehearsal_is_the_real_world(tmp_path: Path) -> None:
    """The plain oracle rehearses with real results: nothing aligns, both gradings agree."""
    bench = _bench()
    run = _run_folder(tmp_path, OraclePolicy())
    out = tmp_path / "bias.json"
    assert bench.main(["--run", str(run), "--out", str(out)]) == 0
    s = json.loads(out.read_text())["runs"][str(run)]
    assert s["reward_rehearsed"] == s["reward_consistent"] == pytest.approx(1.0)
    assert s["episodes_with_aligned_values"] == 0 and s["failed_turns"] == 0
    assert s["reward_consistent_ref"] == pytest.approx(1.0)
    assert s["groups_without_signal_rehearsed"] == s["groups"]


def test_rollouts_of_another_run_are_refused(tmp_path: Path) -> None:
    """Recorded turn scores the rules cannot reproduce mean mismatched inputs: a clear error."""
    bench = _bench()
    run = _run_folder(tmp_path, OraclePolicy())
    path = run / "rollouts" / "iter-000001.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records[0]["turn_scores"][0] = 0.25
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(ValueError, match="not from the same run"):
        bench.main(["--run", str(run)])


def test_a_run_without_rollouts_says_how_to_get_them(tmp_path: Path) -> None:
    bench = _bench()
    (tmp_path / "tasks").mkdir()
    with pytest.raises(SystemExit, match=re.escape("train.save_rollouts=true")):
        bench.main(["--run", str(tmp_path)])


def test_the_report_has_a_column_per_run_and_their_mean() -> None:
    bench = _bench()
    one = {k: 0.5 for k, _ in bench.ROWS} | {"advantage_sign_agreement": None}
    two = {k: 0.7 for k, _ in bench.ROWS} | {"advantage_sign_agreement": 0.25}
    table = bench.report({"rb0": one, "rb1": two}).splitlines()
    assert table[0] == "| figure | rb0 | rb1 | mean ± std |"
    row = next(r for r in table if r.startswith("| reward as trained |"))
    assert row == "| reward as trained | 0.500 | 0.700 | 0.600 ± 0.141 (2) |"
    row = next(r for r in table if r.startswith("| advantage sign agreement |"))
    assert row == "| advantage sign agreement | n/a | 0.250 | 0.250 (1 seed) |"
