"""Write docker/constraints-cpu.txt: exact versions of the `envace[pipelines,tracking]` closure.

Resolved from the packages installed in the running interpreter (the project's .venv), so the CPU
image installs what the tests ran against. torch is left out: the Dockerfile pins it by itself
(TORCH_VERSION) because its CPU build carries a local version suffix on some indexes.

    .venv/bin/python docker/lock_constraints.py
"""

from __future__ import annotations

import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = ("pipelines", "tracking")
SKIP = {"torch", "envace"}
HEADER = """\
# Exact versions of all the CPU image installs except torch (pinned on its own: TORCH_VERSION).
# The dependency closure of `envace[pipelines,tracking]`, resolved once on the CI machine (Python
# 3.11) and passed to pip as constraints, so rebuilding the image later installs the same set.
# Regenerate after changing pyproject.toml dependencies: .venv/bin/python docker/lock_constraints.py
"""


def _closure(roots: list[str]) -> dict[str, str]:
    pinned: dict[str, str] = {}
    pending = [Requirement(root) for root in roots]
    while pending:
        requirement = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in pinned:
            continue
        try:
            distribution = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            sys.exit(f"{requirement.name} is not installed here; install the project first")
        pinned[name] = distribution.version
        for text in distribution.requires or []:
            sub = Requirement(text)
            environments = [{"extra": extra} for extra in requirement.extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in environments):
                pending.append(sub)
    return pinned


def main() -> int:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    roots = list(project["dependencies"])
    for extra in EXTRAS:
        roots += project["optional-dependencies"][extra]
    pins = _closure(roots)
    lines = [f"{name}=={version}" for name, version in sorted(pins.items()) if name not in SKIP]
    (ROOT / "docker" / "constraints-cpu.txt").write_text(HEADER + "\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
