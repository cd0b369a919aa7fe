"""The compiled pipeline (KFP v2 IR YAML), read back as YAML: components, DAG, caching, resources,
credentials, GPU placement, /dev/shm; and the checked-in package is the current compile output."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from envace.cli import main

REPO = Path(__file__).resolve().parents[2]
CHECKED_IN = REPO / "pipelines" / "envace_pipeline.yaml"
CHECKED_IN_FLAGS = ("--gpus=1", "--image=envace-gpu:0.1.0", "--memory=64Gi", "--cpu=8")
GPUS_PARAM = "{{$.inputs.parameters['pipelinechannel--gpus']}}"
KEY_FILES = {
    "ENVACE_S3_ACCESS_KEY_FILE": "/credentials/store/access-key",
    "ENVACE_S3_SECRET_KEY_FILE": "/credentials/store/secret-key",
}


def _compile(tmp_path: Path, *flags: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pipeline spec, Kubernetes platform spec) of `envace pipeline compile FLAGS`."""
    out = tmp_path / "pipeline.yaml"
    assert main(["pipeline", "compile", "--out", str(out), *flags]) == 0
    spec, platform = yaml.safe_load_all(out.read_text())
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


@pytest.fixture(scope="module")
def gpu_pipeline(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    return _compile(
        tmp_path_factory.mktemp("gpu"),
        "--rounds=3",
        "--gpus=2",
        "--cpu=12",
        "--memory=96Gi",
        "--gpu-node-selector=cloud.google.com/gke-accelerator=nvidia-h100-80gb",
        "--gpu-node-selector=pool=train",
        "--gpu-toleration=nvidia.com/gpu:NoSchedule",
        "--gpu-toleration=dedicated=rl:NoExecute",
        "--shm-size=32Gi",
        "--secret=team-store",
        "--image=registry.example.com/envace-gpu:0.1.0",
        "--set=train.lr=2e-6",
    )


def _tasks(spec: dict[str, Any]) -> dict[str, Any]:
    tasks: dict[str, Any] = spec["root"]["dag"]["tasks"]
    return tasks


def _step(task: str) -> str:
    """`rollout-2` -> `rollout`."""
    return task.rsplit("-", 1)[0] if task[-1].isdigit() else task


def _executor_label(spec: dict[str, Any], task: str) -> str:
    component = _tasks(spec)[task]["componentRef"]["name"]
    return str(spec["components"][component]["executorLabel"])


def test_components_and_rounds_unrolled_in_order(gpu_pipeline: tuple[Any, Any]) -> None:
    spec, _ = gpu_pipeline
    tasks = _tasks(spec)
    for task in tasks:  # each task runs its stage's function
        args = _container(spec, task)["args"]
        function = args[args.index("--function_to_execute") + 1]
        assert function == _step(task).replace("-", "_"), task
    rounds = [f"{step}{suffix}" for step in ("rollout", "train") for suffix in ("", "-2", "-3")]
    assert sorted(tasks) == sorted(["prepare", "warm-start", *rounds, "evaluate"])
    names = {k: v["taskInfo"]["name"] for k, v in tasks.items()}
    assert names["rollout-3"] == "rollout 3" and names["train"] == "train 1"
    assert spec["pipelineInfo"]["name"] == "envace"


def _input_from(task: dict[str, Any], name: str) -> tuple[str, str] | None:
    """(producer task, its output) of the input artifact `name` of `task`."""
    source = task["inputs"]["artifacts"][name].get("taskOutputArtifact")
    return (source["producerTask"], source["outputArtifactKey"]) if source else None


def _artifact_types(spec: dict[str, Any], task: str, side: str) -> dict[str, str]:
    component = spec["components"][_tasks(spec)[task]["componentRef"]["name"]]
    artifacts = component[side].get("artifacts", {})
    return {k: v["artifactType"]["schemaTitle"] for k, v in artifacts.items()}


def test_dag_edges_chain_checkpoints_through_the_rounds(gpu_pipeline: tuple[Any, Any]) -> None:
    spec, _ = gpu_pipeline
    tasks = _tasks(spec)
    deps = {k: sorted(v.get("dependentTasks", [])) for k, v in tasks.items()}
    assert deps == {
        "prepare": [],
        "warm-start": ["prepare"],
        "rollout": ["prepare", "warm-start"],
        "train": ["rollout", "warm-start"],
        "rollout-2": ["prepare", "train"],
        "train-2": ["rollout-2", "train"],
        "rollout-3": ["prepare", "train-2"],
        "train-3": ["rollout-3", "train-2"],
        "evaluate": ["prepare", "train-3"],
    }
    # Typed artifacts carry the checkpoints and rows from step to step (the UI's lineage): each
    # train step updates the model its rollout used, from that rollout's rows.
    assert _input_from(tasks["warm-start"], "initial_model") == ("prepare", "initial_model")
    assert _input_from(tasks["rollout"], "model") == ("warm-start", "model")
    for ro, tr, ckpt in (("rollout-2", "train-2", "train"), ("rollout-3", "train-3", "train-2")):
        assert _input_from(tasks[ro], "model") == (ckpt, "trained")
        assert _input_from(tasks[tr], "model") == (ckpt, "trained")
        assert _input_from(tasks[tr], "trajectories") == (ro, "trajectories")
    for task in ("warm-start", "rollout", "rollout-3", "evaluate"):
        assert _input_from(tasks[task], "tasks") == ("prepare", "tasks")
    assert _input_from(tasks["evaluate"], "model") == ("train-3", "trained")
    assert not any("_uri" in p for t in tasks.values() for p in t["inputs"].get("parameters", {}))
    iterations = {
        k: v["inputs"]["parameters"]["iteration"]["runtimeValue"]["constant"]
        for k, v in tasks.items()
        if "iteration" in v["inputs"]["parameters"]
    }
    assert iterations == {
        "rollout": 0.0, "train": 0.0, "rollout-2": 1.0, "train-2": 1.0,
        "rollout-3": 2.0, "train-3": 2.0,
    }  # fmt: skip
    run_id = tasks["train-2"]["inputs"]["parameters"]["run_id"]["runtimeValue"]["constant"]
    assert run_id == "{{$.pipeline_job_uuid}}"
    outputs = spec["root"]["dag"]["outputs"]["artifacts"]
    assert outputs["checkpoint"]["artifactSelectors"] == [
        {"outputArtifactKey": "trained", "producerSubtask": "train-3"}
    ]
    assert outputs["evaluation"]["artifactSelectors"] == [
        {"outputArtifactKey": "results", "producerSubtask": "evaluate"}
    ]


def test_steps_pass_models_datasets_and_metrics(gpu_pipeline: tuple[Any, Any]) -> None:
    spec, _ = gpu_pipeline
    expected = {
        "prepare": ({}, {"tasks": "system.Dataset", "initial_model": "system.Model"}),
        "warm-start": (
            {"initial_model": "system.Model", "tasks": "system.Dataset"},
            {"model": "system.Model"},
        ),
        "rollout": (
            {"model": "system.Model", "tasks": "system.Dataset"},
            {"trajectories": "system.Dataset", "metrics": "system.Metrics"},
        ),
        "train": (
            {"model": "system.Model", "trajectories": "system.Dataset"},
            {"trained": "system.Model", "metrics": "system.Metrics"},
        ),
        "evaluate": (
            {"model": "system.Model", "tasks": "system.Dataset"},
            {
                "metrics": "system.Metrics",
                "report": "system.Markdown",
                "results": "system.Artifact",
            },
        ),
    }
    for task, (inputs, outputs) in expected.items():
        assert _artifact_types(spec, task, "inputDefinitions") == inputs, task
        assert _artifact_types(spec, task, "outputDefinitions") == outputs, task
        assert "parameters" not in spec["components"][
            _tasks(spec)[task]["componentRef"]["name"]
        ].get("outputDefinitions", {}), task


def test_only_prepare_is_cached(gpu_pipeline: tuple[Any, Any]) -> None:
    spec, _ = gpu_pipeline
    caching = {
        k: v.get("cachingOptions", {}).get("enableCache", False) for k, v in _tasks(spec).items()
    }
    assert caching.pop("prepare") is True
    assert not any(caching.values()), caching


def _container(spec: dict[str, Any], task: str) -> dict[str, Any]:
    executor = _executor_label(spec, task)
    container: dict[str, Any] = spec["deploymentSpec"]["executors"][executor]["container"]
    return container


def test_resources_and_gpus_of_model_steps(gpu_pipeline: tuple[Any, Any]) -> None:
    spec, _ = gpu_pipeline
    for task in _tasks(spec):
        resources = _container(spec, task)["resources"]
        if task == "prepare":
            assert "accelerator" not in resources
            assert resources["resourceMemoryLimit"] == "4Gi"
            continue
        assert resources["accelerator"]["resourceType"] == "nvidia.com/gpu", task
        # the GPU count is the run parameter `gpus` (its default: the compile flag)
        assert resources["accelerator"]["resourceCount"] == GPUS_PARAM
        assert resources["resourceCpuRequest"] == resources["resourceCpuLimit"] == "12"
        assert resources["resourceMemoryRequest"] == resources["resourceMemoryLimit"] == "96Gi"


def test_every_step_runs_the_image_parameter_with_the_envace_entry(
    gpu_pipeline: tuple[Any, Any],
) -> None:
    spec, _ = gpu_pipeline
    for task in _tasks(spec):
        container = _container(spec, task)
        assert container["image"] == "{{$.inputs.parameters['pipelinechannel--image']}}"
        body = " ".join(container["command"])
        assert "from envace import stages" in body
        assert "pip install" not in body  # the image brings envace and kfp
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert inputs["image"]["defaultValue"] == "registry.example.com/envace-gpu:0.1.0"


def test_store_credentials_come_from_the_secret_on_every_step(
    gpu_pipeline: tuple[Any, Any],
) -> None:
    spec, executors = gpu_pipeline
    labels = {_executor_label(spec, t) for t in _tasks(spec)}
    assert set(executors) == labels
    """As files of the mounted Secret, named by the *_FILE variables, never as env values."""
    containers = {
        label: spec["deploymentSpec"]["executors"][label]["container"] for label in executors
    }
    for label, executor in executors.items():
        assert "secretAsEnv" not in executor, label
        store, tracking = executor["secretAsVolume"]
        assert store["secretName"] == "team-store", label
        assert store["mountPath"] == "/credentials/store"
        assert store["optional"] is False
        # MLflow / W&B credentials: mounted when that Secret exists, read by stages.setup
        assert tracking["secretName"] == "envace-tracking", label
        assert tracking["mountPath"] == "/credentials/tracking"
        assert tracking["optional"] is True
        env = {e["name"]: e["value"] for e in containers[label]["env"]}
        assert {k: env.get(k) for k in KEY_FILES} == KEY_FILES, label
        assert env["ENVACE_TRACKING_SECRET_DIR"] == "/credentials/tracking"


def test_gpu_placement_and_shm_on_model_steps_only(gpu_pipeline: tuple[Any, Any]) -> None:
    spec, executors = gpu_pipeline
    for task in _tasks(spec):
        executor = executors[_executor_label(spec, task)]
        if task == "prepare":
            assert not {"nodeSelector", "tolerations", "emptyDirMounts"} & set(executor)
            continue
        # run parameters (kfp-kubernetes' JSON variants): a UI user moves the steps to a pool
        assert executor["nodeSelector"] == {
            "nodeSelectorJson": {"componentInputParameter": "gpu_node_selector"}
        }
        assert executor["tolerations"] == [
            {"tolerationJson": {"componentInputParameter": "gpu_tolerations"}}
        ]
        assert executor["emptyDirMounts"] == [
            {"volumeName": "dshm", "mountPath": "/dev/shm", "medium": "Memory", "sizeLimit": "32Gi"}
        ]


def test_run_parameters_and_their_defaults(gpu_pipeline: tuple[Any, Any]) -> None:
    spec, _ = gpu_pipeline
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert {k: v["parameterType"] for k, v in inputs.items()} == {
        "config": "STRUCT",
        "store": "STRING",
        "store_endpoint": "STRING",
        "image": "STRING",
        "gpus": "NUMBER_INTEGER",
        "gpu_node_selector": "STRUCT",
        "gpu_tolerations": "LIST",
        "train_nodes": "NUMBER_INTEGER",
        "train_gpus_per_node": "NUMBER_INTEGER",
        "trainjob_runtime": "STRING",
        "eval_rehearsal": "STRING",
    }
    # the config's changes from the defaults, as a struct the UI shows and edits
    assert inputs["config"]["defaultValue"] == {"train": {"lr": 2e-6}}
    assert inputs["store"]["defaultValue"] == "minio://envace/runs"
    assert inputs["store_endpoint"]["defaultValue"] == "http://envace-minio:9000"
    assert inputs["train_nodes"]["defaultValue"] == 1
    assert inputs["gpus"]["defaultValue"] == 2
    assert inputs["gpu_node_selector"]["defaultValue"] == {
        "cloud.google.com/gke-accelerator": "nvidia-h100-80gb",
        "pool": "train",
    }
    assert inputs["gpu_tolerations"]["defaultValue"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "rl", "effect": "NoExecute"},
    ]
    # every parameter is described in the UI (the pipeline's docstring)
    undocumented = [k for k, v in inputs.items() if len(v.get("description", "")) < 20]
    assert not undocumented, undocumented
    assert "JSON list of Kubernetes" in inputs["gpu_tolerations"]["description"]
    assert inputs["train_gpus_per_node"]["defaultValue"] == 2
    train = _tasks(spec)["train-3"]["inputs"]["parameters"]
    assert train["nodes"]["componentInputParameter"] == "train_nodes"
    assert train["total_iterations"]["runtimeValue"]["constant"] == 3.0


