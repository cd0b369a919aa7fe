"""scripts/setup_test_stack.sh runs `make test`'s installs side by side and fails naming the job.

Run with ENVACE_SETUP_JOBS picking none of the real installs (they are several GB and `make test`
has already run them): the jobs here are plain shell commands, the script's own logic is real.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "setup_test_stack.sh"


def _run(tmp_path: Path, jobs: str, *command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ENVACE_SETUP_JOBS": jobs, "ENVACE_SETUP_LOGS": str(tmp_path / "logs")}
    return subprocess.run(
        ["bash", str(SCRIPT), *command], env=env, capture_output=True, text=True, timeout=60
    )


def test_a_failed_job_is_named_with_its_whole_log(tmp_path: Path) -> None:
    proc = _run(tmp_path, "", "bash", "-c", "echo half-installed; echo pip says why >&2; exit 3")
    assert proc.returncode == 1
    assert "[project] FAILED" in proc.stderr
    assert "    half-installed" in proc.stderr and "    pip says why" in proc.stderr
    assert "setup_test_stack.sh: project failed" in proc.stderr
    assert "half-installed" in (tmp_path / "logs" / "project.log").read_text()


def test_jobs_run_side_by_side_and_report_their_time(tmp_path: Path) -> None:
    proc = _run(tmp_path, "", "bash", "-c", "echo installed")
    assert proc.returncode == 0, proc.stderr
    assert "[project] done in " in proc.stdout
    assert "test stack set up side by side in " in proc.stdout
    assert (tmp_path / "logs" / "project.log").read_text().startswith("installed\n")


def test_an_unknown_job_is_refused_before_anything_starts(tmp_path: Path) -> None:
    proc = _run(tmp_path, "setup_vllm", "bash", "-c", f"touch {tmp_path / 'ran'}")
    assert proc.returncode == 2
    assert "no scripts/setup_vllm.sh (ENVACE_SETUP_JOBS)" in proc.stderr
    assert not (tmp_path / "ran").exists()
