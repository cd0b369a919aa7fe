"""How much of a rehearsed episode's reward is the imagined world's doing: the reward bias.

In rehearsal mode the caller acts on tool results the policy imagined, and its turns are graded
by the task's rules: the expected calls and answer facts, whose values (account ids, order ids,
balances) are what the *real* world returned to the gold calls. A caller that faithfully uses
an imagined id, or reports an imagined balance, is graded wrong: the reward punishes acting on
what it was shown, which no caller could avoid. This measures how often that decides a turn.

Input: the episodes an RL run saved (`train.save_rollouts: true` writes
`rollouts/iter-*.jsonl`) and its tasks folder. Per episode, its issued calls are replayed in a
fresh copy of the task's real world; each rehearsed result is aligned with the real one, leaf by
leaf (`envace.reward.shown_world.aligned_values`: same JSON path, both strings or numbers,
values differ: the real value was shown as the imagined one; values the user or the system
prompt stated are left alone, the caller knew them anyway).
Each turn is then graded twice by the rules (`envace.reward.rules.turn_score_rules`):
- as trained (`rehearsed`: the recorded turn scores, re-derived here as a check), and
- `consistent`: with the expected calls' argument values and the answer facts translated
  through that alignment, i.e. graded against the world the caller was shown.
A turn that rises under translation was marked wrong for acting consistently with the
rehearsal. A third grading (`consistent_ref`) is the one `algo.rehearsal_grading: shown_world` trains
with: it aligns only what a grader can know during training without a world, the rehearsed
results of calls the task's logged conversation made too, against their logged results (the
simulator's grounding) — how much of the bias a grader within the method undoes. GRPO's signal is the advantage within each task's group (reward minus the group
mean): the report says how often the two gradings give it the same sign, and how many groups
have no signal under each.

    python bench/reward_bias.py --run runs/A runs/B ... [--out bench/results/reward-bias.json]
    python bench/reward_bias.py --run runs/study/seed0/shown_world --trained-with shown_world

Turns a rehearsal ended early (a malformed simulator result ends the episode; later turns score
0) score 0 under both gradings: the bias measured is a lower bound.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from envace.envs.registry import make_environment, read_only_tools
from envace.policy.types import ToolCall
from envace.report import markdown_table
from envace.reward.rules import turn_answers, turn_score_rules
from envace.reward.shown_world import (
    ValueKey,
    aligned_values,
    shown_world_table,
    translate_turn,
)
from envace.rollout.types import EndReason
from envace.tasks.io import atomic_write_text
from envace.tasks.model import Task

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.learning import mean_std

__all__ = ["episode_scores", "main", "report", "summarise"]

# ends after which the last turn was graded; any other end interrupted it (scored 0)
GRADED_ENDS = frozenset(
    str(r) for r in (EndReason.COMPLETED, EndReason.REQUIRED_ITEM_FAILED, EndReason.UNSCORED)
)


def _turn_ends(messages: Sequence[dict[str, Any]]) -> list[int]:
    """Per user turn, the index in `messages` where it ends (the next user message)."""
    starts = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    return [*starts[1:], len(messages)]


def episode_scores(task: Task, record: Mapping[str, Any], graded: str = "task") -> dict[str, Any]:
    """One saved episode's turn scores: as recorded, against the world it was shown (aligned
    with a real replay of its calls), and against what the logged results let a grader align
    (`envace.reward.shown_world`, the `algo.rehearsal_grading: shown_world` grader). `graded`:
    the run's `algo.rehearsal_grading`, whose scores the recorded ones must be."""
    if task.environment is None:
        raise ValueError(f"task {task.id} has no real world to replay its calls in")
    env = make_environment(task.environment.name)
    env.reset(task.environment.initial_state)
    read_only = read_only_tools(task.environment.name)
    messages = record["messages"]
    answers = turn_answers(messages)
    ends = _turn_ends(messages)
    table: dict[ValueKey, Any] = {}
    table_ref: dict[ValueKey, Any] = {}
    rehearsed: list[float] = []
    consistent: list[float] = []
    consistent_ref: list[float] = []
    said = task.system or ""
    # an episode that ended otherwise than by grading its last turn (a malformed call or
    # result, a step or context limit) scores that interrupted turn 0, whatever was said in it
    interrupted = record["end_reason"] not in GRADED_ENDS
    last = len(record["turn_scores"]) - 1
    for t, recorded in enumerate(record["turn_scores"]):
        said += "\n" + task.turns[t].user
        issued = []
        for c in record["calls"]:
            if c["turn"] != t:
                continue
            call = ToolCall(c["call"]["name"], c["call"]["arguments"])
            issued.append(call)
            real = env.call(call.name, dict(call.arguments))
            if c["source"] != "real":
                for k, v in aligned_values(real, c["result"], said).items():
                    table.setdefault(k, v)
        answer = answers[t] if t < len(answers) else ""
        turn = task.turns[t]
        table_ref = shown_world_table(task, messages[: ends[t]] if t < len(ends) else messages)
        if interrupted and t == last:
            rehearsed.append(0.0)
            consistent.append(0.0)
            consistent_ref.append(0.0)
            continue
        mine = turn_score_rules(turn, issued, answer, read_only)
        ref = turn_score_rules(translate_turn(turn, table_ref), issued, answer, read_only)
        trained = ref if graded == "shown_world" else mine
        if recorded is not None and not math.isclose(trained, recorded, abs_tol=1e-9):
            raise ValueError(
                f"episode {record['traj_id']} turn {t}: {graded} grading gives {trained}, the "
                f"run recorded {recorded}; the rollouts and tasks are not from the same run"
            )
        rehearsed.append(mine)
        consistent.append(turn_score_rules(translate_turn(turn, table), issued, answer, read_only))
        consistent_ref.append(ref)
    n = len(task.turns)
    return {
        "task_id": record["task_id"],
        "traj_id": record["traj_id"],
        "ended": record["end_reason"],
        "turns_rehearsed": rehearsed,
        "turns_consistent": consistent,
        "turns_consistent_ref": consistent_ref,
        "rehearsed": sum(rehearsed) / n,
        "consistent": sum(consistent) / n,
        "consistent_ref": sum(consistent_ref) / n,
        "aligned_values": len(table),
        "aligned_values_ref": len(table_ref),
        "interrupted": interrupted,
    }


