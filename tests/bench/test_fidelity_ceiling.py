"""bench/fidelity_ceiling.py: which real result fields an ungrounded simulator could know."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from tests.bench.bench_testlib import load_bench


def _bench() -> ModuleType:
    return load_bench("fidelity_ceiling.py")


def test_knowable_values() -> None:
    bench = _bench()
    visible = 'I am Nimi, PIN 3724.\n{"amount":430}'
    assert bench.knowable("Nimi", visible) and bench.knowable(430, visible)
    assert bench.knowable(True, visible) and bench.knowable(None, visible)
    assert bench.knowable([], visible) and not bench.knowable(["ACC-1"], visible)
    assert not bench.knowable("ACC-83d3", visible) and not bench.knowable(4800, visible)


def test_the_ceiling_of_generated_tasks(tmp_path: Path) -> None:
    """Real worlds replaying gold calls: an authentication answers what the user said; a fresh
    account listing holds ids nobody said; the share is strictly between 0 and 1."""
    bench = _bench()
    out = tmp_path / "ceiling.json"
    assert bench.main(["--seeds", "0", "--n-train", "8", "--n-test", "8", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    test = data["seeds"]["0"]["test"]
    assert test["fields"] > 0 and 0.0 < test["knowable_share"] < 1.0
    tools = {**data["seeds"]["0"]["train"]["per_tool"], **test["per_tool"]}
    if "list_accounts" in tools:
        assert tools["list_accounts"] == 0.0
    assert all(0.0 <= v <= 1.0 for v in tools.values())