def test_eval_rehearsal_reaches_the_evaluate_step_only(gpu_pipeline: tuple[Any, Any]) -> None:
    spec, _ = gpu_pipeline
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert inputs["eval_rehearsal"]["defaultValue"] == ""  # off: committed execution only
    tasks = _tasks(spec)
    evaluate = tasks["evaluate"]["inputs"]["parameters"]
    assert evaluate["rehearsal"] == {"componentInputParameter": "eval_rehearsal"}
    others = [t for t in tasks if t != "evaluate"]
    assert not any("rehearsal" in tasks[t]["inputs"]["parameters"] for t in others)
    component = spec["components"][tasks["evaluate"]["componentRef"]["name"]]
    declared = component["inputDefinitions"]["parameters"]["rehearsal"]
    assert declared["parameterType"] == "STRING" and declared["defaultValue"] == ""
    body = " ".join(_container(spec, "evaluate")["command"])
    assert "rehearsal=rehearsal," in body


def test_model_steps_retry_and_prepare_is_cached_instead(gpu_pipeline: tuple[Any, Any]) -> None:
    spec, _ = gpu_pipeline
    for name, task in _tasks(spec).items():
        if name == "prepare":
            assert "retryPolicy" not in task
            continue
        assert task["retryPolicy"] == {
            "maxRetryCount": 2,
            "backoffDuration": "60s",
            "backoffFactor": 2.0,
            "backoffMaxDuration": "600s",
        }, name


