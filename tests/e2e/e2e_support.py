"""Helpers of the end-to-end tier (real Docker images, a real kind cluster); fixtures: conftest.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
_VERSION = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
VERSION = _VERSION[1] if _VERSION else "0.0.0"
CPU_IMAGE = f"envace-cpu:{VERSION}"


def docker_daemon_problem() -> str | None:
    """None when a Docker daemon answers; otherwise why not (the skip reason)."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed"
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not Path(host.removeprefix("unix://")).exists():
        return f"no Docker daemon socket at {host} (start dockerd or set DOCKER_HOST; see docs/images.md)"
    probe = subprocess.run(
        ["docker", "version", "--format", "{{.Server.Version}}"],
        capture_output=True,
        text=True,
        timeout=20,
        check=False,
    )
    if probe.returncode != 0:
        return f"the Docker daemon at {host} does not answer: {probe.stderr.strip()[:200]}"
    return None


def run(
    argv: list[str], timeout: float = 600, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )  # type: ignore[call-overload]
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(argv)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result  # type: ignore[no-any-return]


def ensure_cpu_image() -> str:
    """The CPU image, built by docker/build_images.sh unless the daemon already has it."""
    present = subprocess.run(
        ["docker", "image", "inspect", CPU_IMAGE], capture_output=True, check=False
    )
    if present.returncode != 0 or os.environ.get("ENVACE_E2E_REBUILD") == "1":
        run(
            [str(REPO / "docker" / "build_images.sh"), "cpu"],
            timeout=3600,
            env={**os.environ, "TAG": VERSION},
        )
    return CPU_IMAGE


# configs/local.yaml shrunk to a run of seconds: same stages, tiny sizes.
SMOKE_OVERRIDES = {
    "model.preset": "test-micro",
    "model.dtype": "float32",
    "train.trainable": "full",
    "train.top_layers": None,
    "tasks.n_train": 8,
    "tasks.n_test": 4,
    "rollout.n": 2,
    "rollout.batch_tasks": 2,
    "rollout.caller_max_new_tokens": 32,
    "rollout.simulator_max_new_tokens": 32,
    "train.iterations": 1,
    "train.save_every": 1,
    "warm_start.epochs": 1,
    "eval.max_tasks": 2,
}


def write_smoke_config(folder: Path) -> Path:
    """configs/local.yaml with SMOKE_OVERRIDES applied, written to folder/smoke.yaml."""
    config = yaml.safe_load((REPO / "configs" / "local.yaml").read_text())
    for dotted, value in SMOKE_OVERRIDES.items():
        section, key = dotted.split(".")
        config.setdefault(section, {})[key] = value
    path = folder / "smoke.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o644)  # read by the container user
    folder.chmod(0o755)
    return path
