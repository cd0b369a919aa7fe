"""The controlled study of world rehearsal: one warm start per seed, then each RL mode from it.

For every seed: generate the tasks, load the model, warm-start it once (the checkpoint is kept
and reused by a rerun), then, from that same checkpoint and with the same tasks, budget and
evaluation, run one cell per mode —
  warm_start  no RL at all,
  rehearsal   RL where the policy writes every tool result, shared weights (the method),
  noshare     the same with one model per role (algo.sharing: noshare),
  external    RL against a frozen simulator: the warm-started model itself, served behind the
              external mode (the environment-scaling baseline),
  real        RL in the real worlds (upper bound),
and the levers of issue 16's item 5 (`LEVERS`: the method with one setting changed) —
  fidelity_reward  simulator rows scored by their field fidelity against the real worlds of the
                   training tasks alone (`algo.simulator_reward: fidelity`),
  mixed_reward     simulator rows scored by the mean of task reward and fidelity,
  mask_sim_errors  caller rows of episodes a malformed rehearsal ended masked, not scored
                   (`algo.mask_sim_errors`; configs/local.yaml's default since 2026-12-07, so
                   from that base `rehearsal` masks too),
  unmasked         the method without that masking (`algo.mask_sim_errors: false`: the cells
                   recorded before 2026-12-07 ran the method so),
  masked_t07       masking with both roles sampled at temperature 0.7 in the RL rollouts,
  high_lr          `train.lr: 1e-4` (configs/local.yaml's default since 2026-12-05; the cells
                   recorded before ran the method at 2e-5: rerun them with --set train.lr=2e-5),
  high_lr_ppo2     high_lr with two optimizer passes over each rollout (`train.ppo_epochs: 2`),
  high_lr_group8   high_lr with GRPO groups of 8 rollouts of 2 tasks an iteration (not 4 of 4:
                   the same 16 episodes, more of them to compare within a group),
  high_lr_echo     high_lr with ECHO's auxiliary loss on the caller's observation tokens
                   (`algo.env_loss_coef: 0.1`),
  high_lr_mini4    high_lr with four optimizer steps an iteration, one per task of the rollout
                   (`train.ppo_mini_batches: 4`: 4x the steps of the same episodes),
  lr3e-4           `train.lr: 3e-4`: a 3x larger step instead of more steps,
  high_lr_batch16  high_lr with 16 tasks x 4 rollouts an iteration (`rollout.batch_tasks: 16`):
                   4x the episodes behind each of the same 3 steps,
  lora_r16         RL through LoRA adapters (`train.trainable: lora`, r 16, every projection)
                   on the warm start's weights, lr 5e-4,
  long12           12 RL iterations instead of 3 (4x the episodes, 4x the steps), the
                   validation score every 3 (`validation_curve`); real_long12: the same in
                   the real worlds (rollout.mode real: the upper bound's curve), and that
                   with a token-mean loss (real_long12_token_mean),
and test-time private rehearsal (`parallel:4`) on the warm_start and rehearsal policies. Every
cell is evaluated by committed execution on the held-out tasks in the real worlds (success,
per-turn score, valid-call rate, rehearsal fidelity exact and field where the policy
rehearses, wall time).

Each finished cell is written to the results file at once (atomically), and a rerun skips the
cells already there, so the study can be run in several sittings:

    python bench/learning.py --seeds 0 1 2                       # the whole study
    python bench/learning.py --seeds 0 --modes warm_start rehearsal --no-test-time
    python bench/learning.py --validation 8 --modes warm_start rehearsal high_lr --results R.json

`--validation K` holds the last K training tasks out of the warm start and RL and scores every
cell on them as well (success, per-turn score, valid calls): settings such as the lr are chosen
by that score, and the held-out split only reports the chosen one.

Cells can also run side by side in several processes (one GPU holds many copies of a small
model), each with its own `--results` file, joined afterwards with `--merge A.json B.json ...`
(bench/device_study.sh does this on a lent GPU). A later sitting in a fresh run folder (the
kept policies gone) can re-run a seed's cells as a check and add its test-time cells into a copy
of the file; `--merge` keeps a cell two files hold when only its timings differ (the same warm
start reproduced it) and refuses it otherwise.

Each cell keeps its committed held-out episodes in `OUT/seed{s}/episodes/{kind}-{name}/`
(`trajectories.jsonl`; a test-time cell also `notes.json`, the rehearsal notes each task's turns
acted on, and records `notes_markup`: the share of notes written as tool calls or tool results
rather than notes), and each RL cell its training episodes (`train.save_rollouts`).

`--report` (also done after every run) writes the table (mean ± std over seeds) and the PNG
into docs/benchmarks.md from the results file alone.
`--curves PNG` plots the validation curves of the cells that scored their policy during RL
(`train.eval_every` with `--validation`, e.g. the long12 levers), from the results file alone.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime as dt
import hashlib
import json
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from envace.config import Config, config_from_mapping, load_config
from envace.report import cpu_model
from envace.storage.manifest import MANIFEST_NAME, Manifest
from envace.tasks.io import atomic_write_text

# the warm start's stats beside its checkpoint (timings: not part of its identity)
WARM_START_STATS = "warm_start.json"
MODES = ("warm_start", "rehearsal", "noshare", "external", "real")
# the budget itself: 4x the iterations (12 of 16 episodes, new episodes each), scored on the
# validation tasks every 3 (long12); the same in the real worlds (real_long12, the upper bound's
# curve): does RL move the policy with more data, and does rehearsal follow where real RL goes?
_LONG12 = ("train.iterations=12", "train.eval_every=3", "train.save_every=12")
# lever cells of issue 16's item 5: the method (rehearsal, shared weights) with these overrides
LEVERS: dict[str, tuple[str, ...]] = {
    "fidelity_reward": ("algo.simulator_reward=fidelity",),
    "mixed_reward": ("algo.simulator_reward=mixed",),
    "mask_sim_errors": ("algo.mask_sim_errors=true",),
    # the method without masking, from a base that masks (configs/local.yaml since 2026-12-07)
    "unmasked": ("algo.mask_sim_errors=false",),
    # masking with both roles sampled at 0.7 instead of 1 in the RL rollouts (and their
    # log-probs taken at 0.7 in the update): fewer malformed rehearsals and garbage calls
    # from the tail of a 135 M model's distribution, samples closer to the greedy policy the
    # evaluation runs; fewer distinct rollouts per group. 0.7 untuned
    "masked_t07": ("algo.mask_sim_errors=true", "rollout.temperature=0.7"),
    # masking with only the caller's rows trained: the simulator role still rehearses every
    # tool result, but its rows (scored by the task's success, not by faithfulness) take no
    # gradient. Is the simulator rows' update what makes the shared weights' rehearsals slip
    # after the first iteration (more malformed results, lower fidelity)?
    "masked_caller": ("algo.mask_sim_errors=true", "algo.train_roles=caller"),
    # a control, not a lever: the method's iterations with a step far below a float32 weight's
    # precision (lr 1e-12; the config needs lr > 0), so every iteration rolls out the warm start
    # itself on that iteration's tasks: do the rehearsals of iteration 2 slip because of the
    # first update, or because iteration 2's tasks are harder? (its evaluation must equal the
    # warm start's)
    "no_step": ("train.lr=1e-12",),
    "high_lr": ("train.lr=1e-4",),
    # high_lr (chosen on validation tasks, 2026-12-04) with more optimizer steps per rollout,
    # or with larger GRPO groups of the same 16 episodes an iteration
    "high_lr_ppo2": ("train.lr=1e-4", "train.ppo_epochs=2"),
    "high_lr_group8": ("train.lr=1e-4", "rollout.n=8", "rollout.batch_tasks=2"),
    # high_lr with ECHO's observation loss (lambda 0.1: the paper's "small" weight, untuned)
    "high_lr_echo": ("train.lr=1e-4", "algo.env_loss_coef=0.1"),
    # more optimizer steps from the same rollouts: 4 mini-batches of one task each per
    # iteration (verl's ppo_mini_batch_size), or a 3x larger step size
    "high_lr_mini4": ("train.lr=1e-4", "train.ppo_mini_batches=4"),
    "lr3e-4": ("train.lr=3e-4",),
    # 4x the episodes per optimizer step (16 tasks x 4 rollouts an iteration, same groups, same
    # 3 steps): a less noisy gradient rather than more or larger steps from a noisy one
    "high_lr_batch16": ("train.lr=1e-4", "rollout.batch_tasks=16"),
    # RL through LoRA adapters (r 16 on every projection of all 30 layers: 4.9 M trained
    # values, not the top 12 layers' 42.5 M) on the same warm start: noise spread over fewer
    # directions. LoRA's step is ~5x smaller than a full weight's at the same lr (B is ±lr
    # after a sign step, times a random A), so its lr is 5x the method's ("LoRA without regret",
    # Schulman et al. 2025, found LoRA's RL optimum near 10x full fine-tuning's)
    "lora_r16": ("train.trainable=lora", "train.top_layers=null", "train.lr=5e-4"),
    "long12": _LONG12,
    "real_long12": ("rollout.mode=real", *_LONG12),
    # why real_long12 collapses into "Done." answers: the per-row loss mean gives a 3-token
    # answer the push of a 40-token call; token-mean weighs every token alike
    "real_long12_token_mean": ("rollout.mode=real", *_LONG12, "algo.loss_agg_mode=token-mean"),
    # rehearsed turns graded against the world the rehearsal showed the caller (expected ids
    # and facts translated through the task's logged results), not against the real values a
    # faithful caller could not have seen: bench/reward_bias.py measures that bias
    "shown_world": ("algo.rehearsal_grading=shown_world",),
}
CELL_MODES = (*MODES, *LEVERS)
TEST_TIME = ("warm_start", "rehearsal")  # policies also measured with parallel:4
REHEARSAL = "parallel:4"
# what a cell records of its validation score (--validation), and from which metric
VALIDATION_KEYS = {
    "success": "success_rate",
    "per_turn_score": "per_turn_score",
    "valid_call_rate": "valid_call_rate",
}
SECTION = "## Learning study (bench/learning.py)"


# --- the cells ------------------------------------------------------------------------------------
def mode_config(base: Config, mode: str) -> Config:
    """The RL settings of a mode (warm_start: the base config, no RL)."""
    cfg = copy.deepcopy(base)
    if mode == "noshare":
        cfg.rollout.mode, cfg.algo.sharing = "rehearsal", "noshare"
    elif mode in LEVERS:
        sets = ("rollout.mode=rehearsal", "algo.sharing=share", *LEVERS[mode])
        return config_from_mapping(cfg.to_dict(), f"lever {mode}", sets)
    elif mode in ("rehearsal", "external", "real"):
        cfg.rollout.mode = mode  # type: ignore[assignment]
    if mode == "external":
        # The frozen simulator is the warm-started policy itself (run.py's default).
        cfg.rollout.external_model = cfg.rollout.external_endpoint = None
    return cfg


def metrics_record(metrics: Any, seconds: float) -> dict[str, Any]:
    m = metrics.to_dict()
    return {
        "success": m["success_rate"],
        "per_turn_score": m["per_turn_score"],
        "valid_call_rate": m["valid_call_rate"],
        "fidelity_exact": m["rehearsal_fidelity"],
        "fidelity_field": m["rehearsal_field_fidelity"],
        "seconds": round(seconds, 1),
        "metrics": m,
    }


class Study:
    """Cells of one seed, sharing its tasks and warm start (loaded lazily, once)."""

    def __init__(self, base: Config, seed: int, out: Path, validation: int = 0) -> None:
        self.cfg = copy.deepcopy(base)
        self.cfg.seed = self.cfg.tasks.seed = self.cfg.train.seed = seed
        self.seed = seed
        self.out = out
        # the last `validation` training tasks: held out of the warm start and RL, scored per
        # cell so that settings (lr, ...) are chosen there and never on the held-out split
        self.validation = validation
        self.val: list[Any] = []
        self.curve: list[dict[str, Any]] = []  # the last policy_model's validation points
        self._warm: tuple[Any, Any, Any] | None = None

    def warm(self) -> tuple[Any, Any, Any]:
        """(model, tokenizer, splits) after the warm start; the checkpoint is reused."""
        if self._warm is not None:
            return self._warm
        from envace.policy.hf_backend import load_model_and_tokenizer
        from envace.run import RunPaths, init_model, load_splits, prepare_tasks, warm_start
        from envace.storage.artifacts import verify
        from envace.storage.errors import ArtifactIntegrityError, ArtifactNotFoundError

        paths = RunPaths(self.out, str(self.out))
        ckpt = paths.checkpoints / "warm_start"
        try:
            verify(str(paths.tasks))
            verify(str(ckpt))
            kept = json.loads((ckpt / WARM_START_STATS).read_text()).get("validation_tasks", 0)
            if kept != self.validation:
                raise SystemExit(
                    f"{ckpt}: this warm start was trained with {kept} training task(s) held out"
                    f" for validation, not {self.validation}; give another --out"
                )
            splits = self._carve(load_splits(paths.tasks))
            model, tok = load_model_and_tokenizer(
                ckpt, self.cfg.model.dtype, device=self.cfg.model.device
            )
        except (ArtifactIntegrityError, ArtifactNotFoundError):
            prepare_tasks(self.cfg, paths)
            splits = load_splits(paths.tasks)
            splits = self._carve(splits)
            model, tok = init_model(self.cfg, splits, paths.checkpoints / "init")
            t0 = time.perf_counter()
            stats = warm_start(self.cfg, model, tok, splits)
            stats["seconds"] = round(time.perf_counter() - t0, 1)
            stats["validation_tasks"] = self.validation
            from envace.train.engine import TorchEngine

            TorchEngine(model, 1.0).save_model(ckpt, tok)
            atomic_write_text(ckpt / WARM_START_STATS, json.dumps(stats))
            paths.commit(ckpt)
        self._warm = (model, tok, splits)
        return self._warm

    def _carve(self, splits: Any) -> Any:
        """`splits` less the validation tasks (kept in `self.val`), which nothing trains on."""
        from envace.run import TaskSplits

        k = self.validation
        if k == 0:
            return splits
        if k >= len(splits.train):
            raise SystemExit(
                f"--validation {k} leaves no training task of {len(splits.train)}: use fewer,"
                " or more tasks (--set tasks.n_train=...)"
            )
        self.val = splits.train[-k:]
        return TaskSplits(splits.train[:-k], splits.test, splits.gold)

    def warm_start_stats(self) -> dict[str, Any]:
        path = self.out / "checkpoints" / "warm_start" / WARM_START_STATS
        return json.loads(path.read_text()) if path.is_file() else {}

    def warm_start_id(self) -> str:
        """The warm-start checkpoint's identity: a digest of its manifest's file names and hashes,
        less `warm_start.json` (the stats, whose timings differ run to run), so two sittings
        whose warm starts trained to the same weights share it."""
        self.warm()
        return warm_start_id(self.out / "checkpoints" / "warm_start")

    def policy_model(self, mode: str) -> tuple[Any, float]:
        """The model a mode ends with (RL from the warm start) and the RL seconds. With
        validation tasks and a mode's `train.eval_every`, the policy is also scored on them every
        that many iterations (`self.curve`; the seconds exclude it)."""
        model, tok, splits = self.warm()
        m = copy.deepcopy(model)
        self.curve = []
        if mode == "warm_start":
            return m, 0.0
        from envace.run import RunContext, RunPaths, rl_stage
        from envace.train.tracking import MetricsLogger

        cfg = mode_config(self.cfg, mode)
        cfg.train.save_rollouts = True  # the cell's training episodes, kept for a diagnosis
        folder = self.out / mode
        logger = MetricsLogger(folder, tensorboard=False)
        every, scoring_s = cfg.train.eval_every, 0.0

        def score(policy: Any) -> float:
            nonlocal scoring_s
            t = time.perf_counter()
            point = {"iteration": every * (len(self.curve) + 1), **self.validate(policy)}
            self.curve.append(point)
            scoring_s += time.perf_counter() - t
            return float(point["success"])

        t0 = time.perf_counter()
        try:
            ctx = RunContext(cfg, RunPaths(folder, str(folder)), splits, m, tok)
            m, _, _ = rl_stage(ctx, logger, score if self.validation and every else None)
        finally:
            logger.close()
        return m, time.perf_counter() - t0 - scoring_s

    def validate(self, model: Any) -> dict[str, Any]:
        """The model's greedy score on the validation tasks (no fidelity probes: cheaper)."""
        from envace.run import evaluate_model

        _, tok, _ = self.warm()
        cfg = copy.deepcopy(self.cfg)
        cfg.eval.probe_fidelity, cfg.eval.max_tasks = False, None
        m = evaluate_model(model, tok, cfg, self.val, "validation").metrics.to_dict()
        return {k: m[v] for k, v in VALIDATION_KEYS.items()}

    def evaluate(self, model: Any, rehearsal: str | None = None) -> tuple[Any, Any, float]:
        """(EvalResult, RehearsalOutcome or None without `rehearsal`, seconds) on the held-out
        tasks."""
        from envace.evaluate.benchmarks import rehearse_synthetic
        from envace.evaluate.rehearsal import parse_rehearsal
        from envace.rollout.engine import RolloutConfig
        from envace.run import evaluate_model, model_policy

        _, tok, splits = self.warm()
        cfg = self.cfg
        tasks = list(splits.test[: cfg.eval.max_tasks] if cfg.eval.max_tasks else splits.test)
        t0 = time.perf_counter()
        outcome = None
        if rehearsal is None:
            result = evaluate_model(model, tok, cfg, tasks, "study")
        else:
            outcome, result = rehearse_synthetic(
                model_policy(model, tok, cfg, trainable=False),
                tasks,
                RolloutConfig.from_config(cfg, eval_mode=True),
                parse_rehearsal(rehearsal),
                probe_fidelity=cfg.eval.probe_fidelity,
                n=cfg.eval.n,
                seed=self.seed,
                progress=True,
            )
        return result, outcome, time.perf_counter() - t0

    def keep_episodes(self, kind: str, name: str, result: Any, outcome: Any) -> dict[str, Any]:
        """An evaluation's committed episodes, and with private rehearsal (`outcome`) the notes
        each task's turns were given, kept beside the run (`episodes/{kind}-{name}/`) for a
        diagnosis; returns the notes' figures for the cell (none without rehearsal)."""
        from envace.evaluate.report import write_trajectories

        folder = self.out / "episodes" / f"{kind}-{name}"
        write_trajectories(result.trajectories, folder / "trajectories.jsonl")
        if outcome is None:
            return {}
        notes = {tid: [w.text for w in rec.writes] for tid, rec in outcome.tasks.items()}
        atomic_write_text(folder / "notes.json", json.dumps(notes, indent=1) + "\n")
        return {"notes_markup": notes_markup([n for ns in notes.values() for n in ns])}


