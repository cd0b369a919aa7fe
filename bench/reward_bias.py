"""How much of a rehearsed episode's reward is the imagined world's doing: the reward bias.

In rehearsal mode the caller acts on tool results the policy imagined, and its turns are graded
by the task's rules: the expected calls and answer facts, whose values (account ids, order ids,
balances) are what the *real* world returned to the gold calls. A caller that faithfully uses
an imagined id, or reports an imagined balance, is graded wrong: the reward punishes acting on
what it was shown, which no caller could avoid. This measures how often that decides a turn.

Input: the episodes an RL run saved (`train.save_rollouts: true` writes
`rollouts/iter-*.jsonl`) and its tasks folder. Per episode, its issued calls are replayed in a
fresh copy of the task's real world; each rehearsed result is aligned with the real one, leaf by
leaf (same JSON path, both scalars, values differ: the real value "became" the imagined one;
values the user or the system prompt stated are left alone, the caller knew them anyway).
Each turn is then graded twice by the rules (`envace.reward.rules.turn_score_rules`):
- as trained (`rehearsed`: the recorded turn scores, re-derived here as a check), and
- `consistent`: with the expected calls' argument values and the answer facts translated
  through that alignment, i.e. graded against the world the caller was shown.
A turn that rises under translation was marked wrong for acting consistently with the
rehearsal. A third grading (`consistent_ref`) aligns only what a grader could know during
training without a world: the rehearsed results of calls the task's logged conversation made
too, against their logged results (the simulator's grounding) — how much of the bias a grader
within the method could undo. GRPO's signal is the advantage within each task's group (reward minus the group
mean): the report says how often the two gradings give it the same sign, and how many groups
have no signal under each.

    python bench/reward_bias.py --run runs/A runs/B ... [--out bench/results/reward-bias.json]

Turns a rehearsal ended early (a malformed simulator result ends the episode; later turns score
0) score 0 under both gradings: the bias measured is a lower bound.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from envace.envs.registry import make_environment, read_only_tools
from envace.policy.prompts import grounding_from_reference
from envace.policy.types import ToolCall
from envace.report import markdown_table
from envace.reward.fidelity import canonical_json
from envace.reward.rules import fact_in_answer, turn_answers, turn_score_rules
from envace.tasks.io import atomic_write_text
from envace.tasks.model import ExpectedCall, Task, Turn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.learning import mean_std

__all__ = [
    "aligned_values",
    "episode_scores",
    "main",
    "report",
    "summarise",
    "translate_turn",
]


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    """(path, scalar) of every leaf of a JSON value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(v, (*path, i))
    else:
        yield path, value


def _key(value: Any) -> tuple[str, str]:
    """A hashable, type-aware key (1 and 1.0 are one number; True is not 1)."""
    if isinstance(value, bool) or value is None:
        return ("const", json.dumps(value))
    if isinstance(value, (int, float)):
        return ("num", repr(float(value)))
    return ("str", str(value))


def aligned_values(real: Any, rehearsed: Any, said: str = "") -> dict[tuple[str, str], Any]:
    """Real value -> the rehearsed value at the same JSON path, where both are strings or
    numbers and differ (a flag, a null or a container is not a value a call carries on). Values
    `said` states (what the user and the system prompt told the caller) are left out: the caller
    knew them without the rehearsal."""
    imagined = dict(_leaves(rehearsed))
    out: dict[tuple[str, str], Any] = {}
    for path, value in _leaves(real):
        if path not in imagined or isinstance(value, bool) or value is None:
            continue
        if fact_in_answer(str(value), said):
            continue
        other = imagined[path]
        if isinstance(other, bool) or other is None or isinstance(other, (dict, list)):
            continue
        if _key(value) != _key(other):
            out.setdefault(_key(value), other)
    return out


