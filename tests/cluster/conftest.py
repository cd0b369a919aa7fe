"""Fixtures of the cluster tests; the machinery is in cluster_testlib.py (put on sys.path here)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cluster_testlib import (
    FakeApiServer,
    ManifestValidator,
    helm_binary,
    kubectl_binary,
    serve_fake_api,
)


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm binary (.tools/bin/helm from scripts/install_tools.sh); fails, never skips."""
    return helm_binary()


@pytest.fixture(scope="session")
def kubectl() -> str:
    """kubectl for `kubectl kustomize`; fails, never skips."""
    return kubectl_binary()


@pytest.fixture(scope="session")
def validator() -> ManifestValidator:
    return ManifestValidator()


@pytest.fixture
def fake_api(tmp_path: Path) -> Iterator[FakeApiServer]:
    """A fake Kubernetes API server (see cluster_testlib.FakeCluster) and a kubeconfig for it."""
    with serve_fake_api(tmp_path) as server:
        yield server