def notes_markup(notes: list[str]) -> float | None:
    """The share of rehearsal notes that are role output — a tool call or an imagined tool
    result in the policy's own markup (envace.policy.parsing) — instead of the prose notes the
    memory prompt asks for; None without notes."""
    if not notes:
        return None
    return sum("<tool_call>" in n or "<execution_result>" in n for n in notes) / len(notes)


def warm_start_id(ckpt: Path) -> str:
    path = ckpt / MANIFEST_NAME
    manifest = Manifest.from_json(path.read_bytes(), str(path))
    kept = sorted((e.path, e.sha256) for e in manifest.files if e.path != WARM_START_STATS)
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()[:12]


# --- the results file ---------------------------------------------------------------------------
def load_results(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {"cells": {}}
    data: dict[str, Any] = json.loads(path.read_text())
    data.setdefault("cells", {})
    return data


def cell_key(kind: str, name: str, seed: int) -> str:
    return f"{kind}/{name}/seed{seed}"


def summarize(data: dict[str, Any], seeds: list[int]) -> dict[str, Any]:
    """The study's headline shape, per seed in `seeds` (null where a cell has not run)."""
    cells = data["cells"]

    def col(kind: str, name: str, key: str) -> list[Any]:
        return [cells.get(cell_key(kind, name, s), {}).get(key) for s in seeds]

    data["seeds"] = seeds
    data["modes"] = {
        m: {"success": col("mode", m, "success"), "fidelity": col("mode", m, "fidelity_field")}
        for m in CELL_MODES
        if m in MODES or any(cell_key("mode", m, s) in cells for s in seeds)
    }
    data["test_time"] = {
        p: {"plain": col("mode", p, "success"), "parallel4": col("test_time", p, "success")}
        for p in TEST_TIME
    }
    return data


# a cell's wall-clock figures: two sittings that reproduce a cell differ only in these
TIMING_KEYS = ("seconds", "rl_seconds", "eval_seconds")


def same_cell(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two records are one cell's result: equal but for their timings (a sitting that
    re-ran the cell from the same warm start, e.g. as a check before its test-time cells)."""

    def drop(rec: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in rec.items() if k not in TIMING_KEYS}

    return drop(a) == drop(b)


def merge_results(paths: list[Path], seeds: list[int]) -> dict[str, Any]:
    """One results file from several (processes that ran disjoint cells side by side, e.g. on
    one GPU, or a later sitting that re-ran some cells and added others): their cells and warm
    starts together, the first file's record where two hold one (with its timings). They must
    share the model, config, dtype and validation split, and a cell two files both hold must be
    the same result (`same_cell`)."""
    merged: dict[str, Any] = {"cells": {}}
    for path in paths:
        data = load_results(path)
        data.setdefault("validation_tasks", 0)  # the validation split's size (0: none)
        for key in ("model", "config", "dtype", "validation_tasks"):
            if key in merged and key in data and merged[key] != data[key]:
                diff = first_difference(merged[key], data[key], None) if key == "config" else ""
                raise SystemExit(f"{path}: its {key} differs from the files before it ({diff})")
            if key in data:
                merged.setdefault(key, data[key])
        for key, rec in data["cells"].items():
            if not same_cell(merged["cells"].setdefault(key, rec), rec):
                raise SystemExit(
                    f"{path}: cell {key} differs from the one another file holds (beyond its"
                    f" timings {', '.join(TIMING_KEYS)}): two results of one cell cannot both be"
                    " kept; merge files of one warm start and budget, or drop one of the cells"
                )
        for seed, stats in data.get("warm_start", {}).items():
            merged.setdefault("warm_start", {}).setdefault(seed, stats)
        for wid, stats in data.get("warm_starts", {}).items():
            merged.setdefault("warm_starts", {}).setdefault(wid, stats)
    return summarize(merged, seeds)


def headline_seeds(data: dict[str, Any], seeds: list[int]) -> list[int]:
    """The seeds of a results file's headline: this run's and the file's own, so a sitting that
    runs some seeds into a file does not drop the others from its per-seed arrays."""
    return sorted({*seeds, *data.get("seeds", [])})


def save(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")


def run_cells(
    base: Config,
    seeds: list[int],
    modes: list[str],
    test_time: bool,
    out: Path,
    results: Path,
    on_cell: Callable[[str, dict[str, Any]], None] = lambda key, rec: None,
    validation: int = 0,
) -> dict[str, Any]:
    data = load_results(results)
    shown = headline_seeds(data, seeds)
    todo = [(s, "mode", m) for s in seeds for m in modes]
    if test_time:
        todo += [(s, "test_time", p) for s in seeds for p in TEST_TIME if p in modes]
    todo.sort(key=lambda item: item[0])  # one seed's cells together: one warm start loaded
    pending = [t for t in todo if cell_key(t[1], t[2], t[0]) not in data["cells"]]
    skipped = len(todo) - len(pending)
    if skipped:
        print(f"{skipped} finished cell(s) in {results}: skipped", flush=True)
    studies: dict[int, Study] = {}
    for seed, kind, name in tqdm(pending, desc="study cells", unit="cell"):
        study = studies.setdefault(seed, Study(base, seed, out / f"seed{seed}", validation))
        t0 = time.perf_counter()
        if kind == "mode":
            model, rl_s = study.policy_model(name)
            result, outcome, eval_s = study.evaluate(model)
        else:  # the mode's trained policy, kept by its cell, with private rehearsal first
            model = load_trained(study, name)
            rl_s = 0.0
            result, outcome, eval_s = study.evaluate(model, REHEARSAL)
        rec = metrics_record(result.metrics, time.perf_counter() - t0)
        rec |= {
            "rl_seconds": round(rl_s, 1),
            "eval_seconds": round(eval_s, 1),
            "warm_start_id": study.warm_start_id(),
            # bf16 kernels differ across CPU models: one seed's warm start too (its id says)
            "cpu": cpu_model(),
        }
        rec |= study.keep_episodes(kind, name, result, outcome)
        if kind == "mode" and validation:
            rec["validation"] = study.validate(model)
            if study.curve:  # the validation score every train.eval_every RL iterations
                rec["validation_curve"] = study.curve
        if kind == "mode" and name != "warm_start":
            save_trained(study, name, model)
        key = cell_key(kind, name, seed)
        data["cells"][key] = rec
        stats = study.warm_start_stats() | {"seed": seed}
        # the first sitting's per-seed figures stay; every warm start is kept by its id
        data.setdefault("warm_start", {}).setdefault(str(seed), stats)
        data.setdefault("warm_starts", {})[rec["warm_start_id"]] = stats
        save(results, summarize(data, shown))
        on_cell(key, rec)
        print(json.dumps({"cell": key, **{k: v for k, v in rec.items() if k != "metrics"}}))
    return summarize(data, shown)


def _trained_dir(study: Study, mode: str) -> Path:
    return study.out / mode / "policy"


def save_trained(study: Study, mode: str, model: Any) -> None:
    """Keep the mode's trained policy, so its test-time cell can run in a later sitting."""
    from envace.storage.artifacts import commit_dir
    from envace.train.engine import TorchEngine

    _, tok, _ = study.warm()
    folder = _trained_dir(study, mode)
    TorchEngine(model, 1.0).save_model(folder, tok)
    commit_dir(folder, str(folder))


def load_trained(study: Study, mode: str) -> Any:
    from envace.policy.hf_backend import load_model_and_tokenizer

    if mode == "warm_start":
        return copy.deepcopy(study.warm()[0])
    folder = _trained_dir(study, mode)
    if not (folder / "MANIFEST.json").is_file():
        # The mode's cell ran in another run folder (an earlier sitting on another machine):
        # train the policy again, from the same warm start, seed and budget, and keep it.
        print(f"{folder}: no kept {mode} policy; training it again for its test-time cell")
        model, _ = study.policy_model(mode)
        save_trained(study, mode, model)
        return model
    model, _ = load_model_and_tokenizer(
        folder, study.cfg.model.dtype, device=study.cfg.model.device
    )
    return model


# --- the report ---------------------------------------------------------------------------------
def mean_std(xs: list[Any]) -> str:
    vals = [float(x) for x in xs if x is not None]
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return f"{vals[0]:.3f} (1 seed)"
    return f"{statistics.mean(vals):.3f} ± {statistics.stdev(vals):.3f} ({len(vals)})"


def _value(rec: dict[str, Any] | None, key: str) -> Any:
    """A cell's figure for the table (`validation`: its validation success)."""
    if not rec:
        return None
    if key == "validation":
        return (rec.get("validation") or {}).get("success")
    return rec.get(key)


def table(data: dict[str, Any]) -> str:
    cells, seeds = data["cells"], data["seeds"]
    keys: tuple[tuple[str, str], ...] = (
        ("success", "success"),
        ("per_turn_score", "per-turn score"),
        ("valid_call_rate", "valid calls"),
        ("fidelity_exact", "fidelity exact"),
        ("fidelity_field", "fidelity field"),
        ("seconds", "wall s (RL + eval)"),
    )
    if any("validation" in r for r in cells.values()):
        keys = (*keys, ("validation", "validation success"))
    lines = [
        "| cell | " + " | ".join(label for _, label in keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    rows = [("mode", m, m) for m in CELL_MODES] + [
        ("test_time", p, f"{p} + {REHEARSAL}") for p in TEST_TIME
    ]
    for kind, name, label in rows:
        recs = [cells.get(cell_key(kind, name, s)) for s in seeds]
        if not any(recs):
            continue
        vals = [mean_std([_value(r, k) for r in recs]) for k, _ in keys]
        lines.append(f"| {label} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def warm_start_note(data: dict[str, Any]) -> str:
    """Which cells of a seed came from which warm start, where a seed's cells had several."""
    lines = []
    for seed in data["seeds"]:
        groups: dict[str, list[str]] = {}
        for key, rec in sorted(data["cells"].items()):
            if key.endswith(f"/seed{seed}"):
                wid = rec.get("warm_start_id") or "unrecorded (before warm starts were recorded)"
                groups.setdefault(wid, []).append(key.removesuffix(f"/seed{seed}"))
        if len(groups) > 1:
            parts = "; ".join(f"{wid}: {', '.join(keys)}" for wid, keys in groups.items())
            lines.append(f"- seed {seed}, {len(groups)} warm starts — {parts}")
    if not lines:
        return ""
    return (
        "Cells from different warm starts of one seed (trained again in another sitting) compare"
        " only up to the warm starts' own difference:\n" + "\n".join(lines) + "\n\n"
    )


def plot(data: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells, seeds = data["cells"], data["seeds"]
    ran = [m for m in LEVERS if any(cell_key("mode", m, s) in cells for s in seeds)]
    labels = [*MODES, *ran, *(f"{p}\n+{REHEARSAL}" for p in TEST_TIME)]
    keys = [("mode", m) for m in (*MODES, *ran)] + [("test_time", p) for p in TEST_TIME]
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=120)
    for i, (kind, name) in enumerate(keys):
        xs = [
            cells[cell_key(kind, name, s)]["success"] or 0.0
            for s in seeds
            if cell_key(kind, name, s) in cells
        ]
        if not xs:
            continue
        sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
        ax.bar(i, statistics.mean(xs), yerr=sd, capsize=4, color="C0" if kind == "mode" else "C1")
        ax.scatter([i] * len(xs), xs, color="k", s=10, zorder=3)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("held-out success")
    ax.set_ylim(0, 1)
    ax.set_title(f"{data.get('model', '')}: same warm start, tasks, budget and evaluation")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot_curves(data: dict[str, Any], path: Path) -> None:
    """Validation success over RL iterations of every cell with a `validation_curve`
    (`train.eval_every` with `--validation`): one line per mode and seed, starting at the
    seed's warm start (iteration 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = data["cells"]
    curves = sorted(k for k, c in cells.items() if c.get("validation_curve"))
    if not curves:
        raise SystemExit("no cell of the results file has a validation curve to plot")
    modes = sorted({k.split("/")[1] for k in curves})
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=120)
    for key in curves:
        _, mode, seed = key.split("/")
        n = int(seed.removeprefix("seed"))
        warm = cells.get(cell_key("mode", "warm_start", n), {}).get("validation", {})
        points = [(0, warm["success"])] if "success" in warm else []
        points += [(p["iteration"], p["success"]) for p in cells[key]["validation_curve"]]
        xs, ys = zip(*points, strict=True)
        color = f"C{modes.index(mode)}"
        style = ("-", "--", ":", "-.")[n % 4]  # seeds apart
        ax.plot(xs, ys, marker="o", ls=style, color=color, label=f"{mode} {seed}", alpha=0.85)
    ax.set_xlabel("RL iteration (0: the warm start)")
    ax.set_ylabel("validation success")
    ax.set_ylim(-0.02, 1)
    ax.legend(fontsize=7)
    ax.set_title(f"{data.get('model', '')}: validation success during RL")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


GENERATED_END = "<!-- end of bench/learning.py's table; text below is kept on rewrites -->"


def write_report(data: dict[str, Any], doc: Path, command: str, label: str, results: Path) -> None:
    """Replace the study's table and plot in `doc` (or append the section), keeping what was
    written by hand below them (after `GENERATED_END`) in the section."""
    png = doc.parent / "img" / "learning-study.png"
    plot(data, png)
    section = (
        f"{SECTION}\n\n"
        f"Updated {dt.date.today().isoformat()}; machine: {label} ({platform.machine()}, "
        f"Python {platform.python_version()}); model {data.get('model')}; seeds "
        f"{data['seeds']}. Command: `{command}`. Mean ± std over the seeds that ran (count in "
        f"brackets); raw per-seed values in `{results.as_posix()}`.\n\n"
        f"{table(data)}\n\n{warm_start_note(data)}![learning study]({png.relative_to(doc.parent).as_posix()})\n"
        f"{GENERATED_END}\n"
    )
    text = doc.read_text(encoding="utf-8") if doc.is_file() else "# Benchmarks\n"
    start = text.find(SECTION)
    if start >= 0:
        end = text.find("\n## ", start + len(SECTION))
        end = len(text) if end < 0 else end + 1
        kept = text.find(GENERATED_END, start, end)
        if kept >= 0:  # the hand-written text after the marker, up to the next section
            text = text[:start] + section + text[kept + len(GENERATED_END) + 1 :]
        else:
            text = text[:start] + section + "\n" + text[end:]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    atomic_write_text(doc, text)


# Fields added with a default that changed what earlier code did: a results file whose config
# lacks one ran with the value here (the float32 master weights of 2026-12-05: before them the
# torch engine stepped bf16 weights in place)
LEGACY_VALUES: dict[str, Any] = {"train.master_weights": False}


def first_difference(old: Any, new: Any, default: Any, path: str = "") -> str | None:
    """Where the config of a results file's cells and this run's differ, or None. A field the
    file's config lacks (added to the code since) counts only when set away from its default:
    at its default it changes nothing the earlier cells did — except the fields of
    `LEGACY_VALUES`, which count unless set to the value the earlier code had."""
    if isinstance(old, dict) and isinstance(new, dict):
        default = default if isinstance(default, dict) else {}
        for key in sorted(set(old) | set(new)):
            where = f"{path}.{key}".lstrip(".")
            if key not in old and where in LEGACY_VALUES:
                if new.get(key) != LEGACY_VALUES[where]:
                    return f"{where}: {LEGACY_VALUES[where]!r} there (before the field), {new.get(key)!r} now"
                continue
            if key not in old and key in default and new.get(key) == default[key]:
                continue
            diff = first_difference(old.get(key), new.get(key), default.get(key), where)
            if diff is not None:
                return diff
        return None
    return None if old == new else f"{path or '<root>'}: {old!r} there, {new!r} now"


def machine_dtype(cfg: Config) -> str:
    """What `model.dtype` resolves to on this machine (auto: bfloat16 or float32 by the CPU)."""
    from envace.policy.hf_backend import resolve_dtype

    return str(resolve_dtype(cfg.model.dtype)).removeprefix("torch.")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", default="configs/local.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=CELL_MODES)
    p.add_argument("--no-test-time", dest="test_time", action="store_false")
    p.add_argument("--out", type=Path, default=Path("runs/study"))
    p.add_argument("--results", type=Path, default=Path("bench/results/learning.json"))
    p.add_argument("--doc", type=Path, default=Path("docs/benchmarks.md"))
    p.add_argument("--label", default="CPU, 2 cores (the CI machine kind)")
    p.add_argument(
        "--validation",
        type=int,
        default=0,
        metavar="K",
        help="hold the last K training tasks out of the warm start and RL and score every cell"
        " on them too: choose settings there, never on the held-out split",
    )
    p.add_argument("--report", action="store_true", help="only rewrite the table and the plot")
    p.add_argument(
        "--curves",
        type=Path,
        metavar="PNG",
        help="only plot the validation curves of the cells in --results (train.eval_every)",
    )
    p.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        metavar="FILE",
        help="write the cells of these results files (studies run side by side) into --results",
    )
    args = p.parse_args(argv)
    base = load_config(args.config, args.overrides)
    command = "python bench/learning.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.curves:
        plot_curves(load_results(args.results), args.curves)
        return 0
    if args.merge:
        data = merge_results(args.merge, args.seeds)
        save(args.results, data)
    elif args.report:
        data = summarize(load_results(args.results), args.seeds)
        save(args.results, data)
    else:
        data = load_results(args.results)
        model = base.model.path or base.model.preset
        if data.get("model") not in (None, model):
            raise SystemExit(
                f"{args.results} holds cells of model {data['model']!r}, not {model!r}: give"
                " another --results file"
            )
        config = json.loads(json.dumps(dataclasses.asdict(base)))
        defaults = json.loads(json.dumps(dataclasses.asdict(Config())))
        diff = first_difference(data.get("config", config), config, defaults)
        if diff is not None:
            raise SystemExit(
                f"{args.results} holds cells run with another config ({diff}); a study compares"
                " cells of one budget: give another --results file (and --out)"
            )
        if data["cells"] and data.get("validation_tasks", 0) != args.validation:
            raise SystemExit(
                f"{args.results} holds cells with {data.get('validation_tasks', 0)} validation"
                f" task(s), not {args.validation}: their training sets differ; give another"
                " --results file (and --out)"
            )
        dtype = machine_dtype(base)
        if data.get("dtype") not in (None, dtype):
            raise SystemExit(
                f"{args.results} holds cells trained in {data['dtype']}, but model.dtype "
                f"{base.model.dtype!r} is {dtype} on this machine: their numbers would not "
                "compare; give another --results file (and --out), or run on a machine like theirs"
            )
        data |= {"model": model, "config": data.get("config", config), "dtype": dtype}
        if args.validation:
            data["validation_tasks"] = args.validation
        save(args.results, data)
        data = run_cells(
            base,
            args.seeds,
            args.modes,
            args.test_time,
            args.out,
            args.results,
            validation=args.validation,
        )
    write_report(data, args.doc, command, args.label, args.results)
    print(table(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
