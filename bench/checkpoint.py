"""Checkpoint benchmark: where an RL checkpoint's time goes.

An RL checkpoint (`envace.run.save_rl_checkpoint` with the DeepSpeed engine) is the
Hugging Face weights, DeepSpeed's own state (master weights and optimizer, for exact resume) and
the artifact manifest (sha256 of every file, files fsynced, manifest written last). This times
each part for one model shape after one optimizer step, and prints a table and writes JSON.

    python bench/checkpoint.py --shape qwen3-0.6b                   # GPU, bf16
    python bench/checkpoint.py --shape cpu-107m --device cpu        # CPU, fp32
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu import SHAPES, Shape, build_model, n_params  # noqa: E402

from envace.report import text_table  # noqa: E402

SHAPES_HERE = {**SHAPES, "cpu-107m": Shape(768, 12, 12, 4, 64, 2304, 32000)}


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def measure(shape: str, device: str, out: Path) -> dict[str, Any]:
    """One optimizer step (so the optimizer has state), then each part of a checkpoint."""
    from envace.policy.tiny import build_tokenizer
    from envace.storage.artifacts import commit_dir
    from envace.train.deepspeed_engine import (
        _CHECKPOINT_TAG,
        _STATE_DIR,
        DeepSpeedEngine,
        DeepSpeedOptions,
    )

    dtype = "bfloat16" if device == "cuda" else "float32"
    model = build_model(SHAPES_HERE[shape], dtype, device)
    opts = DeepSpeedOptions(
        lr=1e-5,
        ds_config={"zero_optimization": {"stage": 2}, "bf16": {"enabled": device == "cuda"}},
    )
    engine = DeepSpeedEngine(model, opts)
    ids = torch.randint(3, 300, (2, 64), device=device)
    engine.backward(model(ids, labels=ids).loss)
    engine.step()
    tok = build_tokenizer(["<|im_start|>user\nhello<|im_end|>"] * 20, vocab_size=300)
    ckpt = out / "iter_000001"
    stages: dict[str, tuple[float, int]] = {}
    start = time.perf_counter()
    engine.save_weights(ckpt / "policy", tok)
    stages["hf_weights"] = (time.perf_counter() - start, _size(ckpt / "policy"))
    start = time.perf_counter()
    engine.ds.save_checkpoint(str(ckpt / "policy" / _STATE_DIR), tag=_CHECKPOINT_TAG)
    stages["deepspeed_state"] = (
        time.perf_counter() - start,
        _size(ckpt / "policy" / _STATE_DIR),
    )
    start = time.perf_counter()
    manifest = commit_dir(ckpt, str(ckpt))
    stages["manifest"] = (time.perf_counter() - start, manifest.total_size)
    return {
        "shape": shape,
        "device": device,
        "dtype": dtype,
        "params_m": round(n_params(model) / 1e6, 1),
        **{f"{k}_s": round(t, 3) for k, (t, _) in stages.items()},
        **{f"{k}_bytes": b for k, (_, b) in stages.items()},
        "total_s": round(sum(t for t, _ in stages.values()), 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--shape", choices=sorted(SHAPES_HERE), default="cpu-107m")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, default=Path("bench-checkpoint.json"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        row = measure(args.shape, args.device, Path(tmp))
    report = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": torch.cuda.get_device_name() if args.device == "cuda" else platform.machine(),
        "command": " ".join(["python", "bench/checkpoint.py", *(argv or sys.argv[1:])]),
        "result": row,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    parts = ("hf_weights", "deepspeed_state", "manifest")
    print(
        text_table(
            ["part", "seconds", "GB", "GB/s"],
            [
                (
                    k,
                    row[f"{k}_s"],
                    round(row[f"{k}_bytes"] / 1e9, 3),
                    round(row[f"{k}_bytes"] / 1e9 / max(row[f"{k}_s"], 1e-9), 2),
                )
                for k in parts
            ],
        )
    )
    print(
        f"\n{row['shape']} ({row['params_m']} M params, {row['dtype']}), total {row['total_s']} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
