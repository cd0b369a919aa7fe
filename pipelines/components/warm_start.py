"""The warm-start component: supervised fine-tuning of both roles on gold conversations."""

from kfp import dsl

from pipelines.components import DEFAULT_IMAGE

__all__ = ["warm_start"]


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)  # type: ignore[untyped-decorator]
def warm_start(
    config: str,
    store: str,
    store_endpoint: str,
    run_id: str,
    checkpoint_uri: str,
    tasks_uri: str,
) -> str:
    """Warm-start the initial model on the gold conversations; outputs the checkpoint URI RL
    starts from (the initial one when warm_start.enabled is false)."""
    from envace import stages

    cfg = stages.setup(config, store_endpoint)
    out_uri = stages.RunLayout(store, run_id).warm_start
    return stages.warm_start(cfg, checkpoint_uri, tasks_uri, out_uri)
