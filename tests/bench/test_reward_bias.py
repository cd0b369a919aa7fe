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
from envace.rollout.engine import RolloutConfig, RolloutEngine, TurnGrader
from envace.rollout.grading import ShownWorldGrader, TaskGrader
from envace.rollout.policies import OraclePolicy
from envace.run.layout import load_splits
from envace.tasks.generate import write_splits
from tests.bench.bench_testlib import load_bench
from tests.reward.test_shown_world import RenamingOracle


def _bench() -> ModuleType:
    return load_bench("reward_bias.py")


def _run_folder(tmp_path: Path, policy: OraclePolicy, grader: TurnGrader | None = None) -> Path:
    """An `envace run`-like folder: tasks/ and one iteration's saved rollouts (2 per task)."""
    run = tmp_path / "run"
    write_splits(run / "tasks", 12, 1, 0)
    tasks = load_splits(run / "tasks").train
    cfg = RolloutConfig(mode="rehearsal")
    trajs = RolloutEngine(policy, cfg, grader or TaskGrader()).run(tasks, n=2)
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


def test_a_run_trained_with_shown_world_grading_is_checked_against_it(tmp_path: Path) -> None:
    """The run's config.json names the grading its recorded scores came from: with it the
    recorded scores are the shown-world ones; read as task grading they would not match."""
    bench = _bench()
    run = _run_folder(tmp_path, RenamingOracle(), ShownWorldGrader(TaskGrader()))
    with pytest.raises(ValueError, match="task grading gives"):
        bench.main(["--run", str(run)])
    assert bench.main(["--run", str(run), "--trained-with", "shown_world"]) == 0
    (run / "config.json").write_text(json.dumps({"algo": {"rehearsal_grading": "shown_world"}}))
    out = tmp_path / "bias.json"
    assert bench.main(["--run", str(run), "--out", str(out)]) == 0
    s = json.loads(out.read_text())["runs"][str(run)]
    assert s["trained_with"] == "shown_world"
    assert s["reward_consistent_ref"] == pytest.approx(1.0) and s["reward_rehearsed"] < 1.0


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
    row = next(r for r in table if r.startswith("| reward, task grading |"))
    assert row == "| reward, task grading | 0.500 | 0.700 | 0.600 ± 0.141 (2) |"
    row = next(r for r in table if r.startswith("| advantage sign agreement"))
    assert row.endswith("| n/a | 0.250 | 0.250 (1 seed) |")


def test_a_study_cell_reads_its_seed_folders_tasks(tmp_path: Path) -> None:
    """bench/learning.py keeps a cell's rollouts in SEED/MODE/rollouts and the tasks in
    SEED/tasks: the cell folder is a run."""
    bench = _bench()
    run = _run_folder(tmp_path, RenamingOracle())
    cell = run / "rehearsal"
    (run / "rollouts").rename(tmp_path / "rollouts")
    cell.mkdir()
    (tmp_path / "rollouts").rename(cell / "rollouts")
    out = tmp_path / "bias.json"
    assert bench.main(["--run", str(cell), "--out", str(out)]) == 0
    s = json.loads(out.read_text())["runs"][str(cell)]
    assert s["episodes"] == 24 and s["reward_consistent"] == pytest.approx(1.0)


def test_an_interrupted_turn_scores_zero_under_every_grading(tmp_path: Path) -> None:
    """The engine scores a turn an episode ended in (a malformed rehearsed result, a limit)
    0 without grading it: so do all three gradings, and the recorded 0 is not a mismatch."""
    bench = _bench()
    run = _run_folder(tmp_path, RenamingOracle())
    record = json.loads((run / "rollouts" / "iter-000001.jsonl").read_text().splitlines()[0])
    task = {t.id: t for t in load_splits(run / "tasks").train}[record["task_id"]]
    whole = bench.episode_scores(task, record)
    assert whole["turns_consistent"][-1] == 1.0 and not whole["interrupted"]
    record["end_reason"] = "simulator_format_error"
    record["turn_scores"][-1] = 0.0
    cut = bench.episode_scores(task, record)
    assert cut["interrupted"]
    assert cut["turns_rehearsed"][-1] == cut["turns_consistent"][-1] == 0.0
    assert cut["turns_consistent_ref"][-1] == 0.0
    assert cut["turns_consistent"][:-1] == whole["turns_consistent"][:-1]