def test_no_tracking_secret_mounts_none(tmp_path: Path) -> None:
    spec, executors = _compile(tmp_path, "--tracking-secret=", "--rounds=0")
    for label, executor in executors.items():
        assert [v["secretName"] for v in executor["secretAsVolume"]] == ["envace-store"], label
        env = spec["deploymentSpec"]["executors"][label]["container"]["env"]
        assert "ENVACE_TRACKING_SECRET_DIR" not in {e["name"] for e in env}


def test_cpu_default_asks_for_no_gpu_and_no_tolerations(tmp_path: Path) -> None:
    spec, _executors = _compile(tmp_path)
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    assert inputs["gpus"]["defaultValue"] == 0
    assert inputs["gpu_node_selector"]["defaultValue"] == {}
    assert inputs["gpu_tolerations"]["defaultValue"] == []
    assert "accelerator" not in _container(spec, "prepare")["resources"]
    assert sorted(_tasks(spec)) == sorted(
        ["prepare", "warm-start", "rollout", "rollout-2", "train", "train-2", "evaluate"]
    )


def test_gpus_without_tolerations_tolerate_the_gpu_taint(tmp_path: Path) -> None:
    spec, executors = _compile(tmp_path, "--gpus=1", "--rounds=0")
    assert spec["root"]["inputDefinitions"]["parameters"]["gpu_tolerations"]["defaultValue"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert set(executors) == {"exec-prepare", "exec-warm-start", "exec-evaluate"}


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--gpu-toleration=nvidia.com/gpu:Sometimes", "effect must be one of"),
        ("--gpu-node-selector=no-value", "--gpu-node-selector expects KEY=VALUE"),
        ("--rounds=-1", "must be 0 or more"),
        ("--set=train.lr=-1", "train.lr"),
    ],
)
def test_bad_compile_flags_are_user_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, message: str
) -> None:
    assert main(["pipeline", "compile", "--out", str(tmp_path / "p.yaml"), flag]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "p.yaml").exists()


def test_checked_in_pipeline_is_the_current_compile_output(tmp_path: Path) -> None:
    """The checked-in package is the GPU one (a UI user changes `gpus` and the placement at run
    time; `gpus=0` runs it on CPU)."""
    fresh = tmp_path / "envace_pipeline.yaml"
    assert main(["pipeline", "compile", "--out", str(fresh), *CHECKED_IN_FLAGS]) == 0
    assert CHECKED_IN.read_text() == fresh.read_text(), (
        "pipelines/envace_pipeline.yaml is stale: run `envace pipeline compile --out "
        f"pipelines/envace_pipeline.yaml {' '.join(CHECKED_IN_FLAGS)}` and commit the result"
    )
