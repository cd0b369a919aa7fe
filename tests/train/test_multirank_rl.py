"""Data-parallel RL: 2 real DeepSpeed ranks over gloo (torchrun; no GPU, no test double) run
`RLTrainer.collect` and `RLTrainer.update` under ZeRO-2 and ZeRO-3, against one process with
the torch engine on the same rows.

What must hold: each rank rolls out its share of the tasks (ZeRO-3: with the weights gathered,
each rank generating on its own) and every rank ends up with the same global rows; the update
splits the rows unevenly (6 rows, one trajectory's 2 caller turns packed into one sequence: 5
sequences over 2 ranks, 2 micro-batches vs 1 + a zero-weight filler) and still gives exactly
the one-process losses, gradient norm and weights, ECHO's observation loss included. This file
is also the ranks' entry point (`python THIS worker ...`).
"""

from __future__ import annotations

import hashlib
import json
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("deepspeed", reason="needs deepspeed (pip install 'envace[deepspeed]')")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.helpers.micro import MICRO  # noqa: E402
from tests.helpers.ranks import run_nodes, run_ranks, torchrun  # noqa: E402

SETS = [
    *MICRO,
    "rollout.batch_tasks=3",  # 3 tasks over 2 ranks: 2 + 1
    "train.micro_batch_rows=2",
    "train.ppo_epochs=2",
    "train.grad_clip=1.0",
    # ECHO's observation loss on: its token mean over the global batch must survive the
    # uneven split too (the packed caller sequence holds the observations)
    "algo.env_loss_coef=0.5",
]
ADVANTAGES = [1.0, -0.5, 0.25, -1.0, 0.75, -0.25]  # 6 rows in 5 sequences: ranks get 3 and 2


def _cfg(engine: str, stage: int | None = None) -> Any:
    from envace.config import load_config

    cfg = load_config(None, [*SETS, f"train.engine={engine}"])
    if stage is not None:
        cfg.train.deepspeed_config = {"zero_optimization": {"stage": stage}}
        cfg.train.deepspeed.collective_timeout_s = 120
    return cfg


def _update_rows(rows: list[Any]) -> list[Any]:
    """The first 6 trainable rows with fixed advantages (a random model earns no reward)."""
    chosen = [r for r in rows if r.trainable][: len(ADVANTAGES)]
    assert len(chosen) == len(ADVANTAGES), f"only {len(chosen)} trainable rows"
    for r, a in zip(chosen, ADVANTAGES, strict=True):
        r.advantage = a
    return chosen


def _digest(rows: list[Any]) -> str:
    blob = json.dumps([[r.traj_id, r.prompt_ids, r.response_ids, r.advantage] for r in rows])
    return hashlib.sha256(blob.encode()).hexdigest()


# --- rank side --------------------------------------------------------------------------------
def worker(data: Path, out: Path, stages: list[int]) -> None:
    from transformers import AutoTokenizer

    from envace.policy.chat import ChatRenderer
    from envace.rollout.grading import TaskGrader
    from envace.run import load_splits, model_policy
    from envace.train.deepspeed_engine import DeepSpeedEngine, DeepSpeedOptions, load_pretrained
    from envace.train.distributed import dist_info, gather_objects, shutdown
    from envace.train.rl import RLTrainer, RoleLearner

    splits = load_splits(data / "tasks")
    tok = AutoTokenizer.from_pretrained(str(data / "init"))
    results: dict[str, Any] = {}
    for stage in stages:
        cfg = _cfg("deepspeed", stage)
        opts = DeepSpeedOptions.from_config(cfg)
        engine = DeepSpeedEngine(load_pretrained(data / "init", opts), opts)
        learner = RoleLearner(engine, frozenset({"caller", "simulator"}), ChatRenderer(tok).pad_id)
        trainer = RLTrainer(
            cfg, splits.train, model_policy(engine.model, tok, cfg), [learner], TaskGrader()
        )
        rows, metrics = trainer.collect(0)
        digests = gather_objects(_digest(rows))
        update_rows = _update_rows(rows)
        stats = trainer.update(update_rows)
        engine.save_model(out / f"zero{stage}", tok)
        if dist_info().is_main:
            (out / f"zero{stage}.rows.pkl").write_bytes(pickle.dumps(update_rows))
            results[f"zero{stage}"] = {
                "digests": digests,
                "trajectories": len({r.traj_id for r in rows}),
                "rows": len(rows),
                "metric_rows": metrics["rows/caller"] + metrics["rows/simulator"],
                "stats": stats,
            }
    if dist_info().is_main:
        (out / "results.json").write_text(json.dumps(results))
    shutdown(120)


# --- test side --------------------------------------------------------------------------------
def _prepare(tmp: Path) -> Path:
    from envace.run import RunPaths, init_model, load_splits, prepare_tasks

    cfg = _cfg("torch")
    paths = RunPaths(tmp, str(tmp))
    prepare_tasks(cfg, paths)
    init_model(cfg, load_splits(paths.tasks), tmp / "init")
    assert (tmp / "init" / "model.safetensors").is_file()
    return tmp


def _one_process_update(data: Path, rows: list[Any]) -> tuple[dict[str, float], Any]:
    from envace.policy.chat import ChatRenderer
    from envace.policy.hf_backend import load_model_and_tokenizer
    from envace.rollout.grading import TaskGrader
    from envace.run import model_policy
    from envace.train.learners import make_engine
    from envace.train.rl import RLTrainer, RoleLearner

    cfg = _cfg("torch")
    model, tok = load_model_and_tokenizer(data / "init")
    learner = RoleLearner(
        make_engine(cfg, model, cfg.train.iterations),
        frozenset({"caller", "simulator"}),
        ChatRenderer(tok).pad_id,
    )
    trainer = RLTrainer(cfg, [], model_policy(model, tok, cfg), [learner], TaskGrader())
    return trainer.update(rows), model


