"""Policy scan of the rendered chart with checkov (real checkov, offline; part of `make test`).

Every value set (the defaults and each file in charts/envace/ci/) is rendered by real helm under
its own release name, so that in checkov's graph one set's NetworkPolicies never select another
set's pods. checkov does not look inside TrainingRuntime objects, so each runtime's pod template
is written next to the set's objects as the Job JobSet creates from it (a `replicatedJobs[]`
template is a JobTemplateSpec). checkov's kubernetes framework then scans the folder once (~8 s
on the CI machines; its helm framework would need the same `--api-versions` rendering, so the
test renders itself). The test fails on any failed check the skip lists below do not name, and
on a skip that no longer matches anything. The same list, with the reasons, is in
docs/cluster.md ("Policy scan").

checkov lives in its own venv (scripts/setup_checkov.sh, called by `make test`): installed into
.venv it would downgrade packaging, networkx and boto3/botocore.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_testlib import API_VERSIONS_FLAGS, CHART, REPO, load_objects, run_tool

CHECKOV = Path(
    os.environ.get("ENVACE_CHECKOV", REPO / ".cache" / "checkov-venv" / "bin" / "checkov")
)
NAMESPACE = "scan"
VALUE_SETS: dict[str, tuple[str, ...]] = {
    "default": (),
    **{path.stem: (path.name,) for path in sorted((CHART / "ci").glob("*.yaml"))},
}
# A deliberately weak set (pods as uid 1000): proves the scan sees every pod, the runtime's too.
WEAK = "weak"

# Failed checks accepted for every object, and why.
SKIPPED_EVERYWHERE = {
    "CKV_K8S_43": (
        "Image should use digest: every image is pinned to a release tag in values.yaml; a digest "
        "is the installer's choice (any `*.image.tag` may be `TAG@sha256:DIGEST`)."
    ),
    "CKV_K8S_15": (
        "Image Pull Policy should be Always: pinned tags do not move, so IfNotPresent spares a "
        "registry round trip per pod start, and kind loads images locally (`pullPolicy: Never`). "
        "Set `*.image.pullPolicy=Always` where a policy demands it."
    ),
}


@dataclass(frozen=True)
class Skip:
    """A failed check accepted on the resources whose checkov id matches `resource`."""

    check: str
    resource: str
    reason: str


SKIPPED_FOR = (
    Skip(
        "CKV_K8S_8",
        rf"^Pod\.{NAMESPACE}\.[^.]+-test$",
        "Liveness probe: the `helm test` Pod runs two commands to completion; probes are for "
        "long-running containers (checkov exempts Jobs for the same reason).",
    ),
    Skip(
        "CKV_K8S_9",
        rf"^Pod\.{NAMESPACE}\.[^.]+-test$",
        "Readiness probe: as CKV_K8S_8, nothing serves traffic from the `helm test` Pod.",
    ),
)
# CKV2_K8S_6 (every pod selected by a NetworkPolicy) is accepted in value sets that render no
# NetworkPolicy: networkPolicy.enabled is off by default because it needs a CNI that enforces
# policies and knowledge of where pipeline pods run. Sets that enable it must pass it.
NETWORK_POLICY_CHECK = "CKV2_K8S_6"


def _checkov() -> str:
    if not (CHECKOV.is_file() and os.access(CHECKOV, os.X_OK)):
        pytest.fail(
            f"checkov is not installed at {CHECKOV}: run `bash scripts/setup_checkov.sh` (make test "
            "does) or point ENVACE_CHECKOV at a checkov 3.3 binary. This scan must not be skipped.",
            pytrace=False,
        )
    return str(CHECKOV)


def _release(value_set: str) -> str:
    return f"scan-{value_set}"


def _render(
    helm: str, value_set: str, files: tuple[str, ...], sets: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    argv = [helm, "template", _release(value_set), str(CHART), "--namespace", NAMESPACE]
    argv += [*API_VERSIONS_FLAGS, *(a for f in files for a in ("-f", str(CHART / "ci" / f)))]
    argv += [a for item in sets for a in ("--set", item)]
    return load_objects(run_tool(argv).stdout)


def _runtime_jobs(objects: list[dict[str, Any]], release: str) -> list[dict[str, Any]]:
    """The Jobs JobSet would create from each runtime's replicatedJobs (one per TrainJob)."""
    jobs = []
    for obj in objects:
        if obj["kind"] not in ("TrainingRuntime", "ClusterTrainingRuntime"):
            continue
        for replicated in obj["spec"]["template"]["spec"]["replicatedJobs"]:
            template = replicated["template"]
            name = f"{release}-{obj['metadata']['name']}-{replicated['name']}"
            metadata = {**template.get("metadata", {}), "name": name, "namespace": NAMESPACE}
            jobs.append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": metadata,
                    "spec": template["spec"],
                }
            )
    return jobs


@dataclass(frozen=True)
class Finding:
    check: str
    resource: str
    value_set: str
    name: str

    def __str__(self) -> str:
        return f"{self.value_set}: {self.check} {self.resource} ({self.name})"


