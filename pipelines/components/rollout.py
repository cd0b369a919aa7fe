"""The rollout component: checkpoint + tasks -> training rows of one RL iteration."""

from kfp import dsl
from kfp.dsl import Metrics, Output

from pipelines.components import DEFAULT_IMAGE

__all__ = ["rollout"]


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)  # type: ignore[untyped-decorator]
def rollout(
    config: str,
    store: str,
    store_endpoint: str,
    run_id: str,
    checkpoint_uri: str,
    tasks_uri: str,
    iteration: int,
    metrics: Output[Metrics],
) -> str:
    """Roll out RL iteration `iteration` (from 0) with the checkpoint's policy (world rehearsal:
    the policy acts and rehearses), score it, compute role-wise advantages; outputs the URI of
    the stored rows and logs reward / success metrics."""
    from envace import stages

    cfg = stages.setup(config, store_endpoint)
    out_uri = stages.RunLayout(store, run_id).rollout(iteration)
    result = stages.rollout(cfg, checkpoint_uri, tasks_uri, iteration, out_uri)
    stages.log_kfp_metrics(metrics, result.metrics)
    return result.uri
