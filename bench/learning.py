"""Learning benchmark: the same warm start, then RL in each training mode, on held-out tasks.

For every seed: generate tasks, build the tiny model, warm-start it once, then from that same
checkpoint run RL with the same budget in each mode —
  rehearsal  the policy writes every tool result (the method),
  real       the real worlds execute the tools (upper bound),
  external   a frozen copy of the warm-started policy writes the tool results,
and compare with no RL at all (warm start only). Held-out success, valid-call rate and rehearsal
fidelity are evaluated in the real worlds. Appends a Markdown table (mean ± std over seeds) with
the command, machine and date to docs/benchmarks.md and writes a PNG.

    python bench/learning.py --seeds 0 1 --set train.iterations=10
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from envace.config import Config, load_config
from envace.train.run import (
    RunPaths,
    evaluate_model,
    init_model,
    load_splits,
    prepare_tasks,
    rl_stage,
    warm_start,
)
from envace.train.tracking import MetricsLogger

MODES = ("warm_start_only", "rehearsal", "real", "external")
METRICS = ("success_rate", "valid_call_rate", "rehearsal_fidelity")


def _mean_std(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def run_seed(base: Config, seed: int, out: Path, modes: list[str]) -> dict[str, dict[str, Any]]:
    cfg = copy.deepcopy(base)
    cfg.seed = cfg.tasks.seed = cfg.train.seed = seed
    paths = RunPaths(out, str(out))
    prepare_tasks(cfg, paths)
    splits = load_splits(paths.tasks)
    model, tok = init_model(cfg, splits, paths.checkpoints / "init")
    warm_start(cfg, model, tok, splits)
    results: dict[str, dict[str, Any]] = {}
    for mode in modes:
        t0 = time.perf_counter()
        m = copy.deepcopy(model)
        if mode != "warm_start_only":
            mcfg = copy.deepcopy(cfg)
            mcfg.rollout.mode = mode  # type: ignore[assignment]
            mpaths = RunPaths(out / mode, str(out / mode))
            logger = MetricsLogger(out / mode, tensorboard=False)
            m, _, _ = rl_stage(mcfg, mpaths, m, tok, splits, logger, None)
            logger.close()
        res = evaluate_model(m, tok, cfg, splits.test, mode).metrics
        results[mode] = {k: getattr(res, k) for k in METRICS} | {
            "seconds": time.perf_counter() - t0
        }
        print(json.dumps({"seed": seed, "mode": mode, **results[mode]}), flush=True)
    return results


def table(all_results: list[dict[str, dict[str, Any]]], modes: list[str]) -> str:
    lines = [
        "| mode | " + " | ".join(METRICS) + " | mode wall s (RL + eval) |",
        "|---|" + "---|" * (len(METRICS) + 1),
    ]
    for mode in modes:
        cells = []
        for k in (*METRICS, "seconds"):
            xs = [r[mode][k] for r in all_results if r[mode].get(k) is not None]
            cells.append(_mean_std([float(x) for x in xs]))
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(all_results: list[dict[str, dict[str, Any]]], modes: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=120)
    for i, mode in enumerate(modes):
        xs = [r[mode]["success_rate"] or 0.0 for r in all_results]
        ax.bar(i, statistics.mean(xs), yerr=statistics.stdev(xs) if len(xs) > 1 else 0, capsize=4)
        ax.scatter([i] * len(xs), xs, color="k", s=10, zorder=3)
    ax.set_xticks(range(len(modes)), modes)
    ax.set_ylabel("held-out success rate")
    ax.set_title("Training modes, same warm start and budget")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", default="configs/local.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--out", type=Path, default=Path("runs/bench-learning"))
    p.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    p.add_argument("--label", default="CPU, 2 cores (CI machine kind)")
    args = p.parse_args(argv)
    base = load_config(args.config, args.overrides)
    results = [run_seed(base, s, args.out / f"seed{s}", args.modes) for s in args.seeds]
    md = table(results, args.modes)
    png = args.doc.parent / "img" / "learning.png"
    plot(results, args.modes, png)
    cmd = "python bench/learning.py " + " ".join(sys.argv[1:] if argv is None else argv)
    section = (
        f"\n## Learning benchmark — {dt.date.today().isoformat()}, {args.label}\n\n"
        f"Command: `{cmd}` (config `{args.config}`, seeds {args.seeds}); machine: "
        f"{platform.machine()}, {platform.python_version()}.\n\n{md}\n\n![learning]({png.relative_to(args.doc.parent)})\n"
    )
    print(md)
    with args.doc.open("a", encoding="utf-8") as f:
        f.write(section)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
