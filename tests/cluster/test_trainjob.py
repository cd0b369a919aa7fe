"""envace.cluster.trainjob: the TrainJob / ConfigMap objects `envace cluster submit` sends."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from cluster_testlib import ManifestValidator
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.cluster.trainjob import (
    JOB_CONFIG_PATH,
    Toleration,
    TrainJobSpec,
    build_config_map,
    build_trainjob,
    check_run_name,
    default_job_name,
    parse_key_value,
    parse_toleration,
    runtime_node_resources,
    with_runtime_resources,
)
from envace.errors import UserInputError


def _pod_patch(trainjob: dict[str, Any]) -> dict[str, Any]:
    (patch,) = trainjob["spec"]["runtimePatches"]
    assert patch["manager"] == "envace.dev/cli"
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return dict(job["template"]["spec"]["template"]["spec"])


def test_minimal_spec_defers_to_the_runtime() -> None:
    trainjob = build_trainjob(TrainJobSpec(name="run-1", namespace="team-a"))
    assert trainjob["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert trainjob["kind"] == "TrainJob"
    assert trainjob["metadata"]["name"] == "run-1"
    assert trainjob["metadata"]["namespace"] == "team-a"
    assert trainjob["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": "envace",
    }
    trainer = trainjob["spec"]["trainer"]
    assert trainer == {
        "command": ["torchrun", "--no-python", "envace", "train"],
        "args": [
            "--config",
            JOB_CONFIG_PATH,
            "--store",
            "minio://envace/runs",
            "--run-name",
            "run-1",
        ],
        "numNodes": 1,
        "numProcPerNode": 1,
    }  # no image, no resources: the runtime's apply
    pod = _pod_patch(trainjob)
    assert pod["volumes"] == [{"name": "envace-job-config", "configMap": {"name": "run-1-config"}}]
    assert pod["containers"] == [
        {
            "name": "node",
            "volumeMounts": [
                {"name": "envace-job-config", "mountPath": "/etc/envace-job", "readOnly": True}
            ],
        }
    ]
    assert "nodeSelector" not in pod and "tolerations" not in pod


def test_gpus_set_resources_and_one_process_per_gpu() -> None:
    spec = TrainJobSpec(
        name="big", namespace="ns", nodes=4, gpus_per_node=8, cpu="96", memory="1Ti"
    )
    trainer = build_trainjob(spec)["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (4, 8)
    assert spec.world_size == 32
    expected = {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": 8}
    assert trainer["resourcesPerNode"] == {"requests": expected, "limits": expected}


def _runtime(resources: dict[str, Any] | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "node"}
    if resources is not None:
        container["resources"] = resources
    pod = {"spec": {"template": {"spec": {"containers": [{"name": "init"}, container]}}}}
    jobs = [{"name": "initializer"}, {"name": "node", "template": pod}]
    return {"kind": "TrainingRuntime", "spec": {"template": {"spec": {"replicatedJobs": jobs}}}}


def test_gpus_alone_take_cpu_and_memory_from_the_runtime() -> None:
    runtime = _runtime({"requests": {"cpu": 12, "memory": "90Gi"}, "limits": {"cpu": 24}})
    spec = TrainJobSpec(name="g", namespace="ns", gpus_per_node=4)
    filled = with_runtime_resources(spec, runtime)
    assert (filled.cpu, filled.memory, filled.gpus_per_node) == ("12", "90Gi", 4)
    # what the user gave stays; only the unset one is taken
    mine = with_runtime_resources(TrainJobSpec(name="g", namespace="ns", cpu="6"), runtime)
    assert (mine.cpu, mine.memory) == ("6", "90Gi")
    with pytest.raises(UserInputError) as err:
        with_runtime_resources(spec, _runtime({"requests": {"cpu": "8"}}))
    assert str(err.value) == (
        "--gpus-per-node 4 replaces the resources of TrainingRuntime 'envace', which requests "
        "no memory for its node container: give --memory (e.g. --cpu 16 --memory 128Gi)"
    )
    with pytest.raises(UserInputError, match=r"requests no cpu or memory .* give --cpu and --mem"):
        with_runtime_resources(spec, _runtime(None))
    assert runtime_node_resources({"spec": {"template": "junk"}}) == {}


def test_explicit_processes_image_run_name_resume_env_scheduling() -> None:
    spec = TrainJobSpec(
        name="cpu-run",
        namespace="ns",
        gpus_per_node=0,
        procs_per_node=2,
        cpu="2",
        image="registry.example.com/envace-cpu:0.1.0",
        store="s3://bucket/prefix",
        run_name="exp-7",
        resume=True,
        runtime="envace-h100",
        runtime_kind="ClusterTrainingRuntime",
        node_selector={"node-pool": "cpu"},
        tolerations=(
            Toleration("pool", "NoExecute", "batch"),
            Toleration("nvidia.com/gpu", "NoSchedule"),
        ),
        env={"NCCL_DEBUG": "INFO"},
    )
    trainjob = build_trainjob(spec)
    trainer = trainjob["spec"]["trainer"]
    assert trainer["numProcPerNode"] == 2
    assert trainer["image"] == "registry.example.com/envace-cpu:0.1.0"
    assert trainer["args"] == [
        "--config",
        JOB_CONFIG_PATH,
        "--store",
        "s3://bucket/prefix",
        "--run-name",
        "exp-7",
        "--resume",
    ]
    assert trainer["resourcesPerNode"]["limits"] == {"cpu": "2"}  # 0 GPUs: no GPU resource at all
    assert trainer["env"] == [{"name": "NCCL_DEBUG", "value": "INFO"}]
    assert trainjob["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
    pod = _pod_patch(trainjob)
    assert pod["nodeSelector"] == {"node-pool": "cpu"}
    assert pod["tolerations"] == [
        {"key": "pool", "operator": "Equal", "value": "batch", "effect": "NoExecute"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]


def test_config_map_is_owned_by_the_trainjob(validator: ManifestValidator) -> None:
    spec = TrainJobSpec(name="run-1", namespace="team-a")
    owner = {"metadata": {"name": "run-1", "uid": "0b6f6c1e-8f0e-4f47-9c53-0d6ad0e1f7a1"}}
    config_map = build_config_map(spec, "seed: 0\n", owner=owner)
    assert config_map["metadata"]["name"] == "run-1-config"
    assert config_map["data"] == {"config.yaml": "seed: 0\n"}
    assert config_map["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": "run-1",
            "uid": "0b6f6c1e-8f0e-4f47-9c53-0d6ad0e1f7a1",
        }
    ]
    validator.assert_valid([config_map, build_config_map(spec, "seed: 0\n")])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nvidia.com/gpu", Toleration("nvidia.com/gpu", "NoSchedule")),
        ("nvidia.com/gpu:NoExecute", Toleration("nvidia.com/gpu", "NoExecute")),
        (
            "dedicated=training:PreferNoSchedule",
            Toleration("dedicated", "PreferNoSchedule", "training"),
        ),
        ("dedicated=", Toleration("dedicated", "NoSchedule", "")),
    ],
)
def test_parse_toleration(text: str, expected: Toleration) -> None:
    assert parse_toleration(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [("gpu:Never", "effect must be one of"), ("bad key!:NoSchedule", "not a valid taint key")],
)
def test_parse_toleration_rejects(text: str, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        parse_toleration(text)


def test_parse_key_value() -> None:
    assert parse_key_value("node-pool=h100", "--node-selector") == ("node-pool", "h100")
    assert parse_key_value("A=b=c", "--env") == ("A", "b=c")
    with pytest.raises(UserInputError, match="--env expects KEY=VALUE"):
        parse_key_value("novalue", "--env")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "Run_1"}, "not a DNS label"),
        ({"name": "r" * 41}, "at most 40"),
        ({"nodes": 0}, "--nodes must be at least 1"),
        ({"gpus_per_node": -1}, "--gpus-per-node"),
        ({"procs_per_node": 0}, "--procs-per-node"),
        ({"store": "/local/path"}, "--store must be a minio://"),
        ({"runtime_kind": "MPIRuntime"}, "runtime kind"),
        ({"run_name": "../other"}, "--run-name '../other' has a path separator"),
        ({"queue": "Team_A"}, "--queue 'Team_A' is not a LocalQueue name"),
        ({"queue": "q" * 64}, "at most 63 characters"),
    ],
)
def test_bad_specs_are_refused_with_the_flag(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        TrainJobSpec(**{"name": "ok", "namespace": "ns", **kwargs})


@pytest.mark.parametrize("value", ["exp1", "exp-7", "lr_2e-6", "run.v2", "é-run", "a" * 255])
def test_run_names_accepted(value: str) -> None:
    assert check_run_name(value, "--run-name") == value


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("../other", "has a path separator"),
        ("/abs", "has a path separator"),
        ("a/b", "has a path separator"),
        ("a\\b", "has a path separator"),
        (".", "is a relative folder reference"),
        ("..", "is a relative folder reference"),
        ("", "is empty"),
        ("a b", "has whitespace or a control character"),
        (" exp1", "has whitespace or a control character"),
        ("exp1\n", "has whitespace or a control character"),
        ("a\x00b", "has whitespace or a control character"),
        ("zero\u200bwidth", "has whitespace or a control character"),
        ("-exp", "starts with '-'"),
        ("a" * 256, "is longer than 255 bytes"),
    ],
)
def test_run_names_refused_with_the_flag_and_an_example(value: str, problem: str) -> None:
    """One plain store key segment only: the pod would fail on these after being scheduled."""
    with pytest.raises(UserInputError) as caught:
        check_run_name(value, "--run-name")
    message = str(caught.value)
    assert message.startswith("--run-name ") and problem in message
    assert message.endswith("e.g. --run-name exp1") and "\n" not in message


def test_default_job_name() -> None:
    name = default_job_name(now=datetime(2026, 11, 29, 20, 15, 0, tzinfo=UTC))
    assert name == "envace-train-20261129-201500"
    TrainJobSpec(name=name, namespace="ns")  # valid as a TrainJob name


_names = st.from_regex(r"[a-z][a-z0-9-]{0,30}[a-z0-9]", fullmatch=True)
_keys = st.from_regex(r"[a-z]{1,8}(\.[a-z]{1,5}/[a-z]{1,8})?", fullmatch=True)


@settings(max_examples=40, deadline=None)
@given(
    name=_names,
    nodes=st.integers(1, 64),
    gpus=st.one_of(st.none(), st.integers(0, 16)),
    procs=st.one_of(st.none(), st.integers(1, 16)),
    cpu=st.one_of(st.none(), st.sampled_from(["500m", "4", "96"])),
    selector=st.dictionaries(_keys, st.from_regex(r"[a-z0-9]{1,8}", fullmatch=True), max_size=2),
    tolerations=st.lists(
        st.builds(Toleration, _keys, st.sampled_from(["NoSchedule", "NoExecute"]), st.none()),
        max_size=2,
    ),
    resume=st.booleans(),
)
def test_every_built_trainjob_is_valid_against_the_crd(
    validator: ManifestValidator,
    name: str,
    nodes: int,
    gpus: int | None,
    procs: int | None,
    cpu: str | None,
    selector: dict[str, str],
    tolerations: list[Toleration],
    resume: bool,
) -> None:
    spec = TrainJobSpec(
        name=name,
        namespace="ns",
        nodes=nodes,
        gpus_per_node=gpus,
        procs_per_node=procs,
        cpu=cpu,
        node_selector=selector,
        tolerations=tuple(tolerations),
        resume=resume,
    )
    trainjob = build_trainjob(spec)
    validator.assert_valid([trainjob])
    assert trainjob["spec"]["trainer"]["numNodes"] * trainjob["spec"]["trainer"][
        "numProcPerNode"
    ] == (spec.world_size)


def test_a_queue_labels_the_trainjob_for_kueue(validator: ManifestValidator) -> None:
    """--queue puts Kueue's queue label on the TrainJob (what Kueue's TrainJob integration
    admits by); without it the job has no such label. Both pass the CRD schema."""
    queued = build_trainjob(TrainJobSpec(name="job", namespace="ns", queue="team-a"))
    assert queued["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert queued["metadata"]["labels"]["app.kubernetes.io/part-of"] == "envace"
    plain = build_trainjob(TrainJobSpec(name="job", namespace="ns"))
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]
    validator.assert_valid([queued, plain])
