"""How much of a real tool result an ungrounded simulator can know: the fidelity ceiling.

The learning study measures rehearsal fidelity on held-out tasks, which carry no logged
conversation, so their simulator prompts have no grounding examples: the simulator sees the
system prompt, the user turns, the calls and the earlier results, and must invent the rest of
the world's hidden state (account ids, balances, stock, file contents). This replays every
task's gold calls in its real world and counts, per top-level result field, whether its value
could be known: it appears in the text the simulator sees at that point (as written or as JSON),
or it is a flag, a null or an empty container (guessable). The share of such fields bounds the
field fidelity of a simulator that copies perfectly and guesses nothing hidden (loosely: a value
that appears somewhere in the text still has to be picked out).

    python bench/fidelity_ceiling.py --seeds 0 1 2 --n-train 32 --n-test 16
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envace.envs.registry import make_environment
from envace.reward.fidelity import canonical_json
from envace.tasks.generate import generate_splits
from envace.tasks.io import atomic_write_text, task_from_dict
from envace.tasks.model import Task


def knowable(value: Any, visible: str) -> bool:
    """A field value the simulator could write from `visible` alone (or guess: a flag)."""
    if isinstance(value, (dict, list)):
        return not value
    if value is None or isinstance(value, bool):
        return True
    return str(value) in visible or canonical_json(value) in visible


def task_fields(task: Task) -> list[tuple[str, bool]]:
    """(tool, knowable) per top-level field of every gold call's real result, in order."""
    if task.environment is None:
        return []
    env = make_environment(task.environment.name)
    env.reset(task.environment.initial_state)
    visible = task.system or ""
    out: list[tuple[str, bool]] = []
    for turn in task.turns:
        visible += "\n" + turn.user
        for call in turn.expected_calls:
            visible += "\n" + canonical_json(dict(call.arguments))
            result = env.call(call.name, dict(call.arguments))
            if isinstance(result, dict):
                out += [(call.name, knowable(v, visible)) for v in result.values()]
            visible += "\n" + canonical_json(result)
    return out


def ceiling(tasks: Sequence[Task]) -> dict[str, Any]:
    fields = [f for t in tasks for f in task_fields(t)]
    tools: dict[str, list[bool]] = {}
    for name, ok in fields:
        tools.setdefault(name, []).append(ok)
    return {
        "fields": len(fields),
        "knowable_share": sum(ok for _, ok in fields) / len(fields) if fields else None,
        "per_tool": {k: round(sum(v) / len(v), 3) for k, v in sorted(tools.items())},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--n-train", type=int, default=32)
    p.add_argument("--n-test", type=int, default=16)
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    result: dict[str, Any] = {"n_train": args.n_train, "n_test": args.n_test, "seeds": {}}
    print("| seed | split | fields | knowable share |\n|---|---|---|---|")
    for seed in args.seeds:
        splits = generate_splits(args.n_train, args.n_test, seed=seed)
        for name, rows in (("test", splits.test), ("train", splits.train)):
            c = ceiling([task_from_dict(r) for r in rows])
            result["seeds"].setdefault(str(seed), {})[name] = c
            print(f"| {seed} | {name} | {c['fields']} | {c['knowable_share']:.3f} |")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out, json.dumps(result, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
