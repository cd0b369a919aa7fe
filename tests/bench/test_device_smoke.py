"""bench/device_smoke.py, the check before the study on a lent GPU, run here on the CPU with the
real SmolLM2 conversion (no GPU on our CI machines: the CUDA graphs themselves are exercised
only on the device; docs/benchmarks.md records that run)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _smoke() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "device_smoke", ROOT / "bench" / "device_smoke.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_the_smoke_compares_static_decoding_with_generate_and_names_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENVACE_CACHE", str(tmp_path / "cache"))
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
