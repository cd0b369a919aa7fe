"""The train component: rows + checkpoint -> the next checkpoint (in the pod, or a TrainJob)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from pipelines.components import DEFAULT_IMAGE

__all__ = ["train"]


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)  # type: ignore[untyped-decorator]
def train(
    config: dict,  # type: ignore[type-arg]  # KFP reads a bare dict as a struct parameter
    store: str,
    store_endpoint: str,
    run_id: str,
    model: Input[Model],
    trajectories: Input[Dataset],
    iteration: int,
    total_iterations: int,
    nodes: int,
    gpus_per_node: int,
    trainjob_runtime: str,
    image: str,
    trained: Output[Model],
    metrics: Output[Metrics],
) -> None:
    """PPO update of RL iteration `iteration` on the rollout's rows, from the model that sampled
    them (optimizer state included); `trained` points at the next checkpoint. With nodes > 1
    the update runs as a Kubeflow Trainer TrainJob on `trainjob_runtime`, and this step waits for
    it, logging its status and its nodes' logs. Metrics also go to MLflow / W&B when the config
    turns them on."""
    from envace import stages

    cfg = stages.setup(config, store_endpoint)
    launch = stages.TrainJobLaunch(
        nodes=nodes, gpus_per_node=gpus_per_node, runtime=trainjob_runtime, image=image
    )
    layout = stages.RunLayout(store, run_id)
    result = stages.train(
        cfg,
        stages.artifact_uri(model),
        stages.artifact_uri(trajectories),
        layout.checkpoint(iteration),
        total_iterations=total_iterations,
        launch=launch,
    )
    stages.log_kfp_metrics(metrics, result.metrics)
    stages.track_metrics(cfg, layout.run_uri, iteration + 1, result.metrics)
    stages.point_artifact(trained, result.uri)
