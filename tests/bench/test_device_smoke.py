"""bench/device_smoke.py, the check before the study on a lent GPU, run here on the CPU with the
real SmolLM2 conversion (no GPU on our CI machines: the CUDA graphs themselves are exercised
only on the device; docs/benchmarks.md records that run)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.bench.bench_testlib import load_bench


def _smoke() -> ModuleType:
    return load_bench("device_smoke.py")


@pytest.mark.slow
def test_the_smoke_compares_static_decoding_with_generate_and_names_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_cache: Path
) -> None:
    monkeypatch.setenv("ENVACE_CACHE", str(smollm2_cache))
    smoke = _smoke()
    assert smoke.main(["--out", str(tmp_path / "ok.json"), "--new", "4"]) == 0
    rec = json.loads((tmp_path / "ok.json").read_text())
    assert rec["device"] == "cpu" and rec["cuda"] is False
    agree, total = map(int, rec["first8_agree"].split("/"))
    assert total == len(smoke.PROMPTS) and agree >= total // 2
    assert rec["generate_tokens_per_s"] > 0 and rec["static_tokens_per_s"] > 0
    assert rec["sample"].strip()

    from envace.policy import hf_backend

    class Broken:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("graph capture failed")

    monkeypatch.setattr(hf_backend, "StaticDecoder", Broken)
    assert smoke.main(["--out", str(tmp_path / "bad.json"), "--new", "4"]) == 2
    bad = json.loads((tmp_path / "bad.json").read_text())
    assert bad["static_error"] == "RuntimeError: graph capture failed"
    assert "first8_agree" not in bad and bad["generate_tokens_per_s"] > 0
