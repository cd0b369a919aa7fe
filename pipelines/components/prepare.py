"""The prepare component: tasks and the initial model into the store (cacheable)."""

from typing import NamedTuple

from kfp import dsl

from pipelines.components import DEFAULT_IMAGE

__all__ = ["prepare"]


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)  # type: ignore[untyped-decorator]
def prepare(config: str, store: str, store_endpoint: str) -> NamedTuple("PrepareOutputs", [("tasks_uri", str), ("checkpoint_uri", str)]):  # type: ignore[valid-type]  # fmt: skip
    """Generate (or copy) the task splits and build the initial model, under
    <store>/prepared/<config digest>/; outputs their URIs."""
    from collections import namedtuple

    from envace import stages

    cfg = stages.setup(config, store_endpoint)
    prepared = stages.prepare(cfg, store)
    PrepareOutputs = namedtuple("PrepareOutputs", ["tasks_uri", "checkpoint_uri"])
    return PrepareOutputs(prepared.tasks_uri, prepared.checkpoint_uri)
