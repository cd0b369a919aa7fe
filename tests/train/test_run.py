"""The main job end to end on a micro model, and exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.cli import main
from envace.config import load_config
from envace.train.preflight import LOCK_NAME
from envace.train.run import run_main
from tests.helpers.micro import MICRO


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_run_writes_every_artifact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    args = ["run", "--out", str(out), *[a for kv in MICRO for a in ("--set", kv)]]
    assert main([*args, "--set", "train.iterations=2", "--set", "tensorboard=true"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["stages"]) == {"untrained", "warm_start", "rl"}
    for stage in summary["stages"].values():
        assert set(stage) >= {"success_rate", "valid_call_rate", "rehearsal_fidelity"}
        assert 0.0 <= stage["success_rate"] <= 1.0
    assert summary["wall_seconds"] > 0
    records = _lines(out / "metrics.jsonl")
    assert [r["iteration"] for r in records] == [1, 2]
    assert all("policy/loss" in r and "reward/mean" in r for r in records)
    assert (out / "progress.png").read_bytes()[:4] == b"\x89PNG"
    assert list((out / "tensorboard").iterdir())
    for ckpt in ("init", "warm_start", "final", "rl/iter_000002"):
        assert (out / "checkpoints" / ckpt / "MANIFEST.json").is_file(), ckpt
    assert (out / "checkpoints" / "final" / "model.safetensors").is_file()
    printed = capsys.readouterr().out
    assert "success_rate" in printed and "warm_start" in printed and str(out) in printed
    # the final checkpoint loads back as a policy and evaluates
    assert (
        main(
            [
                "evaluate",
                "--policy",
                str(out / "checkpoints" / "final"),
                "--tasks",
                str(out / "tasks" / "test.jsonl"),
                "--out",
                str(tmp_path / "ev"),
            ]
        )
        == 0
    )
    # a fresh run into the same folder is refused, leaving the run as it was
    again = [*args, "--set", "train.iterations=1", "--set", "warm_start.enabled=false"]

    def files() -> dict[Path, bytes]:
        return {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != LOCK_NAME}

    before = files()
    assert main(again) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert files() == before
    # --overwrite replaces it: a fresh metric history, none of the old checkpoints left
    assert main([*again, "--overwrite"]) == 0
    assert [r["iteration"] for r in _lines(out / "metrics.jsonl")] == [1]
    assert not (out / "checkpoints" / "rl" / "iter_000002").exists()
    assert not (out / "checkpoints" / "warm_start").exists()


@pytest.mark.slow
def test_resume_equals_uninterrupted(tmp_path: Path) -> None:
    """Stopping after iteration 2 and resuming gives the same iterations 3-4 as one run.

    The stop is emulated by a first run configured for 2 iterations (constant lr schedule, so
    the optimizer state is the same as at iteration 2 of a 4-iteration run)."""
    full = tmp_path / "full"
    run_main(load_config(None, [*MICRO, "train.iterations=4", "train.save_every=2"]), full)
    part = tmp_path / "part"
    run_main(load_config(None, [*MICRO, "train.iterations=2", "train.save_every=2"]), part)
    summary = run_main(
        load_config(None, [*MICRO, "train.iterations=4", "train.save_every=2"]), part, resume=True
    )
    assert summary["resumed_from"].endswith("iter_000002")
    a, b = _lines(full / "metrics.jsonl"), _lines(part / "metrics.jsonl")
    assert [r["iteration"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b, strict=True):
        for key in ("policy/loss", "reward/mean", "rows/caller", "policy/grad_norm"):
            assert rb[key] == pytest.approx(ra[key], rel=1e-5, abs=1e-7), (ra["iteration"], key)


def test_resume_without_checkpoint_starts_fresh(tmp_path: Path) -> None:
    cfg = load_config(None, [*MICRO, "train.iterations=0", "warm_start.enabled=false"])
    summary = run_main(cfg, tmp_path / "r", resume=True)
    assert summary["resumed_from"] is None
    assert set(summary["stages"]) == {"untrained"}
