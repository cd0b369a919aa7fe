"""The prepare component: tasks and the initial model into the store (cacheable)."""

from kfp import dsl
from kfp.dsl import Dataset, Model, Output

from pipelines.components import DEFAULT_IMAGE

__all__ = ["prepare"]


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)  # type: ignore[untyped-decorator]
def prepare(
    config: dict,  # type: ignore[type-arg]  # KFP reads a bare dict as a struct parameter
    store: str,
    store_endpoint: str,
    tasks: Output[Dataset],
    initial_model: Output[Model],
) -> None:
    """Generate (or copy) the task splits and build the initial model, under
    <store>/prepared/<config digest>/; the `tasks` Dataset and the `initial_model` Model point at
    them (metadata `store_uri`)."""
    from envace import stages

    cfg = stages.setup(config, store_endpoint)
    prepared = stages.prepare(cfg, store)
    stages.point_artifact(tasks, prepared.tasks_uri)
    stages.point_artifact(initial_model, prepared.checkpoint_uri)
