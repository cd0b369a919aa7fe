"""charts/envace: lint, render with default and non-default values, validate every object offline.

helm runs for real (`helm lint --strict`, `helm template`); objects are validated against the
Kubernetes schemas and the Kubeflow Trainer CRDs (see conftest.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests_cluster_helpers import (  # type: ignore[import-not-found]
    CHART,
    REPO,
    containers_of,
    find,
    pod_specs,
)

VALUE_FILES = ("kind-values.yaml", "gpu-values.yaml", "external-store-values.yaml")
