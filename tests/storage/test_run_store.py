"""`envace run --store minio://...`: every artifact lands in S3 with a manifest, and a resumed
run continues from the newest complete checkpoint there, skipping a partial newer one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from envace.cli import main
from envace.storage.artifacts import verify
from envace.storage.checkpoints import latest_complete
from tests.helpers.micro import MICRO


def _args(out: Path, store: str, iterations: int) -> list[str]:
    args = [
        "run",
        "--out",
        str(out),
        "--store",
        store,
        "--set",
        f"train.iterations={iterations}",
        "--set",
        "train.save_every=1",
    ]
    for kv in MICRO:
        args += ["--set", kv]
    return args


@pytest.mark.slow
def test_run_on_s3_and_resume_from_latest_complete(
    env_s3: Any, bucket: str, tmp_path: Path
) -> None:
    store = f"minio://{bucket}/runs/r1"
    assert main(_args(tmp_path / "work", store, 2)) == 0
    for artifact in (
        "tasks",
        "checkpoints/init",
        "checkpoints/warm_start",
        "checkpoints/rl/iter_000002",
        "checkpoints/final",
    ):
        manifest = verify(f"{store}/{artifact}")
        assert manifest.files, artifact
    assert latest_complete(f"{store}/checkpoints/rl") == f"{store}/checkpoints/rl/iter_000002"
    # A newer checkpoint whose upload was cut off (files, no manifest) must not be taken.
    from envace.storage.artifacts import open_store

    s3, prefix = open_store(f"{store}/checkpoints/rl/iter_000003")
    s3.put_bytes(b"partial", f"{prefix}/policy/model.safetensors")
    # A fresh machine: the local work folder is gone, everything comes from the store.
    shutil.rmtree(tmp_path / "work")
    assert main([*_args(tmp_path / "work", store, 3), "--resume"]) == 0
    summary = json.loads((tmp_path / "work" / "summary.json").read_text())
    assert summary["resumed_from"].endswith("iter_000002")
    records = [
        json.loads(x) for x in (tmp_path / "work" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["iteration"] for r in records] == [1, 2, 3]  # history restored from the store
    assert latest_complete(f"{store}/checkpoints/rl") == f"{store}/checkpoints/rl/iter_000003"
