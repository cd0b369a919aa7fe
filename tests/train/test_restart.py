"""A training job that is killed and restarted (as JobSet restarts a TrainJob's pods) resumes
from the newest complete checkpoint in the store with no user action: the restarted process sees
ENVACE_RESTART_ATTEMPT >= 1 (the runtime maps the pod's `jobset.sigs.k8s.io/restart-attempt`
label to it). Real `envace train` processes, killed with SIGKILL; no Kubernetes API is involved
(the label-to-env wiring is checked on the rendered chart in tests/cluster/test_chart.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envace.train.cli import RESTART_ATTEMPT_ENV
from tests.helpers.micro import MICRO

ITERATIONS = 6


def _train(store: Path, work: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    sets = [
        a
        for kv in [*MICRO, f"train.iterations={ITERATIONS}", "train.save_every=1"]
        for a in ("--set", kv)
    ]
    args = ["train", "--store", str(store), "--run-name", "job", "--work-dir", str(work), *sets]
    with log.open("wb") as err:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "envace", *args],
            env={**os.environ, "OMP_NUM_THREADS": "1", **env},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, "the job ended before its first checkpoint"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.mark.slow
def test_a_killed_job_restarts_from_its_newest_checkpoint(tmp_path: Path) -> None:
    store = tmp_path / "store"
    logs = [tmp_path / f"attempt-{i}.log" for i in range(3)]
    first = _train(store, tmp_path / "pod-1", {}, logs[0])
    _wait_for(store / "job" / "checkpoints" / "rl" / "iter_000001" / "MANIFEST.json", first)
    first.send_signal(signal.SIGKILL)
    first.wait()
    # a fresh pod (an empty work dir) of the first attempt would refuse the run name
    again = _train(store, tmp_path / "pod-1b", {}, logs[1])
    assert again.wait() == 2
    assert "already holds a run" in logs[1].read_text()
    restarted = _train(store, tmp_path / "pod-2", {RESTART_ATTEMPT_ENV: "1"}, logs[2])
    code = restarted.wait()
    err = logs[2].read_text()
    assert code == 0, err[-3000:]
    summary = json.loads((tmp_path / "pod-2" / "summary.json").read_text())
    assert summary["resumed_from"] is not None and "iter_00000" in summary["resumed_from"]
    lines = (tmp_path / "pod-2" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["iteration"] for x in lines] == list(range(1, ITERATIONS + 1))
    assert "restart attempt 1 of this job: resuming" in err
