"""bench/rollout.py: the rollout loop with and without prefix caching, on a micro model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_rollout_bench_compares_prefix_caching_in_the_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both rollouts (training's rehearsal, evaluation's real worlds), each with prefix caching
    off and on: off computes every prompt token, on fewer (the rollouts of a task share their
    first prompt); the outputs agree (a wrong cache entry would change nearly all of them)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import rollout as bench
    finally:
        sys.path.remove(str(ROOT / "bench"))
    out = tmp_path / "out"
    sets = ["model.preset=test-micro", "tasks.n_train=4", "tasks.n_test=2", "rollout.n=2"]
    argv = ["--tasks", "2", "--out", str(out), *[x for s in sets for x in ("--set", s)]]
    assert bench.main(argv) == 0
    report = json.loads((out / "bench-rollout.json").read_text())
    rows = {(r["mode"], r["prefix_cache"]): r for r in report["results"]}
    assert set(rows) == {(m, s) for m in ("rehearsal", "real") for s in ("off", "on")}
    for mode in ("rehearsal", "real"):
        off, on = rows[mode, "off"], rows[mode, "on"]
        assert off["computed_tokens"] == off["prompt_tokens"] > 0
        assert on["prompt_tokens"] > 0
        same, total = (int(x) for x in on["same_outputs"].split(" / "))
        assert total > 0 and same >= 0.9 * total
        for r in (off, on):
            assert r["generated_tokens"] > 0 and r["tokens_per_s"] > 0 and r["steps_s"] > 0
    assert rows["rehearsal", "on"]["computed_tokens"] < rows["rehearsal", "on"]["prompt_tokens"]
    assert (out / "rollout.png").stat().st_size > 1000
    assert "prompt tokens computed" in capsys.readouterr().out