def test_two_ranks_roll_out_their_share_and_update_exactly_like_one_process(
    tmp_path: Path,
) -> None:
    from safetensors.torch import load_file

    data = _prepare(tmp_path / "data")
    out = tmp_path / "out"
    out.mkdir()
    proc = run_ranks(torchrun(__file__, "worker", str(data), str(out), "2", "3"))
    assert proc.returncode == 0, proc.stderr[-6000:]
    results = json.loads((out / "results.json").read_text())
    for name in ("zero2", "zero3"):
        got = results[name]
        # 3 tasks x 2 rollouts, gathered from both ranks; both ranks hold the same rows.
        assert got["trajectories"] == 6, name
        assert got["digests"][0] == got["digests"][1], name
        assert got["metric_rows"] == got["rows"]
        rows = pickle.loads((out / f"{name}.rows.pkl").read_bytes())
        assert [r.advantage for r in rows] == ADVANTAGES
        expected, model = _one_process_update(data, rows)
        assert expected["policy/rows"] == got["stats"]["policy/rows"] == 6
        assert got["stats"]["policy/sequences"] == 5  # two caller turns packed
        assert expected.keys() == got["stats"].keys()
        for key, value in expected.items():
            assert got["stats"][key] == pytest.approx(value, rel=2e-4, abs=2e-5), (name, key)
        assert expected["policy/grad_norm"] > 0
        assert expected["policy/env_tokens"] > 0 and expected["policy/env_ce"] > 0
        saved = load_file(str(out / name / "model.safetensors"))
        ref = {k: v for k, v in model.state_dict().items() if k in saved}
        assert ref.keys() == saved.keys()
        for key, tensor in saved.items():
            torch.testing.assert_close(tensor, ref[key], rtol=1e-4, atol=2e-5, msg=key)


if __name__ == "__main__":
    # Entry point of the ranks: `worker DATA OUT STAGE...`.
    if sys.argv[1] == "worker":
        worker(Path(sys.argv[2]), Path(sys.argv[3]), [int(s) for s in sys.argv[4:]])


def test_envace_run_on_two_nodes_without_a_shared_disk_writes_once_and_resumes(
    tmp_path: Path,
) -> None:
    """The main job as two torchrun nodes of one rank each, every node with its own --out (as
    pods with their own disks) and one store, ZeRO-3: rank 0 alone writes metrics and summary;
    each node uploads its own DeepSpeed shard, so the store's checkpoint holds both although
    rank 0's disk has one; the final weights (gathered from the shards) are the last
    checkpoint's; `--resume` on two fresh disks (restarted pods) continues from the store."""
    from safetensors.torch import load_file

    store = tmp_path / "store"
    sets = [
        *MICRO,
        "warm_start.batch_rows=8",
        "train.engine=deepspeed",
        'train.deepspeed_config={"zero_optimization": {"stage": 3}}',
        "train.deepspeed.collective_timeout_s=180",
        "train.save_every=1",
        "train.eval_every=1",
        "eval.max_tasks=1",
    ]

    def nodes(disk: str, *more: str) -> list[list[str]]:
        args = ["-m", "envace", "run", "--store", str(store), *more]
        args += [a for kv in sets for a in ("--set", kv)]
        return [[*args, "--out", str(tmp_path / f"{disk}{n}" / "run")] for n in range(2)]

    first = run_nodes(nodes("disk", "--set", "train.iterations=2"))
    assert all(p.returncode == 0 for p in first), [p.stderr[-4000:] for p in first]
    assert "DeepSpeed engine: ZeRO-3, 2 rank(s)" in first[0].stderr
    out = tmp_path / "disk0" / "run"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"] == 2
    assert set(summary["stages"]) == {"untrained", "warm_start", "rl"}
    assert not (tmp_path / "disk1" / "run" / "summary.json").exists()
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in lines] == [1, 2]  # one writer
    assert all("eval/success_rate" in r for r in lines)
    shards = [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]
    state = Path("checkpoints/rl/iter_000002/policy/deepspeed/state")
    assert [(tmp_path / f"disk{r}" / "run" / state / shards[r]).is_file() for r in (0, 1)] == [
        True,
        True,
    ]
    assert not (out / state / shards[1]).exists()  # rank 1's shard is on its own disk only
    ckpt = store / "checkpoints" / "rl" / "iter_000002"
    assert sorted(p.name for p in (store / state).iterdir() if "optim" in p.name) == shards
    listed = {e["path"] for e in json.loads((ckpt / "MANIFEST.json").read_text())["files"]}
    assert {f"policy/deepspeed/state/{s}" for s in shards} <= listed
    last, final = (
        load_file(str(d / "model.safetensors"))
        for d in (ckpt / "policy", store / "checkpoints" / "final")
    )
    assert last.keys() == final.keys()
    for key in last:
        torch.testing.assert_close(final[key], last[key], msg=key)
    again = run_nodes(nodes("fresh", "--set", "train.iterations=3", "--resume"))
    assert all(p.returncode == 0 for p in again), [p.stderr[-4000:] for p in again]
    assert "at iteration 2" in again[0].stderr
    out = tmp_path / "fresh0" / "run"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in lines] == [1, 2, 3]
