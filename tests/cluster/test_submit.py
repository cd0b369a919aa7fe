"""`envace cluster submit | status | cancel | check` against a fake Kubernetes API server.

No Kubernetes API server can run on CI machines (kind and an apiserver binary are not installable),
so these tests use a test double at the HTTP level (cluster_testlib.FakeCluster): the real
`kubernetes` client sends real requests to localhost; the fake stores what is created, plays the
Kubeflow Trainer controller by returning a scripted sequence of TrainJob statuses, and records
every request so the tests can assert the created objects, the delete on cancel and the errors.
"""

from __future__ import annotations

import argparse
import logging
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_testlib import (
    FakeApiServer,
    ManifestValidator,
    condition,
    vendored_crd,
    write_kubeconfig,
)

import envace.cluster.cli as cluster_cli
from envace.cluster.submit import FollowTimeoutError, TrainJobState, follow
from envace.cluster.trainjob import TrainJobSpec, build_trainjob

PROGRESS_LINE = "Running | node: active=2 ready=2 | 40% | ETA 0:13:20 | loss=0.53 reward=0.61"
CONFIG = "seed: 0\nmodel:\n  preset: tiny-4m\ntrain:\n  iterations: 2\n"

RUNNING = {
    "jobsStatus": [
        {"name": "node", "active": 2, "ready": 2, "succeeded": 0, "failed": 0, "suspended": 0}
    ]
}
PROGRESS = {
    **RUNNING,
    "trainerStatus": {
        "progressPercentage": 40,
        "estimatedRemainingSeconds": 800,
        "lastUpdatedTime": "2026-11-29T20:05:00Z",
        "metrics": [{"name": "loss", "value": "0.53"}, {"name": "reward", "value": "0.61"}],
    },
}
COMPLETE = {
    "conditions": [condition("Complete", "TrainJob is completed")],
    "jobsStatus": [
        {"name": "node", "active": 0, "ready": 0, "succeeded": 2, "failed": 0, "suspended": 0}
    ],
}
FAILED = {
    "conditions": [condition("Failed", "jobset failed: node-0 exited with code 1")],
    "jobsStatus": [
        {"name": "node", "active": 0, "ready": 0, "succeeded": 0, "failed": 1, "suspended": 0}
    ],
}


def _run(argv: list[str]) -> int:
    """Parse with only `envace cluster` registered (isolated from other modules) and dispatch."""
    parser = argparse.ArgumentParser(prog="envace")
    cluster_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.yaml"
    path.write_text(CONFIG)
    return path


def _submit_argv(fake: FakeApiServer, config: Path, *extra: str) -> list[str]:
    return [
        "cluster",
        "submit",
        "--config",
        str(config),
        "--name",
        "run-1",
        "--kubeconfig",
        str(fake.kubeconfig),
        "--poll-interval",
        "0.001",
        *extra,
    ]


def test_submit_creates_the_job_and_follows_it_to_completion(
    fake_api: FakeApiServer,
    config_file: Path,
    capsys: pytest.CaptureFixture[str],
    validator: ManifestValidator,
) -> None:
    fake_api.cluster.statuses = [{}, RUNNING, RUNNING, PROGRESS, COMPLETE]
    code = _run(
        _submit_argv(
            fake_api,
            config_file,
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--toleration",
            "nvidia.com/gpu:NoSchedule",
        )
    )
    assert code == 0
    (post,) = fake_api.cluster.calls("POST", r"/trainjobs$")
    assert (
        post.path == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs"
    )  # context ns
    expected = build_trainjob(
        TrainJobSpec(
            name="run-1",
            namespace="team-a",
            nodes=2,
            gpus_per_node=8,
            # --gpus-per-node alone: CPU and memory come from the runtime's node requests
            cpu="8",
            memory="64Gi",
            tolerations=(cluster_cli.parse_toleration("nvidia.com/gpu:NoSchedule"),),
        )
    )
    assert post.body == expected
    validator.assert_valid([post.body])
    (config_map,) = fake_api.cluster.configmaps.values()
    assert config_map["data"] == {"config.yaml": CONFIG}
    owner = config_map["metadata"]["ownerReferences"][0]
    assert owner["uid"] == fake_api.cluster.trainjobs["run-1"]["metadata"]["uid"]
    validator.assert_valid([config_map])
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "created TrainJob team-a/run-1: 2 node(s) x 8 process(es), runtime envace, run run-1",
        "team-a/run-1: Pending",
        "team-a/run-1: Running | node: active=2 ready=2",  # printed once, though polled twice
        f"team-a/run-1: {PROGRESS_LINE}",
        "team-a/run-1: Complete | node: succeeded=2 | TrainJob is completed",
    ]
    assert not fake_api.cluster.calls("DELETE", "trainjobs")


