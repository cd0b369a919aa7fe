"""Rollout benchmark: the full multi-turn rollout loop with and without prefix caching.

Runs the rollout engine as training and evaluation run it — parsing, the state machine, tool
execution or rehearsal included — over the same tasks with the same seeds, once per setting
of `rollout.prefix_cache`, and reports wall time, generated tokens per second, how many
prompt tokens were computed (the rest were copied from held prefixes), the decoder's phase
times, and whether the outputs were the same. Prints a table, writes JSON and a PNG.

    python bench/rollout.py --checkpoint runs/local/checkpoints/final --tasks-dir runs/local/tasks

Without --checkpoint the config's initial model is used, as `envace run` builds it: with
configs/local.yaml the pretrained SmolLM2, not trained on the tasks; with a tiny preset a model
built from scratch (random weights: episodes end early, so only the rollouts of a task share
prompts).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from envace.config import Config, load_config  # noqa: E402
from envace.report import text_table  # noqa: E402
from envace.rollout.engine import RolloutConfig, RolloutEngine  # noqa: E402
from envace.rollout.grading import TaskGrader  # noqa: E402
from envace.rollout.types import Trajectory  # noqa: E402
from envace.run import (  # noqa: E402
    RunPaths,
    init_model,
    load_splits,
    model_policy,
    prepare_tasks,
)

SETTINGS = ("off", "on")


def _model(cfg: Config, args: argparse.Namespace, out: Path) -> tuple[Any, Any, Any]:
    """(model, tokenizer, splits): the checkpoint and tasks given, or built from the config."""
    if args.tasks_dir is None:
        paths = RunPaths(out, str(out))
        prepare_tasks(cfg, paths)
        tasks_dir = paths.tasks
    else:
        tasks_dir = args.tasks_dir
    splits = load_splits(tasks_dir)
    if args.checkpoint is not None:
        from envace.policy.hf_backend import load_model_and_tokenizer

        model, tok = load_model_and_tokenizer(args.checkpoint)
    else:
        model, tok = init_model(cfg, splits, out / "init")
    return model, tok, splits


def _outputs(trajs: list[Trajectory]) -> list[list[int]]:
    return [row.response_ids for t in trajs for row in t.rows]


def run_once(
    cfg: Config, model: Any, tok: Any, tasks: list[Any], mode: str, setting: str, seed: int
) -> dict[str, Any]:
    """One rollout of `tasks` in `mode` (rehearsal: training's sampling; real: evaluation's
    greedy decoding in the real worlds) with prefix caching `setting`."""
    cfg.rollout.prefix_cache = setting == "on"
    policy = model_policy(model, tok, cfg)
    backend: Any = policy.backend
    decoder = backend.static
    if decoder is None:
        raise SystemExit("the static decoder is off (rollout.decode: generate): nothing to compare")
    decoder.profile = True
    rcfg = RolloutConfig.from_config(cfg, eval_mode=mode == "real")
    make_env = None
    n = cfg.rollout.n
    if mode == "real":
        from envace.evaluate.runner import make_task_environment

        rcfg, make_env, n = replace(rcfg, mode="real"), make_task_environment, 1
    engine = RolloutEngine(policy, rcfg, TaskGrader(), make_env=make_env)
    torch.manual_seed(seed)
    start = time.perf_counter()
    trajs = engine.run(tasks, n=n, progress=True, desc=f"{mode}, prefix cache {setting}")
    wall = time.perf_counter() - start
    generated = sum(len(ids) for ids in _outputs(trajs))
    return {
        "mode": mode,
        "prefix_cache": setting,
        "episodes": len(trajs),
        "generations": sum(len(t.rows) for t in trajs),
        "generated_tokens": generated,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(generated / wall, 1),
        **decoder.counts,
        **{k: round(v, 3) for k, v in decoder.timings.items()},
        "outputs": _outputs(trajs),
    }


def plot(rows: list[dict[str, Any]], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({r["mode"] for r in rows})
    fig, ax = plt.subplots(figsize=(6, 3.2))
    width = 0.38
    for k, setting in enumerate(SETTINGS):
        vals = [
            next(
                (
                    r["tokens_per_s"]
                    for r in rows
                    if r["mode"] == m and r["prefix_cache"] == setting
                ),
                0,
            )
            for m in modes
        ]
        ax.bar(
            [i + (k - 0.5) * width for i in range(len(modes))],
            vals,
            width,
            label=f"prefix cache {setting}",
        )
    names = {"real": "evaluation (real worlds)", "rehearsal": "training (rehearsal)"}
    ax.set_xticks(range(len(modes)), [names[m] for m in modes])
    ax.set_ylabel("generated tokens / s")
    ax.set_ylim(0, 1.3 * max(r["tokens_per_s"] for r in rows))
    ax.set_title("rollout loop, prefix cache off / on")
    ax.legend(ncol=2, loc="upper center")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", default="configs/local.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--checkpoint", type=Path, default=None, help="a Hugging Face checkpoint folder")
    p.add_argument("--tasks-dir", type=Path, default=None, help="train.jsonl (+ test.jsonl)")
    p.add_argument("--tasks", type=int, default=16, help="tasks per rollout")
    p.add_argument(
        "--modes", nargs="+", default=["rehearsal", "real"], choices=["rehearsal", "real"]
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/bench-rollout"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    cfg = load_config(args.config, args.overrides)
    args.out.mkdir(parents=True, exist_ok=True)
    model, tok, splits = _model(cfg, args, args.out)
    rows: list[dict[str, Any]] = []
    for mode in args.modes:
        tasks = (splits.test if mode == "real" and splits.test else splits.train)[: args.tasks]
        # one untimed pass first: allocator and kernel warm-up must not favour the second setting
        run_once(cfg, model, tok, tasks[:2], mode, "off", args.seed)
        for setting in SETTINGS:
            rows.append(run_once(cfg, model, tok, tasks, mode, setting, args.seed))
    for mode in args.modes:
        off, on = (
            next(r for r in rows if r["mode"] == mode and r["prefix_cache"] == s) for s in SETTINGS
        )
        same = sum(a == b for a, b in zip(off["outputs"], on["outputs"], strict=False))
        on["same_outputs"] = off["same_outputs"] = (
            f"{same} / {max(len(off['outputs']), len(on['outputs']))}"
        )
    report = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads",
        "torch": torch.__version__,
        "command": " ".join(
            ["python", "bench/rollout.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "checkpoint": str(args.checkpoint) if args.checkpoint else "random init",
        "results": [{k: v for k, v in r.items() if k != "outputs"} for r in rows],
    }
    (args.out / "bench-rollout.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(rows, args.out / "rollout.png")
    print(
        text_table(
            [
                "rollout",
                "prefix cache",
                "generations",
                "tokens",
                "wall s",
                "tokens/s",
                "prompt tokens computed",
                "prefill s",
                "steps s",
                "same outputs",
            ],
            [
                (
                    r["mode"],
                    r["prefix_cache"],
                    r["generations"],
                    r["generated_tokens"],
                    r["wall_s"],
                    r["tokens_per_s"],
                    f"{r['computed_tokens']} / {r['prompt_tokens']}",
                    r["prefill_s"],
                    r["steps_s"],
                    r["same_outputs"],
                )
                for r in rows
            ],
        )
    )
    print(f"\n{report['machine']}, {report['date']}; JSON + PNG: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
