"""scripts/setup_test_stack.sh runs `make test`'s installs side by side and fails naming the job;
scripts/pyinstall.sh makes each install through uv, with pip's settings, and pip when uv fails.

Run with ENVACE_SETUP_JOBS picking none of the real installs (they are several GB and `make test`
has already run them): the jobs here are plain shell commands, the script's own logic is real.
pyinstall's tests install a wheel made here, offline, with the real uv and pip; the failing uv
is a shell script (a uv that fails on purpose cannot be had otherwise).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


# --- scripts/pyinstall.sh: installs through uv, pip's settings passed on, pip when uv fails ------

PYINSTALL = SCRIPT.parent / "pyinstall.sh"


def _wheel(folder: Path, name: str = "envace_probe", version: str = "1.0") -> Path:
    """A minimal pure-Python wheel, made by hand: installs offline, no build backend needed."""
    import base64
    import hashlib
    import zipfile

    files = {
        f"{name}.py": f"VERSION = {version!r}\n",
        f"{name}-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        ),
        f"{name}-{version}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = f"{name}-{version}.dist-info/RECORD"
    lines = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        lines.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[record] = "\n".join([*lines, f"{record},,"]) + "\n"
    whl = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return whl


def _venv(tmp_path: Path) -> Path:
    """A venv without its own pip (seconds faster); `python -m pip` there is the base Python's,
    which installs into the venv."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
        check=True,
        timeout=120,
    )
    return venv


@pytest.fixture
def probe_wheels(tmp_path: Path) -> Path:
    """A find-links folder holding the hand-made `envace_probe` wheel."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels)
    return wheels


def _pyinstall(venv: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(PYINSTALL), str(venv), *args],
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _installer(venv: Path) -> str:
    (info,) = venv.glob("lib/python*/site-packages/envace_probe-1.0.dist-info")
    return (info / "INSTALLER").read_text().strip()


def test_pips_find_links_constraints_and_index_reach_uv_and_extra_indexes_do_not(
    tmp_path: Path,
) -> None:
    """What `pip config list` holds (here from PIP_* variables) becomes uv's options; local
    folders this machine lacks and the extra indexes (whose files uv would prefer) are left out."""
    wheels, constraints = tmp_path / "wheels", tmp_path / "constraints.txt"
    wheels.mkdir()
    constraints.write_text("torch<=2.14.1\n")
    env = {
        **os.environ,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_FIND_LINKS": f"{wheels} {tmp_path / 'absent'}",
        "PIP_CONSTRAINT": str(constraints),
        "PIP_INDEX_URL": "https://mirror.example/simple",
        "PIP_EXTRA_INDEX_URL": f"file://{wheels}",
    }
    bare = tmp_path / "bare"  # a venv without pip: the machine's pip reads the same settings
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    for venv in (Path(sys.executable).parents[1], bare):
        script = f"source {PYINSTALL}; _pyinstall_pip_options {venv}"
        proc = subprocess.run(
            ["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        options = proc.stdout.split("\n")[:-1]
        pairs = sorted(zip(options[::2], options[1::2], strict=True))
        assert pairs == [
            ("--constraint", str(constraints)),
            ("--default-index", "https://mirror.example/simple"),
            ("--find-links", str(wheels)),
        ], venv


def test_installs_go_through_uv(tmp_path: Path, probe_wheels: Path) -> None:
    beside = Path(sys.executable).parent / "uv"
    uv = str(beside) if beside.exists() else shutil.which("uv")
    if uv is None:
        pytest.skip(
            f"no uv next to {sys.executable} nor on PATH: `make test` installs it (UV_SPEC)"
        )
    venv = _venv(tmp_path)
    proc = _pyinstall(venv, "--no-index", "--find-links", str(probe_wheels), "envace_probe", UV=uv)
    assert proc.returncode == 0, proc.stderr
    assert _installer(venv) == "uv"
    assert "installing with pip instead" not in proc.stderr


def test_a_failing_uv_falls_back_to_pip_and_says_so(tmp_path: Path, probe_wheels: Path) -> None:
    broken = tmp_path / "uv"
    broken.write_text("#!/bin/sh\necho 'uv: broken on purpose' >&2\nexit 2\n")
    broken.chmod(0o755)
    venv = _venv(tmp_path)
    proc = _pyinstall(
        venv, "--no-index", "--find-links", str(probe_wheels), "envace_probe", UV=str(broken)
    )
    assert proc.returncode == 0, proc.stderr
    assert "uv: broken on purpose" in proc.stderr
    assert f"uv ({broken}) failed to install" in proc.stderr and "with pip instead" in proc.stderr
    assert _installer(venv) == "pip"


def test_pip_only_and_a_missing_venv(tmp_path: Path, probe_wheels: Path) -> None:
    venv = _venv(tmp_path)
    args = ("--no-index", "--find-links", str(probe_wheels), "envace_probe")
    proc = _pyinstall(venv, *args, ENVACE_PIP_ONLY="1", UV="/nonexistent/uv")
    assert proc.returncode == 0, proc.stderr
    assert _installer(venv) == "pip"
    missing = _pyinstall(tmp_path / "nowhere", *args)
    assert missing.returncode == 2
    assert f"{tmp_path / 'nowhere'}/bin/python not found: create the venv first" in missing.stderr
