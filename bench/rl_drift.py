"""How far an RL stage moved a checkpoint, and whether the result would end a turn at once.

    python bench/rl_drift.py --before runs/study/seed1/checkpoints/warm_start \
        --after runs/study/seed1/lr3e-4/policy runs/study/seed1/high_lr_mini4/policy \
        --tasks runs/study/seed1/tasks/test.jsonl --out drift.json

Two measurements per `--after` checkpoint, against `--before`:
- weight drift: per decoder layer (and per other changed tensor), the RMS change of a weight,
  the change's norm relative to the weights' norm, and the largest change. AdamW's first steps
  move every trainable weight by about the lr whatever its gradient's size, so the RMS change
  after k steps of lr lies between lr * sqrt(k) (steps that do not agree: noise) and lr * k
  (steps that all agree): where it falls says how much of the update is signal.
- end-of-turn pull: over the first turns of `--tasks` (the caller's first prompt as the rollout
  engine renders it: the task's system prompt, its first user message, the tool schemas in
  `--tool-schemas` form), the mean probability that the caller's first token is `<|im_end|>`
  (an empty answer: no tool call, no text) and the greedy first tokens. A policy that collapsed
  to empty answers shows it here without a rollout.
Prints a table and writes JSON (`--out`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envace.report import cpu_model, text_table  # noqa: E402


def weight_drift(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Per group of tensors that changed (a decoder layer `layers.N`, else the tensor's name):
    rms change per weight, relative change (norm of the change / norm of the weights), max."""
    missing = sorted(set(before) ^ set(after))
    if missing:
        raise SystemExit(
            f"the two checkpoints hold different tensors ({', '.join(missing[:4])}...): compare "
            "checkpoints of the same model"
        )
    sums: dict[str, list[float]] = {}
    for name, old in before.items():
        new = after[name]
        if new.shape != old.shape:
            raise SystemExit(f"{name}: shape {tuple(old.shape)} before, {tuple(new.shape)} after")
        delta = new.float() - old.float()
        if not bool(delta.any()):
            continue
        parts = name.split(".")
        at = parts.index("layers") if "layers" in parts else -1
        group = ".".join(parts[at : at + 2]) if at >= 0 else name
        acc = sums.setdefault(group, [0.0, 0.0, 0.0, 0.0])
        acc[0] += float(delta.pow(2).sum())
        acc[1] += float(old.float().pow(2).sum())
        acc[2] += delta.numel()
        acc[3] = max(acc[3], float(delta.abs().max()))
    groups = {
        g: {
            "rms_change": math.sqrt(d2 / n),
            "relative_change": math.sqrt(d2 / w2) if w2 > 0 else math.inf,
            "max_change": mx,
            "weights": int(n),
        }
        for g, (d2, w2, n, mx) in sums.items()
    }
    total = sum(v["weights"] for v in groups.values())
    squares = sum(v["rms_change"] ** 2 * v["weights"] for v in groups.values())
    rms = math.sqrt(squares / total) if total else 0.0
    return {"changed_weights": total, "rms_change": rms, "groups": groups}


def first_token_pull(
    model: Any, tokenizer: Any, tasks: Sequence[Any], tool_schemas: str
) -> dict[str, Any]:
    """Mean p(first caller token = <|im_end|>) over the tasks' first turns, and the greedy first
    tokens with their counts."""
    from envace.policy.chat import ChatRenderer
    from envace.policy.prompts import compact_tools

    renderer = ChatRenderer(tokenizer)
    p_end: list[float] = []
    greedy: dict[str, int] = {}
    for task in tasks:
        msgs = [{"role": "user", "content": task.turns[0].user}]
        if task.system:
            msgs.insert(0, {"role": "system", "content": task.system})
        tools = compact_tools(task.tools) if tool_schemas == "compact" else task.tools
        ids = renderer.prompt_ids(msgs, tools)
        with torch.inference_mode():
            probs = model(input_ids=torch.tensor([ids])).logits[0, -1].float().softmax(-1)
        p_end.append(float(probs[renderer.eos_id]))
        token = tokenizer.decode([int(probs.argmax())])
        greedy[token] = greedy.get(token, 0) + 1
    return {
        "tasks": len(p_end),
        "p_end_first": sum(p_end) / max(1, len(p_end)),
        "greedy_end_first": greedy.get("<|im_end|>", 0),
        "greedy_first_tokens": greedy,
    }


def read_tasks(path: Path, limit: int) -> list[Any]:
    """The first `limit` tasks of a task file, checked by the project's loader (a bad task
    names its file, line and field)."""
    from envace.tasks.loader import load_tasks
    from envace.tasks.problems import TaskFormatError

    try:
        return load_tasks(path).tasks[:limit]
    except TaskFormatError as exc:
        raise SystemExit(
            f"{exc}; give a task JSONL file such as a run's tasks/test.jsonl"
        ) from None


def _load(path: Path) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    from envace.policy.hf_backend import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(path, "float32")
    model.eval()
    return model, tok, {k: v.detach().clone() for k, v in model.state_dict().items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", type=Path, required=True, help="the checkpoint RL started from")
    ap.add_argument("--after", type=Path, nargs="+", required=True, help="checkpoints after RL")
    ap.add_argument("--tasks", type=Path, help="task JSONL whose first turns probe the caller")
    ap.add_argument("--limit", type=int, default=16, help="at most N tasks of --tasks")
    ap.add_argument("--tool-schemas", choices=("compact", "full"), default="compact")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args(argv)
    tasks = read_tasks(args.tasks, args.limit) if args.tasks is not None else []
    model, tok, ref = _load(args.before)
    rows = []
    report: dict[str, Any] = {
        "date": dt.date.today().isoformat(),
        "machine": f"{cpu_model()} ({platform.machine()}), torch {torch.__version__}",
        "before": str(args.before),
        "after": {},
    }
    if tasks:
        report["before_pull"] = first_token_pull(model, tok, tasks, args.tool_schemas)
    del model
    for path in args.after:
        model, tok, state = _load(path)
        entry: dict[str, Any] = {"drift": weight_drift(ref, state)}
        if tasks:
            entry["pull"] = first_token_pull(model, tok, tasks, args.tool_schemas)
        report["after"][str(path)] = entry
        pull = entry.get("pull", {})
        rows.append(
            [
                str(path),
                f"{entry['drift']['changed_weights']:,}",
                f"{entry['drift']['rms_change']:.2e}",
                f"{pull['p_end_first']:.3f}" if pull else "-",
                f"{pull['greedy_end_first']}/{pull['tasks']}" if pull else "-",
            ]
        )
        del model
    header = ["after", "weights changed", "rms change", "p(<|im_end|> first)", "greedy empty"]
    if tasks:
        b = report["before_pull"]
        before_row = [f"{args.before} (before)", "-", "-", f"{b['p_end_first']:.3f}"]
        rows.insert(0, [*before_row, f"{b['greedy_end_first']}/{b['tasks']}"])
    print(text_table(header, rows))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
