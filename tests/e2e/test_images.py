"""The CPU image, really built and run: `envace --help` and a short `envace run` in a container.

Runs where a Docker daemon is reachable (`make test-images`); see docs/images.md for building the
base image offline (scripts/build_base_image.sh) and the build knobs. The container runs the way
the chart runs pods: as uid 10000, read-only root file system, no network.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from e2e_support import docker_daemon_problem, run

_problem = docker_daemon_problem()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(_problem is not None, reason=f"needs a Docker daemon: {_problem}"),
]

_LOCKED_DOWN = ["--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp"]


def test_help_runs_as_the_unprivileged_user(cpu_image: str) -> None:
    help_text = run(["docker", "run", *_LOCKED_DOWN, cpu_image, "--help"], timeout=120).stdout
    assert help_text.startswith("usage: envace")
    for command in ("run", "train", "cluster"):
        assert command in help_text
    identity = run(
        ["docker", "run", *_LOCKED_DOWN, "--entrypoint", "id", cpu_image], timeout=60
    ).stdout
    assert identity.startswith("uid=10000(envace) gid=10000(envace)")
    configs = run(
        ["docker", "run", *_LOCKED_DOWN, "--entrypoint", "ls", cpu_image, "/opt/envace/configs"]
    ).stdout
    assert {"local.yaml", "gpu-1.yaml", "reference-8b.yaml"} <= set(configs.split())


def test_short_envace_run_in_the_container(
    cpu_image: str, smoke_config: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # the container user (10000) writes here
    run(
        [
            "docker",
            "run",
            *_LOCKED_DOWN,
            "--tmpfs",
            "/home/envace:uid=10000,gid=10000,size=2g",
            "-v",
            f"{smoke_config}:/config/smoke.yaml:ro",
            "-v",
            f"{out}:/out",
            cpu_image,
            "run",
            "--config",
            "/config/smoke.yaml",
            "--out",
            "/out/run",
        ],
        timeout=900,
    )
    run_dir = out / "run"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {"stages", "artifacts"} <= set(summary)
    manifest = json.loads((run_dir / "checkpoints" / "final" / "MANIFEST.json").read_text())
    assert "model.safetensors" in {entry["path"] for entry in manifest["files"]}
    assert (run_dir / "tasks" / "MANIFEST.json").is_file()