def test_failed_job_exits_1_with_the_reason(
    fake_api: FakeApiServer, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.cluster.statuses = [RUNNING, FAILED]
    assert _run(_submit_argv(fake_api, config_file)) == 1
    err = capsys.readouterr().err
    assert "TrainJob team-a/run-1 failed: jobset failed: node-0 exited with code 1" in err


def test_ctrl_c_cancels_the_job(
    fake_api: FakeApiServer,
    config_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake_api.cluster.statuses = [RUNNING]

    def interrupted(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster_cli, "_sleep", interrupted)
    assert _run(_submit_argv(fake_api, config_file)) == 130
    (delete,) = fake_api.cluster.calls("DELETE", r"/trainjobs/run-1$")
    assert delete.path == "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/run-1"
    assert "propagationPolicy=Background" in delete.query  # pods and ConfigMap are collected
    assert "run-1" not in fake_api.cluster.trainjobs
    assert "cancelled: deleted TrainJob team-a/run-1" in capsys.readouterr().err


def test_timeout_cancels_the_job(
    fake_api: FakeApiServer, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.cluster.statuses = [RUNNING]
    assert _run(_submit_argv(fake_api, config_file, "--timeout", "0.001")) == 1
    assert fake_api.cluster.calls("DELETE", r"/trainjobs/run-1$")
    assert "did not finish within 0.001 s" in capsys.readouterr().err


def test_cancel_command(
    fake_api: FakeApiServer, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(_submit_argv(fake_api, config_file, "--detach", "-n", "other")) == 0
    assert "follow: envace cluster status run-1 -n other --follow" in capsys.readouterr().out
    assert not fake_api.cluster.calls("GET", r"/trainjobs/run-1$")  # detached: not followed
    assert (
        _run(
            ["cluster", "cancel", "run-1", "-n", "other", "--kubeconfig", str(fake_api.kubeconfig)]
        )
        == 0
    )
    assert fake_api.cluster.calls("DELETE", r"/namespaces/other/trainjobs/run-1$")
    assert "cancelled: deleted TrainJob other/run-1" in capsys.readouterr().out
    assert (
        _run(
            ["cluster", "cancel", "run-1", "-n", "other", "--kubeconfig", str(fake_api.kubeconfig)]
        )
        == 1
    )
    err = capsys.readouterr().err
    # The Status object's message, not its raw JSON.
    assert (
        'deleting TrainJob other/run-1: HTTP 404: trainjobs.trainer.kubeflow.org "run-1" not found'
        in err
    )
    assert '"kind"' not in err and "may still be running" not in err


def test_status_command(
    fake_api: FakeApiServer, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run(_submit_argv(fake_api, config_file, "--detach")) == 0
    fake_api.cluster.statuses = [PROGRESS]
    fake_api.cluster.gets = 0
    capsys.readouterr()
    assert _run(["cluster", "status", "run-1", "--kubeconfig", str(fake_api.kubeconfig)]) == 0
    assert capsys.readouterr().out == f"team-a/run-1: {PROGRESS_LINE}\n"
    fake_api.cluster.statuses = [RUNNING, COMPLETE]
    fake_api.cluster.gets = 0
    argv = [
        "cluster",
        "status",
        "run-1",
        "--follow",
        "--poll-interval",
        "0.001",
        "--kubeconfig",
        str(fake_api.kubeconfig),
    ]
    assert _run(argv) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("team-a/run-1: Complete")


def test_missing_kubeflow_trainer_names_the_prerequisite(
    fake_api: FakeApiServer, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.cluster.trainer_installed = False
    assert _run(_submit_argv(fake_api, config_file)) == 1
    err = capsys.readouterr().err
    assert "Kubeflow Trainer is not installed" in err
    assert "trainer.kubeflow.org/v1alpha1" in err
    assert "docs/cluster.md" in err
    assert not fake_api.cluster.calls("POST", "")


def test_missing_runtime_names_the_chart(
    fake_api: FakeApiServer, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.cluster.runtimes = set()
    assert _run(_submit_argv(fake_api, config_file)) == 1
    err = capsys.readouterr().err
    assert "TrainingRuntime 'envace' not found in namespace team-a" in err
    assert "helm install envace charts/envace -n team-a" in err
    fake_api.cluster.cluster_runtimes = {"envace-h100"}
    assert (
        _run(
            _submit_argv(
                fake_api, config_file, "--runtime", "envace-h100", "--cluster-runtime", "--detach"
            )
        )
        == 0
    )
    assert (
        fake_api.cluster.trainjobs["run-1"]["spec"]["runtimeRef"]["kind"]
        == "ClusterTrainingRuntime"
    )


@pytest.mark.parametrize(
    ("fail", "message"),
    [
        ({"POST /trainjobs$": 409}, "it already exists; pick another --name"),
        ({"POST /trainjobs$": 403}, "forbidden (403)"),
        ({"POST /trainjobs$": 401}, "rejected the credentials"),
    ],
)
def test_api_errors_are_explained(
    fake_api: FakeApiServer,
    config_file: Path,
    capsys: pytest.CaptureFixture[str],
    fail: dict[str, int],
    message: str,
) -> None:
    fake_api.cluster.fail = fail
    assert _run(_submit_argv(fake_api, config_file)) == 1
    err = capsys.readouterr().err
    assert "creating TrainJob team-a/run-1" in err
    assert message in err


def test_config_map_failure_removes_the_job_again(
    fake_api: FakeApiServer, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.cluster.fail = {"POST /configmaps$": 500}
    assert _run(_submit_argv(fake_api, config_file)) == 1
    assert "creating ConfigMap run-1-config: HTTP 500" in capsys.readouterr().err
    assert fake_api.cluster.calls("DELETE", r"/trainjobs/run-1$")
    assert fake_api.cluster.trainjobs == {}


def test_unreachable_api_server(
    tmp_path: Path, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "gone",
                "clusters": [{"name": "gone", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "gone", "context": {"cluster": "gone", "user": "u"}}],
            }
        )
    )
    argv = ["cluster", "submit", "--config", str(config_file), "--kubeconfig", str(kubeconfig)]
    assert _run(argv) == 1
    assert (
        f"cannot reach the Kubernetes API server at http://127.0.0.1:{port}"
        in capsys.readouterr().err
    )


def test_bad_kubeconfig(
    tmp_path: Path, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "cluster",
        "submit",
        "--config",
        str(config_file),
        "--kubeconfig",
        str(tmp_path / "none"),
    ]
    assert _run(argv) == 1
    assert "cannot load the kubeconfig" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--poll-interval", "-1", "--poll-interval must be a number of seconds above 0"),
        ("--poll-interval", "0", "--poll-interval must be a number of seconds above 0"),
        ("--poll-interval", "nan", "--poll-interval must be a number of seconds above 0"),
        ("--poll-interval", "1e12", "at most 86400"),
        ("--timeout", "-1", "--timeout must be a number of seconds above 0"),
        ("--timeout", "0", "--timeout must be a number of seconds above 0"),
        ("--timeout", "inf", "--timeout must be a number of seconds above 0"),
    ],
)
def test_bad_follow_seconds_are_refused_before_anything_is_created(
    fake_api: FakeApiServer, config_file: Path, flag: str, value: str, message: str
) -> None:
    """A negative interval used to crash the follow loop after the TrainJob was created (leaving it
    running), 0 polled without a pause and a timeout <= 0 deleted the job at once."""
    fake_api.cluster.statuses = [RUNNING]
    with pytest.raises(cluster_cli.UserInputError, match=message):
        _run(_submit_argv(fake_api, config_file, flag, value))
    status = ["cluster", "status", "run-1", "--follow", flag, value]
    with pytest.raises(cluster_cli.UserInputError, match=message):
        _run([*status, "--kubeconfig", str(fake_api.kubeconfig)])
    assert fake_api.cluster.requests == []  # not even a preflight read


def test_bad_follow_seconds_exit_2_through_the_envace_command(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from envace.cli import main

    argv = ["cluster", "submit", "--config", str(config_file), "--poll-interval", "-1"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "envace: error: --poll-interval must be a number of seconds above 0 and at most 86400,"
        " got -1; e.g. --poll-interval 10\n"
    )


@pytest.mark.parametrize("run_name", ["../other", "/abs", "a b", ".", "-x"])
def test_bad_run_name_is_refused_before_anything_is_created(
    fake_api: FakeApiServer, config_file: Path, run_name: str
) -> None:
    with pytest.raises(cluster_cli.UserInputError, match=r"^--run-name .*e\.g\. --run-name exp1$"):
        _run(_submit_argv(fake_api, config_file, f"--run-name={run_name}", "--detach"))
    assert fake_api.cluster.requests == []
    with pytest.raises(cluster_cli.UserInputError, match="--run-name"):
        _run(
            [
                "cluster",
                "submit",
                "--config",
                str(config_file),
                f"--run-name={run_name}",
                "--dry-run",
            ]
        )


def test_follow_failure_says_the_job_may_still_run(
    fake_api: FakeApiServer, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An API failure while following is not the job's failure: it is left running, and said so."""
    fake_api.cluster.fail = {"GET /trainjobs/run-1$": 500}
    assert _run(_submit_argv(fake_api, config_file)) == 1
    err = capsys.readouterr().err
    assert "reading TrainJob team-a/run-1: HTTP 500: injected 500" in err
    assert (
        "The TrainJob may still be running: check it with `envace cluster status run-1 -n team-a`"
        in err
    )
    assert "run-1" in fake_api.cluster.trainjobs  # not cancelled: following failed, not the job
    assert not fake_api.cluster.calls("DELETE", "trainjobs")
    argv = ["cluster", "status", "run-1", "--follow", "--kubeconfig", str(fake_api.kubeconfig)]
    assert _run(argv) == 1
    assert "may still be running" in capsys.readouterr().err
    fake_api.cluster.fail = {}
    del fake_api.cluster.trainjobs["run-1"]
    assert _run(argv) == 1  # a 404: the job is gone, nothing is still running
    err = capsys.readouterr().err
    assert 'HTTP 404: trainjobs.trainer.kubeflow.org "run-1" not found' in err
    assert "may still be running" not in err


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (
            "a: [unclosed\n",
            "not valid YAML (expected ',' or ']', but got '<stream end>' at line 2)",
        ),
        ("- a list\n", "not a kubeconfig"),
        ("42\n", "not a kubeconfig"),
        ("current-context: x\ncontexts: [{name: x, context: 7}]\n", "not a kubeconfig"),
        (b"\xff\xfe", "not UTF-8 text"),
        ("", "is empty"),
    ],
)
def test_malformed_kubeconfig_is_one_line_naming_the_file(
    tmp_path: Path,
    config_file: Path,
    capsys: pytest.CaptureFixture[str],
    content: str | bytes,
    problem: str,
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    if isinstance(content, bytes):
        kubeconfig.write_bytes(content)
    else:
        kubeconfig.write_text(content)
    for argv in (
        ["cluster", "submit", "--config", str(config_file)],
        ["cluster", "status", "run-1"],
        ["cluster", "check"],
    ):
        assert _run([*argv, "--kubeconfig", str(kubeconfig)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"envace: error: cannot load the kubeconfig ({kubeconfig}): ")
        assert problem in err and err.count("\n") == 1


def test_dry_run_names_the_kubeconfig_namespace_it_assumed(
    fake_api: FakeApiServer, config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real submit uses the context's namespace (team-a); the dry run now prints the same."""
    argv = ["cluster", "submit", "--config", str(config_file), "--name", "dry", "--dry-run"]
    assert _run([*argv, "--kubeconfig", str(fake_api.kubeconfig)]) == 0
    out, err = capsys.readouterr()
    assert yaml.safe_load_all(out).__next__()["metadata"]["namespace"] == "team-a"
    assert err == (
        "envace: dry run for namespace team-a (the namespace of kubeconfig context 'fake');"
        " -n NAMESPACE picks another\n"
    )
    assert _run([*argv, "--kubeconfig", str(fake_api.kubeconfig), "--context", "nope"]) == 0
    assert "namespace default (no kubeconfig context could be loaded)" in capsys.readouterr().err
    assert _run([*argv, "--kubeconfig", str(fake_api.kubeconfig), "-n", "other"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and yaml.safe_load_all(out).__next__()["metadata"]["namespace"] == "other"
    assert fake_api.cluster.requests == []  # a dry run contacts no cluster


def test_no_urllib3_retry_warning_before_a_cluster_error(
    tmp_path: Path, config_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The retry of a refused connection used to print urllib3's "WARNING Retrying (...)" line
    before our own error; other urllib3 users (the store's S3 client) keep theirs."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", f"http://127.0.0.1:{port}")
    with caplog.at_level(logging.DEBUG):
        argv = ["cluster", "status", "run-1", "--kubeconfig", str(kubeconfig)]
        assert _run(argv) == 1
        retries = [r for r in caplog.records if "Retrying" in r.getMessage()]
        assert retries, "the refused connection was not retried: the test proves nothing"
        assert all(
            r.levelno == logging.DEBUG and r.name == "envace.cluster.submit" for r in retries
        )
        caplog.clear()
        logging.getLogger("urllib3.connectionpool").warning("Retrying (%s)", "store")
    assert [r.levelno for r in caplog.records] == [logging.WARNING]


def test_check_lists_prerequisites(
    fake_api: FakeApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.cluster.gpus = {"gpu-a": 8, "gpu-b": 8, "cpu-a": 0}
    assert _run(["cluster", "check", "--kubeconfig", str(fake_api.kubeconfig)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "ok",
        "Kubeflow",
        "Trainer",
        "trainer.kubeflow.org/v1alpha1",
        "served",
    ]
    assert out[1].split()[:2] == ["ok", "JobSet"]
    assert out[2].split()[:5] == ["ok", "Kubeflow", "Trainer", ">=", "2.2.0"]
    assert "TrainingRuntime 'envace' found" in out[3]
    assert out[4].startswith("absent") and "Kubeflow Pipelines (Argo)" in out[4]
    assert out[5].startswith("ok") and "16 GPUs on 2 nodes (gpu-a: 8, gpu-b: 8)" in out[5]
    assert len(out) == 6  # no KFP served: its version is not checked
    fake_api.cluster.groups = (("trainer.kubeflow.org", "v1alpha1"),)
    fake_api.cluster.gpus = {}
    assert _run(["cluster", "check", "--kubeconfig", str(fake_api.kubeconfig)]) == 1
    out = capsys.readouterr().out
    assert "MISSING  JobSet" in out
    assert "no node has allocatable nvidia.com/gpu" in out


def test_check_refuses_a_trainer_without_the_fields_we_set(
    fake_api: FakeApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Trainer older than v2.2 serves a TrainJob schema without `runtimePatches` (the
    vendored CRD with that field removed stands in for v2.1's): `check` fails and says how to
    upgrade. Stand-in API server: no Kubernetes API server runs here."""
    crd = vendored_crd("trainjobs")
    del crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
        "runtimePatches"
    ]
    fake_api.cluster.trainjob_crd = crd
    assert _run(["cluster", "check", "--kubeconfig", str(fake_api.kubeconfig)]) == 1
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "Trainer >=" in x]
    assert line.startswith("MISSING  Kubeflow Trainer >= 2.2.0")
    assert "lacks spec.runtimePatches (an older Trainer): upgrade with kubectl apply" in line
    assert "manager?ref=v2.2.0" in line
    fake_api.cluster.fail["GET customresourcedefinitions"] = 403
    assert _run(["cluster", "check", "--kubeconfig", str(fake_api.kubeconfig)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "Trainer >=" in x]
    assert line.startswith("warning") and "cannot read CRD trainjobs.trainer.kubeflow.org" in line


@pytest.mark.parametrize(
    ("image", "status", "detail"),
    [
        ("ghcr.io/kubeflow/kfp-api-server:2.15.0", "ok", "kubeflow/ml-pipeline runs 2.15.0"),
        ("gcr.io/ml-pipeline/api-server:2.4.0", "warning", "runs 2.4.0: its driver rejects"),
        ("ghcr.io/kubeflow/kfp-api-server:v2.16.1-rc.1", "ok", "runs 2.16.1"),
        ("registry.local/kfp-api-server@sha256:abc", "warning", "no version tag"),
    ],
)
def test_check_reads_the_kfp_version(
    fake_api: FakeApiServer,
    capsys: pytest.CaptureFixture[str],
    image: str,
    status: str,
    detail: str,
) -> None:
    fake_api.cluster.groups += (("argoproj.io", "v1alpha1"),)
    fake_api.cluster.kfp_image = image
    fake_api.cluster.gpus = {"gpu-a": 1}
    assert _run(["cluster", "check", "--kubeconfig", str(fake_api.kubeconfig)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if "Pipelines >=" in x]
    assert line.split()[0] == status
    assert "Kubeflow Pipelines >= 2.15.0" in line and detail in line


def test_dry_run_prints_valid_objects_without_a_cluster(
    config_file: Path, capsys: pytest.CaptureFixture[str], validator: ManifestValidator
) -> None:
    argv = [
        "cluster",
        "submit",
        "--config",
        str(config_file),
        "--name",
        "dry",
        "--gpus-per-node",
        "1",
        "--kubeconfig",
        "/nonexistent",
        "--dry-run",
    ]
    # GPUs replace the runtime's resources, and a dry run reads no runtime: CPU and memory too.
    with pytest.raises(cluster_cli.UserInputError, match="give --cpu and --memory too"):
        _run(argv)
    assert capsys.readouterr().out == ""
    argv += ["--cpu", "4", "--memory", "16Gi"]
    assert _run(argv) == 0
    out, err = capsys.readouterr()
    assert err == (
        "envace: dry run for namespace default (no kubeconfig context could be loaded);"
        " -n NAMESPACE picks another\n"
    )
    trainjob, config_map = yaml.safe_load_all(out)
    quantities = {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 1}
    assert trainjob["spec"]["trainer"]["resourcesPerNode"] == {
        "requests": quantities,
        "limits": quantities,
    }
    assert trainjob["metadata"] == {
        "name": "dry",
        "namespace": "default",
        "labels": {"app.kubernetes.io/part-of": "envace", "app.kubernetes.io/component": "train"},
    }
    assert config_map["data"]["config.yaml"] == CONFIG
    validator.assert_valid([trainjob, config_map])


def test_submit_queue_flag_reaches_the_trainjob_label(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["cluster", "submit", "--config", str(config_file), "--name", "q", "--dry-run"]
    assert _run([*argv, "--kubeconfig", "/nonexistent", "--queue", "team-a"]) == 0
    trainjob, _ = yaml.safe_load_all(capsys.readouterr().out)
    assert trainjob["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    with pytest.raises(cluster_cli.UserInputError, match="--queue 'A_B' is not a LocalQueue"):
        _run([*argv, "--kubeconfig", "/nonexistent", "--queue", "A_B"])


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read it"),
        ("a: [unclosed\n", "not valid YAML"),
        ("- a list\n", "the top level must be a mapping of config sections"),
    ],
)
def test_bad_config_file_is_a_user_error(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "config.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(cluster_cli.UserInputError, match=message):
        _run(["cluster", "submit", "--config", str(path), "--dry-run"])


def test_wired_into_the_envace_command(
    config_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from envace.cli import main

    assert (
        main(["cluster", "submit", "--config", str(config_file), "--name", "BAD", "--dry-run"]) == 2
    )
    assert "job name 'BAD' is not a DNS label" in capsys.readouterr().err


class _Reader:
    """A thin TrainJobReader for follow(): the statuses it returns, one per get()."""

    namespace = "ns"

    def __init__(self, statuses: list[dict[str, Any]]) -> None:
        self.statuses = statuses
        self.gets = 0

    def get(self, name: str) -> dict[str, Any]:
        status = self.statuses[min(self.gets, len(self.statuses) - 1)]
        self.gets += 1
        return {"metadata": {"name": name}, "status": status}


def test_follow_polls_until_finished_and_reports_changes_only() -> None:
    reader = _Reader([{}, {}, RUNNING, RUNNING, PROGRESS, COMPLETE])
    lines: list[str] = []
    sleeps: list[float] = []
    state = follow(reader, "job", interval=5, emit=lines.append, sleep=sleeps.append)
    assert state.succeeded and state.phase == "Complete"
    assert reader.gets == 6
    assert sleeps == [5, 5, 5, 5, 5]
    assert [line.split(" | ")[0] for line in lines] == [
        "ns/job: Pending",
        "ns/job: Running",
        "ns/job: Running",
        "ns/job: Complete",
    ]


def test_follow_timeout_uses_the_clock() -> None:
    ticks = iter([0.0, 10.0, 20.0, 31.0])
    with pytest.raises(FollowTimeoutError, match="did not finish within 30 s"):
        follow(
            _Reader([RUNNING]),
            "job",
            interval=1,
            emit=lambda _: None,
            timeout=30,
            sleep=lambda _: None,
            clock=lambda: next(ticks),
        )


@pytest.mark.parametrize(
    ("status", "phase"),
    [
        ({}, "Pending"),
        ({"conditions": [condition("Suspended", "suspended by Kueue")]}, "Suspended"),
        ({"conditions": [condition("Complete", status="False")], **RUNNING}, "Running"),
        (COMPLETE, "Complete"),
        (FAILED, "Failed"),
    ],
)
def test_state_from_status(status: dict[str, Any], phase: str) -> None:
    state = TrainJobState.from_object({"status": status})
    assert state.phase == phase
    assert state.finished == (phase in ("Complete", "Failed"))