def _translate(value: Any, table: Mapping[tuple[str, str], Any]) -> Any:
    if isinstance(value, dict):
        return {k: _translate(v, table) for k, v in value.items()}
    if isinstance(value, list):
        return [_translate(v, table) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    return table.get(_key(value), value)


def translate_turn(turn: Turn, table: Mapping[tuple[str, str], Any]) -> Turn:
    """`turn` with its expected calls' argument values and answer facts as the rehearsal showed
    them (real values the alignment maps; everything else as it was)."""
    calls = tuple(
        ExpectedCall(c.name, _translate(dict(c.arguments), table)) for c in turn.expected_calls
    )
    facts = tuple(str(table.get(_key(f), f)) for f in turn.answer_facts)
    return Turn(turn.user, turn.checklist, calls, turn.ordered, facts)


def _logged_results(task: Task) -> dict[tuple[str, str], Any]:
    """The real results the task's logged conversation holds, by (tool, canonical arguments):
    what a grader may know during training without a world (the simulator's grounding)."""
    out: dict[tuple[str, str], Any] = {}
    for ex in grounding_from_reference(task.reference):
        try:
            result = json.loads(ex.result)
        except json.JSONDecodeError:
            result = ex.result
        out.setdefault((ex.name, canonical_json(ex.arguments)), result)
    return out


def episode_scores(task: Task, record: Mapping[str, Any]) -> dict[str, Any]:
    """One saved episode's turn scores graded as recorded and against its rehearsal."""
    if task.environment is None:
        raise ValueError(f"task {task.id} has no real world to replay its calls in")
    env = make_environment(task.environment.name)
    env.reset(task.environment.initial_state)
    read_only = read_only_tools(task.environment.name)
    answers = turn_answers(record["messages"])
    calls = record["calls"]
    logged = _logged_results(task)
    table: dict[tuple[str, str], Any] = {}
    table_ref: dict[tuple[str, str], Any] = {}
    rehearsed: list[float] = []
    consistent: list[float] = []
    consistent_ref: list[float] = []
    said = task.system or ""
    for t, recorded in enumerate(record["turn_scores"]):
        said += "\n" + task.turns[t].user
        issued = []
        for c in calls:
            if c["turn"] != t:
                continue
            call = ToolCall(c["call"]["name"], c["call"]["arguments"])
            issued.append(call)
            real = env.call(call.name, dict(call.arguments))
            if c["source"] == "rehearsal":
                for k, v in aligned_values(real, c["result"], said).items():
                    table.setdefault(k, v)
                key = (call.name, canonical_json(call.arguments))
                if key in logged:
                    for k, v in aligned_values(logged[key], c["result"], said).items():
                        table_ref.setdefault(k, v)
        answer = answers[t] if t < len(answers) else ""
        turn = task.turns[t]
        mine = turn_score_rules(turn, issued, answer, read_only)
        if recorded is not None and not math.isclose(mine, recorded, abs_tol=1e-9):
            raise ValueError(
                f"episode {record['traj_id']} turn {t}: the rules give {mine}, the run recorded "
                f"{recorded}; the rollouts and tasks are not from the same run or grader"
            )
        rehearsed.append(mine)
        consistent.append(turn_score_rules(translate_turn(turn, table), issued, answer, read_only))
        consistent_ref.append(
            turn_score_rules(translate_turn(turn, table_ref), issued, answer, read_only)
        )
    n = len(task.turns)
    return {
        "task_id": record["task_id"],
        "traj_id": record["traj_id"],
        "ended": record["end_reason"],
        "turns_rehearsed": rehearsed,
        "turns_consistent": consistent,
        "rehearsed": sum(rehearsed) / n,
        "consistent": sum(consistent) / n,
        "consistent_ref": sum(consistent_ref) / n,
        "aligned_values": len(table),
        "aligned_values_ref": len(table_ref),
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
        "failed_turns_raised": sum(b > a + 1e-9 for a, b in failed),
        "failed_turns_made_whole": sum(b >= 1.0 - 1e-9 for _, b in failed),
        "turns_lowered": sum(b < a - 1e-9 for a, b in turns),
        "episodes_with_aligned_values": sum(e["aligned_values"] > 0 for e in eps),
        "groups_without_signal_rehearsed": flat_reh,
        "groups_without_signal_consistent": flat_con,
        "advantage_sign_agreement": same / both if both else None,
        "advantages_compared": both,
    }


def load_run(run: Path) -> tuple[list[list[dict[str, Any]]], dict[str, Task]]:
    """The saved rollouts of `run` as GRPO groups (per file, per task), and its train tasks."""
    from envace.run.layout import load_splits

    files = sorted((run / "rollouts").glob("*.jsonl"))
    if not files:
        raise SystemExit(
            f"no saved rollouts in {run / 'rollouts'}: run RL with --set train.save_rollouts=true"
        )
    tasks = {t.id: t for t in load_splits(run / "tasks").train}
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
    return groups, tasks


ROWS = (
    ("episodes", "episodes"),
    ("reward_rehearsed", "reward as trained"),
    ("reward_consistent", "reward against the shown world"),
    ("success_rehearsed", "success as trained"),
    ("success_consistent", "success against the shown world"),
    ("reward_consistent_ref", "reward against the shown world, logged results only"),
    ("success_consistent_ref", "success against the shown world, logged results only"),
    ("failed_turns", "turns graded < 1"),
    ("failed_turns_raised", "... raised against the shown world"),
    ("failed_turns_made_whole", "... made whole"),
    ("turns_lowered", "turns lowered"),
    ("groups_without_signal_rehearsed", "groups without signal, as trained"),
    ("groups_without_signal_consistent", "groups without signal, against the shown world"),
    ("advantage_sign_agreement", "advantage sign agreement"),
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
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    summaries: dict[str, dict[str, Any]] = {}
    episodes: dict[str, list[dict[str, Any]]] = {}
    for run in args.run:
        groups, tasks = load_run(run)
        scored = [[episode_scores(tasks[r["task_id"]], r) for r in g] for g in groups]
        summaries[run.name] = summarise(scored)
        episodes[run.name] = [e for g in scored for e in g]
    print(report(summaries))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        body = {"runs": {str(r): summaries[r.name] for r in args.run}, "episodes": episodes}
        atomic_write_text(args.out, json.dumps(body, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