def _advantages(rewards: Sequence[float]) -> list[float]:
    mean = sum(rewards) / len(rewards)
    return [r - mean for r in rewards]


def _sign(x: float) -> int:
    return 0 if abs(x) < 1e-9 else (1 if x > 0 else -1)


def summarise(groups: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """Figures over GRPO groups (each: the episodes of one task in one rollout)."""
    eps = [e for g in groups for e in g]
    turns = [
        (a, b)
        for e in eps
        for a, b in zip(e["turns_rehearsed"], e["turns_consistent"], strict=True)
    ]
    failed = [(a, b) for a, b in turns if a < 1.0 - 1e-9]
    same = both = 0
    flat_reh = flat_con = 0
    for g in groups:
        a_reh = _advantages([e["rehearsed"] for e in g])
        a_con = _advantages([e["consistent"] for e in g])
        flat_reh += all(_sign(a) == 0 for a in a_reh)
        flat_con += all(_sign(a) == 0 for a in a_con)
        for x, y in zip(a_reh, a_con, strict=True):
            if _sign(x) or _sign(y):
                both += 1
                same += _sign(x) == _sign(y)
    n = max(len(eps), 1)
    return {
        "episodes": len(eps),
        "groups": len(groups),
        "turns": len(turns),
        "reward_rehearsed": sum(e["rehearsed"] for e in eps) / n,
        "reward_consistent": sum(e["consistent"] for e in eps) / n,
        "success_rehearsed": sum(e["rehearsed"] >= 1.0 - 1e-9 for e in eps) / n,
        "success_consistent": sum(e["consistent"] >= 1.0 - 1e-9 for e in eps) / n,
        "reward_consistent_ref": sum(e["consistent_ref"] for e in eps) / n,
        "success_consistent_ref": sum(e["consistent_ref"] >= 1.0 - 1e-9 for e in eps) / n,
        "failed_turns": len(failed),
        "interrupted_turns": sum(bool(e["interrupted"]) for e in eps),
        "ended_by_simulator": sum(e["ended"] == "simulator_format_error" for e in eps),
        "failed_turns_raised": sum(b > a + 1e-9 for a, b in failed),
        "failed_turns_made_whole": sum(b >= 1.0 - 1e-9 for _, b in failed),
        "turns_lowered": sum(b < a - 1e-9 for a, b in turns),
        "episodes_with_aligned_values": sum(e["aligned_values"] > 0 for e in eps),
        "groups_without_signal_rehearsed": flat_reh,
        "groups_without_signal_consistent": flat_con,
        "advantage_sign_agreement": same / both if both else None,
        "advantages_compared": both,
    }


def load_run(run: Path) -> tuple[list[list[dict[str, Any]]], dict[str, Task], str]:
    """The saved rollouts of `run` as GRPO groups (per file, per task), its train tasks
    (`run/tasks`, or the tasks of the study seed folder above a `bench/learning.py` cell), and
    the grading it trained with (`algo.rehearsal_grading` in its config.json; task without)."""
    from envace.run.layout import load_splits

    files = sorted((run / "rollouts").glob("*.jsonl"))
    if not files:
        raise SystemExit(
            f"no saved rollouts in {run / 'rollouts'}: run RL with --set train.save_rollouts=true"
        )
    folder = run / "tasks" if (run / "tasks").is_dir() else run.parent / "tasks"
    tasks = {t.id: t for t in load_splits(folder).train}
    groups: list[list[dict[str, Any]]] = []
    for f in files:
        by_task: dict[str, list[dict[str, Any]]] = {}
        for line in f.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                by_task.setdefault(rec["task_id"], []).append(rec)
        groups += list(by_task.values())
    missing = {r["task_id"] for g in groups for r in g} - set(tasks)
    if missing:
        raise SystemExit(
            f"{len(missing)} rollout task(s) not in {run / 'tasks'}: {sorted(missing)[:3]}"
        )
    config = run / "config.json"
    algo = json.loads(config.read_text()).get("algo", {}) if config.exists() else {}
    return groups, tasks, str(algo.get("rehearsal_grading", "task"))


ROWS = (
    ("episodes", "episodes"),
    ("reward_rehearsed", "reward, task grading"),
    ("reward_consistent", "reward, graded against the shown world"),
    ("reward_consistent_ref", "reward, shown_world grading (logged results)"),
    ("success_rehearsed", "success, task grading"),
    ("success_consistent", "success, graded against the shown world"),
    ("success_consistent_ref", "success, shown_world grading (logged results)"),
    ("failed_turns", "turns task grading scores < 1"),
    ("interrupted_turns", "... of them interrupted (episode ended mid-turn)"),
    ("ended_by_simulator", "... by a malformed rehearsed result"),
    ("failed_turns_raised", "... raised against the shown world"),
    ("failed_turns_made_whole", "... made whole"),
    ("turns_lowered", "turns lowered"),
    ("groups_without_signal_rehearsed", "groups without signal, task grading"),
    ("groups_without_signal_consistent", "groups without signal, against the shown world"),
    ("advantage_sign_agreement", "advantage sign agreement (task vs shown world)"),
)


def report(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """A markdown table: one column per run, and the mean ± std over runs."""
    names = list(summaries)
    body = [
        [label, *(summaries[n][k] for n in names), mean_std([summaries[n][k] for n in names])]
        for k, label in ROWS
    ]
    return markdown_table(["figure", *names, "mean ± std"], body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--run", type=Path, nargs="+", required=True, help="`envace run` folders with rollouts/"
    )
    p.add_argument(
        "--trained-with",
        choices=["task", "shown_world"],
        default=None,
        help="the runs' algo.rehearsal_grading (default: each run's config.json; task without)",
    )
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    summaries: dict[str, dict[str, Any]] = {}
    episodes: dict[str, list[dict[str, Any]]] = {}
    for run in args.run:
        groups, tasks, graded = load_run(run)
        graded = args.trained_with or graded
        scored = [[episode_scores(tasks[r["task_id"]], r, graded) for r in g] for g in groups]
        summaries[run.name] = {"trained_with": graded, **summarise(scored)}
        episodes[run.name] = [e for g in scored for e in g]
    print(report(summaries))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        body = {"runs": {str(r): summaries[r.name] for r in args.run}, "episodes": episodes}
        atomic_write_text(args.out, json.dumps(body, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
