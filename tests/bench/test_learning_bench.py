"""The learning study (bench/learning.py) on a micro model: every mode from one warm start,
test-time rehearsal, the results file's shape, cells saved at once and skipped on a rerun."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from envace.errors import ConfigError
from envace.storage.artifacts import commit_dir
from tests.bench.bench_testlib import load_bench
from tests.helpers.micro import MICRO

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    return load_bench("learning.py")


def _args(tmp_path: Path, *extra: str) -> list[str]:
    args = [
        "--config",
        str(ROOT / "configs" / "local.yaml"),
        "--out",
        str(tmp_path / "o"),
        "--results",
        str(tmp_path / "learning.json"),
        "--doc",
        str(tmp_path / "benchmarks.md"),
        *extra,
    ]
    for kv in [
        *MICRO,
        "train.iterations=1",
        "train.trainable=full",
        "train.top_layers=null",
        "model.dtype=float32",
    ]:
        args += ["--set", kv]
    return args


@pytest.mark.slow
def test_the_study_runs_every_mode_and_a_rerun_skips_finished_cells(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _bench()
    (tmp_path / "benchmarks.md").write_text("# Benchmarks\n\n## Other\n\nkept\n")
    assert bench.main(_args(tmp_path, "--seeds", "0", "--modes", "warm_start", "rehearsal")) == 0
    data: dict[str, Any] = json.loads((tmp_path / "learning.json").read_text())
    assert data["model"] == "test-micro" and data["seeds"] == [0]
    assert set(data["modes"]) == {"warm_start", "rehearsal", "noshare", "external", "real"}
    for mode in ("warm_start", "rehearsal"):
        (success,) = data["modes"][mode]["success"]
        assert 0.0 <= success <= 1.0
    assert data["modes"]["real"]["success"] == [None]  # not run: null, not a made-up 0
    assert set(data["test_time"]) == {"warm_start", "rehearsal"}
    for policy in ("warm_start", "rehearsal"):
        assert data["test_time"][policy]["plain"] == data["modes"][policy]["success"]
        (p4,) = data["test_time"][policy]["parallel4"]
        assert 0.0 <= p4 <= 1.0
    cell = data["cells"]["mode/rehearsal/seed0"]
    assert cell["rl_seconds"] > 0 and cell["seconds"] >= cell["rl_seconds"]
    # every cell keeps its committed episodes; a test-time cell also the notes it acted on
    kept = tmp_path / "o" / "seed0" / "episodes"
    for key in ("mode/warm_start", "mode/rehearsal", "test_time/warm_start", "test_time/rehearsal"):
        lines = (kept / key.replace("/", "-") / "trajectories.jsonl").read_text().splitlines()
        episodes = [json.loads(line) for line in lines]
        rec = data["cells"][f"{key}/seed0"]
        assert len(episodes) == rec["metrics"]["n_episodes"] == 2  # eval.max_tasks 2, n 1
        solved = sum(bool(e["success"]) for e in episodes) / len(episodes)
        assert solved == pytest.approx(rec["success"])
    notes = json.loads((kept / "test_time-rehearsal" / "notes.json").read_text())
    assert set(notes) == {e["task_id"] for e in episodes}
    written = [n for ns in notes.values() for n in ns]
    assert len(written) >= 3  # one condensation per task and turn at least
    assert data["cells"]["test_time/rehearsal/seed0"]["notes_markup"] == bench.notes_markup(written)
    assert "notes_markup" not in cell and not (kept / "mode-rehearsal" / "notes.json").exists()
    assert {"per_turn_score", "valid_call_rate", "fidelity_exact", "fidelity_field"} <= set(cell)
    manifest = json.loads(
        (tmp_path / "o" / "seed0" / "checkpoints" / "warm_start" / "MANIFEST.json").read_text()
    )
    weights = sorted((f["path"], f["sha256"]) for f in manifest["files"])
    weights = [f for f in weights if f[0] != "warm_start.json"]
    wid = hashlib.sha256(json.dumps(weights).encode()).hexdigest()[:12]
    assert {c["warm_start_id"] for c in data["cells"].values()} == {wid}
    assert data["warm_starts"][wid]["seed"] == 0 and data["warm_starts"][wid]["steps"] > 0
    assert data["warm_start"]["0"] == data["warm_starts"][wid]
    doc = (tmp_path / "benchmarks.md").read_text()
    assert "## Learning study (bench/learning.py)" in doc and "| rehearsal |" in doc
    assert "| warm_start + parallel:4 |" in doc and "kept" in doc
    assert (tmp_path / "img" / "learning-study.png").read_bytes()[:4] == b"\x89PNG"

    # A rerun with one more mode runs only that cell: the warm start is loaded, not redone.
    import envace.run as run

    def no_warm_start(*args: object, **kwargs: object) -> None:
        raise AssertionError("the kept warm-start checkpoint should be reused")

    monkeypatch.setattr(run, "warm_start", no_warm_start)
    capsys.readouterr()
    args = _args(tmp_path, "--seeds", "0", "--modes", "warm_start", "rehearsal", "real")
    assert bench.main(args) == 0
    out = capsys.readouterr().out
    assert "4 finished cell(s)" in out and '"cell": "mode/real/seed0"' in out
    again = json.loads((tmp_path / "learning.json").read_text())
    assert again["cells"]["mode/rehearsal/seed0"] == cell  # finished cells untouched
    assert again["modes"]["real"]["success"][0] is not None
    assert doc.count("## Learning study") == 1
    assert "warm starts —" not in doc  # one warm start: no note

    # Another sitting's warm start of the same weights (only its stats' timings differ) keeps
    # the id; one of other weights (here one weight nudged) gets another: its cell is named apart
    # in the report, and the first warm start's figures stay.
    shutil.copytree(tmp_path / "o", tmp_path / "o2")
    ckpt = tmp_path / "o2" / "seed0" / "checkpoints" / "warm_start"
    (ckpt / "warm_start.json").write_text(json.dumps({"steps": 1, "seconds": 9.0}))
    (ckpt / "MANIFEST.json").unlink()
    commit_dir(ckpt, str(ckpt))
    assert bench.warm_start_id(ckpt) == wid
    (shard,) = ckpt.glob("*.safetensors")
    tensors = load_file(shard)
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1e-3
    save_file(tensors, shard, metadata={"format": "pt"})
    (ckpt / "MANIFEST.json").unlink()
    commit_dir(ckpt, str(ckpt))
    args = _args(tmp_path, "--seeds", "0", "--modes", "noshare", "--no-test-time")
    args[args.index(str(tmp_path / "o"))] = str(tmp_path / "o2")
    assert bench.main(args) == 0
    third = json.loads((tmp_path / "learning.json").read_text())
    new_id = third["cells"]["mode/noshare/seed0"]["warm_start_id"]
    assert new_id != wid and set(third["warm_starts"]) == {wid, new_id}
    assert third["warm_start"]["0"] == data["warm_starts"][wid]
    doc = (tmp_path / "benchmarks.md").read_text()
    assert (
        f"- seed 0, 2 warm starts — {new_id}: mode/noshare; {wid}: mode/real, mode/rehearsal" in doc
    )


def test_notes_markup_counts_notes_written_as_tool_calls_or_tool_results() -> None:
    bench = _bench()
    call = '<tool_call>\n{"name": "find_item", "arguments": {"name": "clock"}}\n</tool_call>'
    result = '<execution_result>\n{"order_id": "ORD-1"}\n</execution_result>'
    prose = "Plan: find_item for the clock, then create_order with its sku."
    assert bench.notes_markup([call, result, prose, prose]) == 0.5
    assert bench.notes_markup([prose]) == 0.0 and bench.notes_markup([]) is None


def test_a_results_file_of_another_config_is_refused(tmp_path: Path) -> None:
    bench = _bench()
    import dataclasses

    from envace.config import load_config

    args = _args(tmp_path, "--seeds", "0", "--modes", "warm_start")
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    config = dataclasses.asdict(load_config(ROOT / "configs" / "local.yaml", sets))
    config["train"]["lr"] = 0.5
    results = tmp_path / "learning.json"
    stored = {"model": "test-micro", "config": config, "cells": {"mode/warm_start/seed0": {}}}
    results.write_text(json.dumps(stored))
    with pytest.raises(SystemExit, match=r"another config \(train\.lr: 0\.5 there, 0\.001 now\)"):
        bench.main(args)
    assert json.loads(results.read_text()) == stored  # nothing overwritten


UNMASK = ["algo.mask_sim_errors=false"]  # the base the cells before 2026-12-07 ran


def test_mode_settings() -> None:
    bench = _bench()
    from envace.config import load_config

    base = load_config(ROOT / "configs" / "local.yaml", MICRO)
    noshare = bench.mode_config(base, "noshare")
    assert (noshare.rollout.mode, noshare.algo.sharing) == ("rehearsal", "noshare")
    ext = bench.mode_config(base, "external")
    assert ext.rollout.mode == "external" and ext.rollout.external_model is None
    assert bench.mode_config(base, "real").rollout.mode == "real"
    local = load_config(ROOT / "configs" / "local.yaml")
    mini = bench.mode_config(local, "high_lr_mini4")
    assert (mini.train.lr, mini.train.ppo_mini_batches, mini.rollout.mode) == (1e-4, 4, "rehearsal")
    assert bench.mode_config(local, "lr3e-4").train.lr == 3e-4
    batch = bench.mode_config(local, "high_lr_batch16")  # 4x the episodes, same groups of 4
    assert (batch.train.lr, batch.rollout.batch_tasks, batch.rollout.n) == (1e-4, 16, 4)
    assert batch.train.ppo_mini_batches == 1 and batch.train.iterations == local.train.iterations
    for lever, mode in (("long12", "rehearsal"), ("real_long12", "real")):  # 4x the budget
        long = bench.mode_config(local, lever)
        assert (long.rollout.mode, long.train.iterations, long.train.eval_every) == (mode, 12, 3)
        assert (long.train.lr, long.rollout.batch_tasks) == (local.train.lr, 4)
    token_mean = bench.mode_config(local, "real_long12_token_mean")
    assert (token_mean.algo.loss_agg_mode, token_mean.rollout.mode) == ("token-mean", "real")
    lora = bench.mode_config(local, "lora_r16")  # RL only: the warm start keeps the top 12
    assert (lora.train.trainable, lora.train.top_layers, lora.train.lr) == ("lora", None, 5e-4)
    assert lora.train.lora == {} and lora.warm_start == local.warm_start
    with pytest.raises(ConfigError, match="ppo_mini_batches"):  # MICRO: 2 tasks an iteration
        bench.mode_config(base, "high_lr_mini4")
    assert bench.mean_std([0.5, None, 0.7]) == "0.600 ± 0.141 (2)"
    assert bench.mean_std([None]) == "n/a"
    shown = bench.mode_config(local, "shown_world")  # rehearsed turns graded as shown
    assert (shown.algo.rehearsal_grading, shown.rollout.mode) == ("shown_world", "rehearsal")
    assert shown.train.lr == local.train.lr
    mask = bench.mode_config(local, "mask_sim_errors")
    assert (mask.algo.mask_sim_errors, mask.train.lr) == (True, local.train.lr)
    # local.yaml masks the simulator's slips (since 2026-12-07); `unmasked` is the method before
    assert local.algo.mask_sim_errors and bench.mode_config(local, "rehearsal").algo.mask_sim_errors
    assert not bench.mode_config(local, "unmasked").algo.mask_sim_errors
    assert bench.mode_config(local, "unmasked").rollout.mode == "rehearsal"
    cool = bench.mode_config(load_config(ROOT / "configs" / "local.yaml", UNMASK), "masked_t07")
    assert (cool.algo.mask_sim_errors, cool.rollout.temperature, cool.eval.temperature) == (
        True,
        0.7,
        0.0,  # the evaluation is never changed
    )
    caller = bench.mode_config(
        load_config(ROOT / "configs" / "local.yaml", UNMASK), "masked_caller"
    )
    assert (caller.algo.mask_sim_errors, caller.algo.train_roles, caller.rollout.mode) == (
        True,
        "caller",
        "rehearsal",  # the simulator role still writes every tool result
    )
    assert bench.mode_config(local, "no_step").train.lr == 1e-12


def test_a_sitting_of_some_seeds_keeps_the_others_in_the_headline() -> None:
    """Running seed 0 into a 3-seed results file once narrowed its per-seed arrays to seed 0
    (the cells stayed, the headline lost seeds 1 and 2)."""
    bench = _bench()
    data = {
        "seeds": [0, 1, 2],
        "cells": {
            bench.cell_key("mode", "warm_start", s): {"success": 0.1 * s, "fidelity_field": None}
            for s in (0, 1, 2)
        },
    }
    seeds = bench.headline_seeds(data, [0])
    assert seeds == [0, 1, 2] and bench.headline_seeds({"seeds": [1]}, [3, 0]) == [0, 1, 3]
    assert bench.summarize(data, seeds)["modes"]["warm_start"]["success"] == [0.0, 0.1, 0.2]


def test_a_field_added_since_counts_only_away_from_its_default(tmp_path: Path) -> None:
    """Cells stored before `algo.simulator_reward` existed still compare with a run that leaves
    it at its default (the code's new field changes nothing there); set away from it, refused.
    A file of cells trained in another dtype is refused too (auto differs by CPU)."""
    bench = _bench()
    import dataclasses

    from envace.config import Config, load_config

    args = _args(tmp_path, "--seeds", "0", "--modes", "warm_start", "--report")
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    new = json.loads(
        json.dumps(dataclasses.asdict(load_config(ROOT / "configs" / "local.yaml", sets)))
    )
    defaults = json.loads(json.dumps(dataclasses.asdict(Config())))
    old = json.loads(json.dumps(new))
    del old["algo"]["simulator_reward"]
    assert bench.first_difference(old, new, defaults) is None
    new["algo"]["simulator_reward"] = "fidelity"
    assert bench.first_difference(old, new, defaults) == (
        "algo.simulator_reward: None there, 'fidelity' now"
    )
    assert bench.first_difference(new, new, defaults) is None
    # a field whose default changed what the code did: lacking it means the old behaviour
    new["algo"]["simulator_reward"] = defaults["algo"]["simulator_reward"]
    del old["train"]["master_weights"]
    assert bench.first_difference(old, new, defaults) == (
        "train.master_weights: False there (before the field), True now"
    )
    new["train"]["master_weights"] = False
    assert bench.first_difference(old, new, defaults) is None

    run = _args(tmp_path, "--seeds", "0", "--modes", "warm_start")
    results = tmp_path / "learning.json"
    stored = {"model": "test-micro", "dtype": "bfloat16", "cells": {"mode/warm_start/seed0": {}}}
    results.write_text(json.dumps(stored))
    with pytest.raises(
        SystemExit, match=r"trained in bfloat16, but model.dtype 'float32' is float32"
    ):
        bench.main(run)
    assert json.loads(results.read_text()) == stored  # nothing overwritten


def test_lever_modes_rehearse_with_the_simulator_rows_scored_by_fidelity() -> None:
    bench = _bench()
    from envace.config import load_config

    base = load_config(ROOT / "configs" / "local.yaml", MICRO)
    for mode, reward in (("fidelity_reward", "fidelity"), ("mixed_reward", "mixed")):
        cfg = bench.mode_config(base, mode)
        assert (cfg.rollout.mode, cfg.algo.simulator_reward, cfg.algo.sharing) == (
            "rehearsal",
            reward,
            "share",
        )
    assert bench.mode_config(base, "rehearsal").algo.simulator_reward == "task"
    masked = bench.mode_config(base, "mask_sim_errors")
    assert (masked.rollout.mode, masked.algo.mask_sim_errors) == ("rehearsal", True)
    assert masked.train.lr == base.train.lr and base.algo.mask_sim_errors  # local.yaml's
    high = bench.mode_config(base, "high_lr")
    assert (high.rollout.mode, high.train.lr, high.algo.mask_sim_errors) == (
        "rehearsal",
        1e-4,
        True,
    )
    # one setting changed from the base config, the rest (budget, tasks, model) the same
    diff = {k for k, v in high.to_dict()["train"].items() if base.to_dict()["train"][k] != v}
    assert diff == {"lr"} and high.to_dict()["rollout"] == base.to_dict()["rollout"]
    # the levers built on high_lr: that lr, and one more setting each
    ppo2, group8, echo = (
        bench.mode_config(base, m) for m in ("high_lr_ppo2", "high_lr_group8", "high_lr_echo")
    )
    assert {c.train.lr for c in (ppo2, group8, echo)} == {1e-4}
    assert (ppo2.train.ppo_epochs, base.train.ppo_epochs) == (2, 1)
    assert (group8.rollout.n, group8.rollout.batch_tasks) == (8, 2)
    local = load_config(ROOT / "configs" / "local.yaml").rollout  # the study's own budget
    assert group8.rollout.n * group8.rollout.batch_tasks == local.n * local.batch_tasks == 16
    assert (echo.algo.env_loss_coef, base.algo.env_loss_coef) == (0.1, 0.0)
    # a lever's cells enter the headline shape and the table only once they ran
    data = {"cells": {"mode/fidelity_reward/seed0": {"success": 0.25, "fidelity_field": 0.5}}}
    summary = bench.summarize(data, [0, 1])
    assert summary["modes"]["fidelity_reward"] == {"success": [0.25, None], "fidelity": [0.5, None]}
    assert "mixed_reward" not in summary["modes"] and "noshare" in summary["modes"]
    assert "| fidelity_reward | 0.250 (1 seed) |" in bench.table(summary)


def test_merge_joins_cells_run_side_by_side_and_refuses_conflicts(tmp_path: Path) -> None:
    """`--merge`: results files of processes that ran disjoint cells (bench/device_study.sh on a
    GPU) become one, with the headline shape; a config or a cell that differs is refused."""
    bench = _bench()
    head = {"model": "smollm2-135m", "config": {"seed": 0}, "dtype": "bfloat16"}

    def rec(success: float, seconds: float = 60.0) -> dict[str, Any]:
        return {
            "success": success,
            "fidelity_field": 0.2,
            "warm_start_id": "w0",
            "seconds": seconds,
        }

    files = {
        "ws": {"mode/warm_start/seed0": rec(0.25), "mode/warm_start/seed1": rec(0.5)},
        "real": {"mode/real/seed0": rec(0.3125)},
        # a later sitting that re-ran a cell as a check (its timing differs) and added one
        "tt": {"mode/warm_start/seed0": rec(0.25, 71.5), "test_time/warm_start/seed0": rec(0.125)},
    }
    paths = []
    for name, cells in files.items():
        path = tmp_path / f"{name}.json"
        ws = {"0": {"seed": 0, "steps": 46}}
        path.write_text(json.dumps({**head, "cells": cells, "warm_start": ws}))
        paths.append(path)
    out = tmp_path / "merged.json"
    args = ["--merge", *map(str, paths), "--results", str(out), "--seeds", "0", "1"]
    assert bench.main([*args, "--doc", str(tmp_path / "b.md")]) == 0
    data = json.loads(out.read_text())
    assert data["model"] == "smollm2-135m" and data["dtype"] == "bfloat16"
    assert len(data["cells"]) == 4 and data["warm_start"] == {"0": {"seed": 0, "steps": 46}}
    assert data["modes"]["warm_start"]["success"] == [0.25, 0.5]
    assert data["modes"]["real"]["success"] == [0.3125, None]
    assert data["test_time"]["warm_start"] == {"plain": [0.25, 0.5], "parallel4": [0.125, None]}
    assert data["cells"]["mode/warm_start/seed0"]["seconds"] == 60.0  # the first file's record
    assert "| real | 0.312 (1 seed)" in (tmp_path / "b.md").read_text()

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**head, "config": {"seed": 1}, "cells": {}}))
    with pytest.raises(SystemExit, match=r"bad\.json: its config differs .*seed: 0 there, 1 now"):
        bench.merge_results([paths[0], bad], [0])
    clash = tmp_path / "clash.json"
    clash.write_text(json.dumps({**head, "cells": {"mode/real/seed0": rec(0.5)}}))
    with pytest.raises(SystemExit, match=r"clash\.json: cell mode/real/seed0 differs"):
        bench.merge_results([paths[1], clash], [0])
    # cells scored with a validation split trained on fewer tasks: not one study
    val = tmp_path / "val.json"
    val.write_text(json.dumps({**head, "validation_tasks": 16, "cells": {}}))
    with pytest.raises(SystemExit, match=r"val\.json: its validation_tasks differs"):
        bench.merge_results([paths[0], val], [0])


@pytest.mark.slow
def test_validation_tasks_are_held_out_of_training_and_score_every_cell(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--validation K`: the last K training tasks are trained on by neither the warm start nor
    RL, each mode cell records its score on them, and a results file or a kept warm start of
    another K is refused (their training sets differ)."""
    bench = _bench()
    import envace.run as run

    trained: list[set[str]] = []
    real_warm_start, real_rl_stage = run.warm_start, run.rl_stage

    def warm_start(cfg: Any, model: Any, tok: Any, splits: Any) -> Any:
        trained.append({t.id for t in splits.train})
        return real_warm_start(cfg, model, tok, splits)

    def rl_stage(ctx: Any, logger: Any, eval_hook: Any = None) -> Any:
        trained.append({t.id for t in ctx.splits.train})
        return real_rl_stage(ctx, logger, eval_hook)

    monkeypatch.setattr(run, "warm_start", warm_start)
    monkeypatch.setattr(run, "rl_stage", rl_stage)
    more = ["--set", "tasks.n_train=10"]  # some of MICRO's short gold conversations replay
    more += ["--set", "train.eval_every=1"]  # RL cells: a validation point every iteration
    args = [*_args(tmp_path, "--seeds", "0", "--modes", "warm_start", "rehearsal"), *more]
    args.append("--no-test-time")
    assert bench.main([*args, "--validation", "2"]) == 0
    data = json.loads((tmp_path / "learning.json").read_text())
    assert data["validation_tasks"] == 2
    lines = (tmp_path / "o" / "seed0" / "tasks" / "train.jsonl").read_text().splitlines()
    ids = [json.loads(line)["id"] for line in lines if line.strip()]
    assert len(ids) == 10 and trained == [set(ids[:8]), set(ids[:8])]  # warm start, then RL
    for mode in ("warm_start", "rehearsal"):
        val = data["cells"][f"mode/{mode}/seed0"]["validation"]
        assert set(val) == {"success", "per_turn_score", "valid_call_rate"}
        assert 0.0 <= val["success"] <= 1.0
    # the one RL iteration's point is the final policy's own score (greedy, same weights)
    rl_cell = data["cells"]["mode/rehearsal/seed0"]
    assert rl_cell["validation_curve"] == [{"iteration": 1, **rl_cell["validation"]}]
    assert "validation_curve" not in data["cells"]["mode/warm_start/seed0"]
    png = tmp_path / "curves.png"
    assert bench.main([*args, "--curves", str(png)]) == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    none = tmp_path / "none.json"
    none.write_text(
        json.dumps({"cells": {"mode/warm_start/seed0": data["cells"]["mode/warm_start/seed0"]}})
    )
    with pytest.raises(SystemExit, match="no cell of the results file has a validation curve"):
        bench.main(["--results", str(none), "--curves", str(tmp_path / "none.png")])
    assert "validation success" in (tmp_path / "benchmarks.md").read_text()
    with pytest.raises(SystemExit, match="with 2 validation task"):
        bench.main(args)  # same results file, no validation
    other = [*_args(tmp_path, "--seeds", "0", "--modes", "warm_start", "--no-test-time"), *more]
    other[other.index(str(tmp_path / "learning.json"))] = str(tmp_path / "other.json")
    with pytest.raises(
        SystemExit, match=r"trained with 2 training task.* not 3; give another --out"
    ):
        bench.main([*other, "--validation", "3"])


def test_a_report_rewrite_keeps_the_text_written_below_the_table(tmp_path: Path) -> None:
    """`write_report` replaces the generated table and plot only: the reading written by hand
    after its end marker, and the sections around it, survive a rewrite."""
    bench = _bench()
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n## Before\n\nfirst\n")
    res = tmp_path / "learning.json"

    def data(success: float) -> dict[str, Any]:
        rec = {"success": success, "seconds": 1.0}
        return {"model": "m", "seeds": [0], "cells": {"mode/rehearsal/seed0": rec}}

    bench.write_report(data(0.25), doc, "cmd one", "a machine", res)
    doc.write_text(doc.read_text() + "\nReading by hand.\n\n## After\n\nlast\n")
    bench.write_report(data(0.75), doc, "cmd two", "a machine", res)
    text = doc.read_text()
    assert "0.750 (1 seed)" in text and "0.250" not in text and "cmd one" not in text
    assert text.count(bench.GENERATED_END) == 1
    assert text.index(bench.GENERATED_END) < text.index("Reading by hand.")
    assert text.index("Reading by hand.") < text.index("## After")
    assert "## Before\n\nfirst\n" in text and text.endswith("## After\n\nlast\n")
    assert (tmp_path / "img" / "learning-study.png").stat().st_size > 0
