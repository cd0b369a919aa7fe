"""The train component: rows + checkpoint -> the next checkpoint (in the pod, or a TrainJob)."""

from kfp import dsl
from kfp.dsl import Metrics, Output

from pipelines.components import DEFAULT_IMAGE

__all__ = ["train"]


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)  # type: ignore[untyped-decorator]
def train(
    config: str,
    store: str,
    store_endpoint: str,
    run_id: str,
    checkpoint_uri: str,
    trajectories_uri: str,
    iteration: int,
    total_iterations: int,
    nodes: int,
    gpus_per_node: int,
    trainjob_runtime: str,
    image: str,
    metrics: Output[Metrics],
) -> str:
    """PPO update of RL iteration `iteration` on the rollout's rows, from the checkpoint that
    sampled them (optimizer state included); outputs the next checkpoint's URI. With nodes > 1
    the update runs as a Kubeflow Trainer TrainJob on `trainjob_runtime`, and this step waits for
    it, logging its status and its nodes' logs."""
    from envace import stages

    cfg = stages.setup(config, store_endpoint)
    launch = stages.TrainJobLaunch(
        nodes=nodes, gpus_per_node=gpus_per_node, runtime=trainjob_runtime, image=image
    )
    out_uri = stages.RunLayout(store, run_id).checkpoint(iteration)
    result = stages.train(
        cfg,
        checkpoint_uri,
        trajectories_uri,
        out_uri,
        total_iterations=total_iterations,
        launch=launch,
    )
    stages.log_kfp_metrics(metrics, result.metrics)
    return result.uri
