"""Faults that kill things: a writer SIGKILLed mid-upload, the S3 server dying mid-run."""

from __future__ import annotations

import hashlib
import logging
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from minio import Minio

from envace.storage import (
    ArtifactIntegrityError,
    RetryPolicy,
    StoreUnavailableError,
    checkpoint_uri,
    commit_dir,
    fetch_dir,
    latest_complete,
    open_store,
    verify,
)

MiB = 1024 * 1024
REPO_ROOT = Path(__file__).resolve().parents[2]

# The "training run" that gets killed: it commits a checkpoint and, once 12 MiB have been read
# for upload, announces it and stalls inside the upload until the test SIGKILLs it.
WRITER = r"""
import sys, time
from envace.storage import S3Settings, commit_dir
src, uri = sys.argv[1], sys.argv[2]
config = None
if uri.startswith("minio://"):
    config = S3Settings.from_env().with_overrides(part_size=5 * 1024 * 1024, parallel_uploads=1)
moved = 0
def progress(n):
    global moved
    moved += n
    if moved > 12 * 1024 * 1024:
        print("MIDWAY", flush=True)
        time.sleep(120)
commit_dir(src, uri, config, progress=progress)
print("DONE", flush=True)
"""


def _checkpoint_source(root: Path, step: int, random_file: Any) -> dict[str, str]:
    """Files sorted so one is stored before the big one and one after it."""
    (root / "a_state.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "a_state.json").write_text(f'{{"step": {step}}}')
    random_file(root / "b_weights.bin", 24 * MiB, seed=step)
    (root / "c_tail.txt").write_text("tail")
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


def _wait_for_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        proc.kill()
        pytest.fail(f"writer printed nothing in {timeout} s")
    return proc.stdout.readline()


@pytest.mark.parametrize("kind", ["s3", "local"])
def test_sigkill_mid_upload_leaves_nothing_accepted_and_resume_takes_previous(
    kind: str, env_s3: Any, bucket: str, tmp_path: Path, random_file: Any
) -> None:
    prefix = f"minio://{bucket}/run/ckpt" if kind == "s3" else str(tmp_path / "store" / "ckpt")
    first, second = checkpoint_uri(prefix, 1), checkpoint_uri(prefix, 2)
    first_files = _checkpoint_source(tmp_path / "src1", 1, random_file)
    commit_dir(tmp_path / "src1", first)
    second_files = _checkpoint_source(tmp_path / "src2", 2, random_file)

    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path / "src2"), second],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    ) as proc:
        line = _wait_for_line(proc, timeout=60)
        assert line == b"MIDWAY\n", proc.stderr.read() if proc.stderr else line
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL

    # Nothing partial is accepted ...
    store, key = open_store(second)
    stored = [o.key.rsplit("/", 1)[-1] for o in store.list(key)]
    assert stored == ["a_state.json"]  # the big file never became an object; the tail never began
    with pytest.raises(ArtifactIntegrityError, match=f"partial artifact at {second}"):
        verify(second)
    with pytest.raises(ArtifactIntegrityError):
        fetch_dir(second, tmp_path / "refused")
    # ... and nothing complete is lost: resume finds the previous checkpoint, intact.
    assert latest_complete(prefix) == first
    fetched = fetch_dir(first, tmp_path / "resumed")
    assert {e.path: e.sha256 for e in fetched.files} == first_files

    # The next run writes the checkpoint again and it becomes the latest.
    commit_dir(tmp_path / "src2", second)
    assert {e.path: e.sha256 for e in verify(second, deep=True).files} == second_files
    assert latest_complete(prefix, deep=True) == second


def test_server_dying_mid_run_is_retried_then_reported(
    moto_process: Any,
    make_settings: Any,
    tmp_path: Path,
    random_file: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    endpoint = moto_process.endpoint
    settings = make_settings(endpoint)
    Minio(endpoint.netloc, "k", "s", secure=False).make_bucket("envace")
    prefix = "minio://envace/run/ckpt"
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "w.bin").write_bytes(b"1" * 1000)
    commit_dir(tmp_path / "one", checkpoint_uri(prefix, 1), settings)
    for name in ("a.bin", "b.bin", "c.bin"):
        random_file(tmp_path / "two" / name, 6 * MiB, seed=len(name))

    moved = 0

    def kill_during_b(n: int) -> None:
        nonlocal moved
        moved += n
        if moved > 7 * MiB and moto_process.proc.poll() is None:
            moto_process.kill()  # the server process dies while b.bin is being uploaded

    policy = RetryPolicy(max_attempts=4, base_delay=0.05, max_delay=0.2, total_budget_s=10)
    caplog.set_level(logging.WARNING, logger="envace.storage.retry")
    start = time.monotonic()
    with pytest.raises(StoreUnavailableError) as info:
        commit_dir(
            tmp_path / "two",
            checkpoint_uri(prefix, 2),
            settings,
            retry=policy,
            progress=kill_during_b,
        )
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert f"upload {prefix}/iter_000002/b.bin failed on endpoint {endpoint.url}" in message
    assert "after 4 attempt(s)" in message
    retries = [r for r in caplog.records if r.name == "envace.storage.retry"]
    assert len(retries) == 3 and all("b.bin" in r.getMessage() for r in retries)
    assert elapsed < policy.total_budget_s

    # With the server gone, the very first request of the next operation reports it too.
    with pytest.raises(StoreUnavailableError, match=f"failed on endpoint {endpoint.url}"):
        verify(checkpoint_uri(prefix, 1), settings, retry=policy)
