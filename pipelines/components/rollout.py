"""The rollout component: checkpoint + tasks -> training rows of one RL iteration."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Metrics, Model, Output

from pipelines.components import DEFAULT_IMAGE

__all__ = ["rollout"]


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)  # type: ignore[untyped-decorator]
def rollout(
    config: dict,  # type: ignore[type-arg]  # KFP reads a bare dict as a struct parameter
    store: str,
    store_endpoint: str,
    run_id: str,
    model: Input[Model],
    tasks: Input[Dataset],
    iteration: int,
    trajectories: Output[Dataset],
    metrics: Output[Metrics],
) -> None:
    """Roll out RL iteration `iteration` (from 0) with the model's policy (world rehearsal: the
    policy acts and rehearses), score it, compute role-wise advantages; `trajectories` points at
    the stored rows, `metrics` holds reward / success (also sent to MLflow / W&B when the config
    turns them on: one tracker run per pipeline run)."""
    from envace import stages

    cfg = stages.setup(config, store_endpoint)
    layout = stages.RunLayout(store, run_id)
    result = stages.rollout(
        cfg,
        stages.artifact_uri(model),
        stages.artifact_uri(tasks),
        iteration,
        layout.rollout(iteration),
    )
    stages.log_kfp_metrics(metrics, result.metrics)
    stages.track_metrics(cfg, layout.run_uri, iteration + 1, result.metrics)
    stages.point_artifact(trajectories, result.uri)
