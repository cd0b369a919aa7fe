"""The end-to-end tier: real Docker images, a real kind cluster. See docs/cluster.md and docs/images.md.

Every test here is marked `e2e` and skipped, with the reason, where its tools are missing:
a reachable Docker daemon (DOCKER_HOST or /var/run/docker.sock) for the images, plus `kind`,
`kubectl`, `helm` and network access to install Kubeflow Trainer for the kind test.

Knobs (environment):
  CPU_BASE_IMAGE, WHEELS_DIR, BUILD_NETWORK, TORCH_INDEX_URL, PIP_CA_BUNDLE  passed to
      docker/build_images.sh when the CPU image has to be built
  ENVACE_E2E_REBUILD=1   rebuild envace-cpu:<version> even if the daemon already has it
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import ensure_cpu_image, write_smoke_config


@pytest.fixture(scope="session")
def cpu_image() -> str:
    """envace-cpu:<version>, built by docker/build_images.sh unless the daemon already has it."""
    return ensure_cpu_image()


@pytest.fixture(scope="session")
def smoke_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """configs/local.yaml shrunk to a run of seconds (e2e_support.SMOKE_OVERRIDES), as a file."""
    return write_smoke_config(tmp_path_factory.mktemp("config"))
