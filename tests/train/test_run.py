"""The main job end to end on a micro model, and exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.cli import main
from envace.config import load_config
from envace.run import run_main
from envace.train.preflight import LOCK_NAME
from tests.helpers.micro import MICRO


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.mark.slow
def test_run_writes_every_artifact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    args = ["run", "--out", str(out), *[a for kv in MICRO for a in ("--set", kv)]]
    sets = ["train.iterations=2", "tensorboard=true", "train.save_rollouts=true"]
    assert main([*args, *[a for kv in sets for a in ("--set", kv)]]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["stages"]) == {"untrained", "warm_start", "rl"}
    for stage in summary["stages"].values():
        assert set(stage) >= {"success_rate", "valid_call_rate", "rehearsal_fidelity"}
        assert 0.0 <= stage["success_rate"] <= 1.0
    assert summary["wall_seconds"] > 0
    records = _lines(out / "metrics.jsonl")
    assert [r["iteration"] for r in records] == [1, 2]
    assert all("policy/loss" in r and "reward/mean" in r for r in records)
    for rec in records:  # each iteration's scored episodes, as its metrics counted them
        episodes = _lines(out / "rollouts" / f"iter_{rec['iteration']:06d}.jsonl")
        rewards = [e["reward"] for e in episodes]
        assert sum(rewards) / len(rewards) == pytest.approx(rec["reward/mean"])
        rows = [r for e in episodes for r in e["rows"]]
        assert sum(r["role"] == "caller" for r in rows) == rec["rows/caller"]
        assert all(r["advantage"] is not None for r in rows)
        for e in episodes:  # a valid caller row is credited with its episode's reward
            scores = [r["score"] for r in e["rows"] if r["role"] == "caller" and r["valid"]]
            assert scores == pytest.approx([e["reward"]] * len(scores))
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


# --- resume that survives damage (issue #20 item 4) --------------------------------------------
def _tb_steps(out: Path, tag: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


def test_metrics_and_tensorboard_hold_each_iteration_once_after_kills(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from envace.train.tracking import MetricsLogger

    def attempt(resume_at: int | None, steps: range, torn: bool = False) -> None:
        logger = MetricsLogger(tmp_path, tensorboard=True)
        if resume_at is not None:
            logger.truncate_after(resume_at)
        for it in steps:
            logger.log({"iteration": it, "loss": float(it)})
        logger.close()  # then a kill, possibly in the middle of the next line
        if torn:
            with (tmp_path / "metrics.jsonl").open("a") as f:
                f.write('{"iteration": 99, "lo')

    attempt(None, range(1, 6), torn=True)  # killed at 5; its checkpoint was 2
    with caplog.at_level("WARNING"):
        attempt(2, range(3, 5))  # killed at 4; checkpoint 3
    assert "cut a torn last line: line 6" in caplog.text
    attempt(3, range(4, 8))
    assert [r["iteration"] for r in _lines(tmp_path / "metrics.jsonl")] == list(range(1, 8))
    assert _tb_steps(tmp_path, "loss") == list(range(1, 8))


def test_a_damaged_line_before_the_last_is_refused_untouched(tmp_path: Path) -> None:
    from envace.errors import UserInputError
    from envace.train.tracking import MetricsLogger

    text = '{"iteration": 1}\n{"iter\n{"iteration": 2}\n'
    (tmp_path / "metrics.jsonl").write_text(text)
    with pytest.raises(UserInputError, match="line 2 is not a JSON record"):
        MetricsLogger(tmp_path, tensorboard=False).truncate_after(2)
    assert (tmp_path / "metrics.jsonl").read_text() == text


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_resume_skips_a_damaged_newest_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from envace.errors import UserInputError

    out = tmp_path / "run"
    sets = [*MICRO, "train.save_every=1", "tensorboard=true"]
    run_main(load_config(None, [*sets, "train.iterations=2"]), out)
    rl = out / "checkpoints" / "rl"
    _flip_a_byte(rl / "iter_000002" / "policy" / "model.safetensors")  # same size, bad sha256
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"iteration": 3, "policy/lo')  # a kill in the middle of a line
    with caplog.at_level("WARNING"):
        summary = run_main(load_config(None, [*sets, "train.iterations=3"]), out, resume=True)
    assert summary["resumed_from"].endswith("iter_000001")
    assert "skipping damaged checkpoint 2" in caplog.text and "cut a torn last line" in caplog.text
    assert [r["iteration"] for r in _lines(out / "metrics.jsonl")] == [1, 2, 3]
    assert _tb_steps(out, "policy/loss") == [1, 2, 3]
    # every checkpoint damaged: refused, and the run's history is left as it was
    for step in (1, 2, 3):
        _flip_a_byte(rl / f"iter_{step:06d}" / "policy" / "model.safetensors")
    before = (out / "metrics.jsonl").read_bytes()
    with pytest.raises(UserInputError, match=r"every checkpoint under .* is damaged"):
        run_main(load_config(None, [*sets, "train.iterations=4"]), out, resume=True)
    assert (out / "metrics.jsonl").read_bytes() == before


def test_a_config_built_in_code_is_range_checked_before_anything_is_written(
    tmp_path: Path,
) -> None:
    import dataclasses

    from envace.errors import ConfigError

    cfg = dataclasses.replace(load_config(None, MICRO), seed=10**26)
    with pytest.raises(ConfigError, match=r"^seed: .* must be in \[0, 4294967296\)"):
        run_main(cfg, tmp_path / "r")
    assert not (tmp_path / "r").exists()