@pytest.fixture(scope="module")
def scan(helm: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Render every value set (plus the weak one) into one folder and scan it once."""
    folder = tmp_path_factory.mktemp("scan")
    renders = {name: (files, ()) for name, files in VALUE_SETS.items()}
    renders[WEAK] = ((), ("podSecurityContext.runAsUser=1000",))
    inventory = {}
    for name, (files, sets) in renders.items():
        objects = _render(helm, name, files, sets)
        objects += _runtime_jobs(objects, _release(name))
        (folder / f"{name}.yaml").write_text(yaml.safe_dump_all(objects))
        inventory[name] = objects
    env = {**os.environ, "BC_SKIP_MAPPING": "TRUE", "LOG_LEVEL": "WARNING"}
    argv = [_checkov(), "-d", str(folder), "--framework", "kubernetes", "--skip-download"]
    argv += ["--compact", "--output", "json"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert result.returncode in (0, 1), f"checkov crashed ({result.returncode}):\n{result.stderr}"
    report = json.loads(result.stdout)
    (report,) = report if isinstance(report, list) else [report]
    assert report["check_type"] == "kubernetes" and report["summary"]["parsing_errors"] == 0

    def findings(kind: str) -> list[Finding]:
        return [
            Finding(c["check_id"], c["resource"], Path(c["file_path"]).stem, c["check_name"])
            for c in report["results"][kind]
        ]

    return {
        "inventory": inventory,
        "failed": findings("failed_checks"),
        "passed": findings("passed_checks"),
    }


def _why_skipped(finding: Finding, inventory: dict[str, list[dict[str, Any]]]) -> str | None:
    if finding.check in SKIPPED_EVERYWHERE:
        return finding.check
    for skip in SKIPPED_FOR:
        if finding.check == skip.check and re.match(skip.resource, finding.resource):
            return f"{skip.check} {skip.resource}"
    if finding.check == NETWORK_POLICY_CHECK and not any(
        o["kind"] == "NetworkPolicy" for o in inventory[finding.value_set]
    ):
        return NETWORK_POLICY_CHECK
    return None


@pytest.mark.slow
def test_checkov_finds_nothing_beyond_the_documented_skips(scan: dict[str, Any]) -> None:
    failed = [f for f in scan["failed"] if f.value_set != WEAK]
    unexpected = [str(f) for f in failed if _why_skipped(f, scan["inventory"]) is None]
    assert unexpected == [], (
        "checkov failures (fix the chart, or skip with a reason):\n" + "\n".join(unexpected)
    )
    used = {_why_skipped(f, scan["inventory"]) for f in failed}
    declared = {
        *SKIPPED_EVERYWHERE,
        *(f"{s.check} {s.resource}" for s in SKIPPED_FOR),
        NETWORK_POLICY_CHECK,
    }
    assert declared - used == set(), "skips that match nothing any more: remove them"


@pytest.mark.slow
def test_the_scan_covers_every_value_set_and_runtime_pod(scan: dict[str, Any]) -> None:
    scanned = {(f.value_set, f.resource) for f in scan["passed"]}
    for value_set, objects in scan["inventory"].items():
        for job in (
            o for o in objects if o["kind"] == "Job" and o["metadata"]["name"].endswith("-node")
        ):
            resource = f"Job.{NAMESPACE}.{job['metadata']['name']}"
            assert (value_set, resource) in scanned, f"{value_set}: {resource} not scanned"
        assert any(s == value_set for s, _ in scanned), value_set
    runtimes = [
        s
        for s, o in scan["inventory"].items()
        if any(x["kind"].endswith("TrainingRuntime") for x in o)
    ]
    assert len(runtimes) >= 4  # default, kind, gpu, web identity


@pytest.mark.slow
def test_the_scan_fails_a_low_uid(scan: dict[str, Any]) -> None:
    """The weak set runs pods as uid 1000: checkov reports it, for the runtime's pods too."""
    low_uid = {
        f.resource for f in scan["failed"] if f.value_set == WEAK and f.check == "CKV_K8S_40"
    }
    release = _release(WEAK)
    assert f"Job.{NAMESPACE}.{release}-envace-node" in low_uid
    assert f"StatefulSet.{NAMESPACE}.{release}-envace-minio" in low_uid
    assert f"Pod.{NAMESPACE}.{release}-envace-test" in low_uid
    assert not [f for f in scan["failed"] if f.check == "CKV_K8S_40" and f.value_set != WEAK]


@pytest.mark.slow
def test_network_policies_cover_every_pod_when_enabled(scan: dict[str, Any]) -> None:
    with_policies = [
        s for s, o in scan["inventory"].items() if any(x["kind"] == "NetworkPolicy" for x in o)
    ]
    assert with_policies == ["gpu-values"]
    pods = [
        f for f in scan["passed"] if f.value_set == "gpu-values" and f.check == NETWORK_POLICY_CHECK
    ]
    # MinIO, bucket init, the vLLM server, the helm test Pod and the runtime's training pods
    assert len(pods) == 5, [f.resource for f in pods]
    assert not [
        f for f in scan["failed"] if f.value_set == "gpu-values" and f.check == NETWORK_POLICY_CHECK
    ]
