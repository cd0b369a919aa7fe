"""The EnvACE pipeline: prepare -> warm start -> (rollout -> train) x rounds -> evaluate.

Rounds are unrolled when the pipeline is built (a Python loop): each rollout needs the checkpoint
the train step before it wrote, a sequential dependency `dsl.ParallelFor` cannot express.

Two kinds of settings:
- compile time (`PipelineOptions`, the flags of `envace pipeline compile`): rounds, CPU and memory,
  the /dev/shm size, the store and tracking Secrets, and the defaults of the run parameters below;
- run time (pipeline parameters, editable in the Kubeflow UI, each with its description there):
  `config` (a struct parameter: the config's sections as a JSON object), `store`,
  `store_endpoint`, `image`, `gpus`, `gpu_node_selector`, `gpu_tolerations` (kfp-kubernetes'
  JSON-parameter variants: a UI user moves the model steps to a GPU pool without recompiling),
  `train_nodes`, `train_gpus_per_node`, `trainjob_runtime`, `eval_rehearsal`.

Steps pass typed artifacts: `Dataset` (the tasks, a rollout's rows), `Model` (the initial model,
each checkpoint), `Metrics`, `Markdown` and the evaluation's `Artifact`, so the UI draws the
lineage from the tasks to the final model. Each points at a committed store folder (metadata
`store_uri`, and a one-line JSON file): artifacts pass by reference, no checkpoint is copied
into KFP's pipeline root.

Prepare is cached (its outputs are a function of the config); every other step is not. Warm
start, rollout, train and evaluate retry (`RETRY`): each is safe to rerun (a committed output of
the same inputs is reused, a foreign one refused).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kfp import dsl, kubernetes
from kfp.dsl import Artifact, Model

from envace.cluster.trainjob import Toleration
from envace.train.tracking import TRACKING_SECRET_DIR_ENV
from pipelines.components import DEFAULT_IMAGE
from pipelines.components.evaluate import evaluate
from pipelines.components.prepare import prepare
from pipelines.components.rollout import rollout
from pipelines.components.train import train
from pipelines.components.warm_start import warm_start

__all__ = [
    "DEFAULT_STORE",
    "DEFAULT_STORE_ENDPOINT",
    "GPU_RESOURCE",
    "PIPELINE_NAME",
    "PipelineOptions",
    "build_pipeline",
]

PIPELINE_NAME = "envace"
DEFAULT_STORE = "minio://envace/runs"
# The MinIO Service charts/envace deploys (release `envace`), reached from the same namespace.
DEFAULT_STORE_ENDPOINT = "http://envace-minio:9000"
GPU_RESOURCE = "nvidia.com/gpu"
# Without explicit tolerations, GPU steps tolerate the taint GPU node pools commonly carry.
DEFAULT_GPU_TOLERATIONS = (Toleration(key=GPU_RESOURCE, effect="NoSchedule"),)
# Retries of the model steps: a preempted node or a store hiccup costs a retry, not the run.
RETRY = {
    "num_retries": 2,
    "backoff_duration": "60s",
    "backoff_factor": 2.0,
    "backoff_max_duration": "600s",
}


CREDENTIALS_DIR = "/credentials/store"  # where every step mounts the store Secret
TRACKING_DIR = "/credentials/tracking"  # where every step mounts the tracking Secret, if any


@dataclass(frozen=True)
class PipelineOptions:
    """Compile-time settings. "Model steps" are warm start, rollout, train and evaluate: they get
    `cpu`, `memory`, `gpus` GPUs, the node selector, the tolerations and a memory-backed
    /dev/shm of `shm_size`; prepare gets `prepare_cpu` / `prepare_memory` and no GPU.

    `gpu_tolerations=None` means: `nvidia.com/gpu:NoSchedule` when `gpus` > 0, else none.
    Every step mounts the Secret `secret` at /credentials/store and reads the store credentials
    from its files `access_key_key` and `secret_key_key` (the chart's defaults), which
    ENVACE_S3_ACCESS_KEY_FILE / ENVACE_S3_SECRET_KEY_FILE name: no key is an environment variable.
    The Secret `tracking_secret` ("" for none) is mounted optionally at /credentials/tracking:
    a step exports its files named as MLflow / W&B variables (`export_tracking_secrets`), so a
    run tracks when that Secret exists and the config or MLFLOW_TRACKING_URI asks for it.
    `config` (the config's changes from the defaults, `envace.stages.config_struct`), `store`,
    `store_endpoint`, `image` and `gpus` become run-parameter defaults.
    """

    config: Mapping[str, Any]
    rounds: int = 2
    image: str = DEFAULT_IMAGE
    gpus: int = 0
    cpu: str = "2"
    memory: str = "8Gi"
    prepare_cpu: str = "1"
    prepare_memory: str = "4Gi"
    gpu_node_selector: Mapping[str, str] = field(default_factory=dict)
    gpu_tolerations: tuple[Toleration, ...] | None = None
    shm_size: str = "2Gi"
    secret: str = "envace-store"
    tracking_secret: str = "envace-tracking"
    access_key_key: str = "access-key"
    secret_key_key: str = "secret-key"
    store: str = DEFAULT_STORE
    store_endpoint: str = DEFAULT_STORE_ENDPOINT

    def __post_init__(self) -> None:
        if self.rounds < 0:
            raise ValueError(f"rounds must be 0 or more, got {self.rounds}")
        if self.gpus < 0:
            raise ValueError(f"gpus must be 0 or more, got {self.gpus}")

    @property
    def tolerations(self) -> tuple[Toleration, ...]:
        if self.gpu_tolerations is not None:
            return self.gpu_tolerations
        return DEFAULT_GPU_TOLERATIONS if self.gpus > 0 else ()


def _common(task: Any, options: PipelineOptions, image: Any, name: str) -> None:
    """Every step: display name, the run's image, store credentials as files of the Secret, the
    optional tracking Secret."""
    task.set_display_name(name)
    task.set_container_image(image)
    kubernetes.use_secret_as_volume(task, secret_name=options.secret, mount_path=CREDENTIALS_DIR)
    task.set_env_variable(
        "ENVACE_S3_ACCESS_KEY_FILE", f"{CREDENTIALS_DIR}/{options.access_key_key}"
    )
    task.set_env_variable(
        "ENVACE_S3_SECRET_KEY_FILE", f"{CREDENTIALS_DIR}/{options.secret_key_key}"
    )
    if options.tracking_secret:
        kubernetes.use_secret_as_volume(
            task, secret_name=options.tracking_secret, mount_path=TRACKING_DIR, optional=True
        )
        task.set_env_variable(TRACKING_SECRET_DIR_ENV, TRACKING_DIR)


class Placement(NamedTuple):
    """Where the model steps run: run parameters (pipeline channels) of the pipeline."""

    gpus: Any
    node_selector: Any
    tolerations: Any


def _model_step(
    task: Any, options: PipelineOptions, image: Any, name: str, placement: Placement
) -> Any:
    """A step that loads the model: resources, GPU pool placement (from run parameters),
    /dev/shm, retries; never cached."""
    _common(task, options, image, name)
    task.set_caching_options(False)
    task.set_retry(**RETRY)
    task.set_cpu_request(options.cpu).set_cpu_limit(options.cpu)
    task.set_memory_request(options.memory).set_memory_limit(options.memory)
    task.set_accelerator_type(GPU_RESOURCE).set_accelerator_limit(placement.gpus)
    kubernetes.add_node_selector_json(task, node_selector_json=placement.node_selector)
    kubernetes.add_toleration_json(task, toleration_json=placement.tolerations)
    # NCCL and vLLM workers exchange data through shared memory; a container's default is 64 MiB.
    kubernetes.empty_dir_mount(
        task,
        volume_name="dshm",
        mount_path="/dev/shm",
        medium="Memory",
        size_limit=options.shm_size,
    )
    return task


def _toleration_args(toleration: Toleration) -> dict[str, str]:
    as_dict = toleration.to_dict()
    return {k: as_dict[k] for k in ("key", "operator", "value", "effect") if k in as_dict}


class PipelineOutputs(NamedTuple):
    checkpoint: Model
    evaluation: Artifact


def build_pipeline(options: PipelineOptions) -> Any:
    """The pipeline for `options` (a KFP graph component: compile it, or call it under
    `kfp.local`)."""

    default_config = dict(options.config)
    default_selector = dict(options.gpu_node_selector)
    default_tolerations = [_toleration_args(t) for t in options.tolerations]

    @dsl.pipeline(  # type: ignore[untyped-decorator]
        name=PIPELINE_NAME,
        description="EnvACE: train a tool-use agent with world rehearsal (role-wise GRPO): "
        f"prepare -> warm start -> (rollout -> train) x {options.rounds} -> evaluate",
    )
    def envace_pipeline(
        config: dict = default_config,  # type: ignore[type-arg]  # bare dict: STRUCT
        store: str = options.store,
        store_endpoint: str = options.store_endpoint,
        image: str = options.image,
        gpus: int = options.gpus,
        gpu_node_selector: dict = default_selector,  # type: ignore[type-arg]  # KFP reads bare dict as STRUCT
        gpu_tolerations: list = default_tolerations,  # type: ignore[type-arg]  # bare list: LIST
        train_nodes: int = 1,
        train_gpus_per_node: int = options.gpus,
        trainjob_runtime: str = "envace",
        eval_rehearsal: str = "",
    ) -> PipelineOutputs:
        """Train a tool-use agent with world rehearsal.

        Args:
            config: The EnvACE config as a JSON object of its sections, holding what differs
                from the defaults, e.g. {"train": {"lr": 2e-6, "iterations": 8}}; {} is the
                defaults (docs/configuration.md; `envace config show` prints every field with
                its meaning and default).
            store: Where every artifact goes: minio://BUCKET/PREFIX or s3://BUCKET/PREFIX.
            store_endpoint: The S3 endpoint of the store, e.g. http://envace-minio:9000.
            image: The container image of every step (envace-cpu or envace-gpu, docker/).
            gpus: GPUs of each model step (warm start, rollout, train, evaluate); 0 for CPU.
            gpu_node_selector: Node labels the model steps must run on, as a JSON object, e.g.
                {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}; {} for any node.
            gpu_tolerations: Taints the model steps tolerate, as a JSON list of Kubernetes
                tolerations, e.g. [{"key": "nvidia.com/gpu", "operator": "Exists",
                "effect": "NoSchedule"}].
            train_nodes: Nodes of each train step; more than 1 runs it as a Kubeflow Trainer
                TrainJob (torchrun + DeepSpeed across nodes).
            train_gpus_per_node: GPUs per node of a multi-node train step's TrainJob.
            trainjob_runtime: The TrainingRuntime multi-node train steps use (charts/envace).
            eval_rehearsal: Test-time rehearsal in the evaluate step: parallel:N, sequential:N,
                or empty for committed execution only.
        """
        run_id = dsl.PIPELINE_JOB_ID_PLACEHOLDER
        placement = Placement(gpus, gpu_node_selector, gpu_tolerations)
        common = {"config": config, "store": store, "store_endpoint": store_endpoint}
        prep = prepare(**common)
        _common(prep, options, image, "prepare")
        prep.set_caching_options(True)
        prep.set_cpu_request(options.prepare_cpu).set_memory_request(options.prepare_memory)
        prep.set_memory_limit(options.prepare_memory)
        tasks = prep.outputs["tasks"]
        ws = warm_start(
            **common,
            run_id=run_id,
            initial_model=prep.outputs["initial_model"],
            tasks=tasks,
        )
        checkpoint = _model_step(ws, options, image, "warm start", placement).outputs["model"]
        for it in range(options.rounds):
            ro = rollout(
                **common,
                run_id=run_id,
                model=checkpoint,
                tasks=tasks,
                iteration=it,
            )
            _model_step(ro, options, image, f"rollout {it + 1}", placement)
            tr = train(
                **common,
                run_id=run_id,
                model=checkpoint,
                trajectories=ro.outputs["trajectories"],
                iteration=it,
                total_iterations=options.rounds,
                nodes=train_nodes,
                gpus_per_node=train_gpus_per_node,
                trainjob_runtime=trainjob_runtime,
                image=image,
            )
            step = _model_step(tr, options, image, f"train {it + 1}", placement)
            checkpoint = step.outputs["trained"]
        ev = evaluate(
            **common,
            run_id=run_id,
            model=checkpoint,
            tasks=tasks,
            rehearsal=eval_rehearsal,
        )
        _model_step(ev, options, image, "evaluate", placement)
        return PipelineOutputs(checkpoint, ev.outputs["results"])

    return envace_pipeline
