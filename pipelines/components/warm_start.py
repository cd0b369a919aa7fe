"""The warm-start component: supervised fine-tuning of both roles on gold conversations."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output

from pipelines.components import DEFAULT_IMAGE

__all__ = ["warm_start"]


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)  # type: ignore[untyped-decorator]
def warm_start(
    config: dict,  # type: ignore[type-arg]  # KFP reads a bare dict as a struct parameter
    store: str,
    store_endpoint: str,
    run_id: str,
    initial_model: Input[Model],
    tasks: Input[Dataset],
    model: Output[Model],
) -> None:
    """Warm-start the initial model on the gold conversations; `model` points at the checkpoint
    RL starts from (the initial one when warm_start.enabled is false)."""
    from envace import stages

    cfg = stages.setup(config, store_endpoint)
    out_uri = stages.RunLayout(store, run_id).warm_start
    uri = stages.warm_start(
        cfg, stages.artifact_uri(initial_model), stages.artifact_uri(tasks), out_uri
    )
    stages.point_artifact(model, uri)
