"""The evaluate component: committed execution in the real worlds (optionally after test-time
rehearsal) -> Metrics + a report."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Markdown, Metrics, Model, Output

from pipelines.components import DEFAULT_IMAGE

__all__ = ["evaluate"]


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)  # type: ignore[untyped-decorator]
def evaluate(
    config: dict,  # type: ignore[type-arg]  # KFP reads a bare dict as a struct parameter
    store: str,
    store_endpoint: str,
    run_id: str,
    model: Input[Model],
    tasks: Input[Dataset],
    metrics: Output[Metrics],
    report: Output[Markdown],
    results: Output[Artifact],
    rehearsal: str = "",
) -> None:
    """Evaluate the model's policy on the held-out tasks by committed execution in their
    real worlds (with rehearsal-fidelity probes when eval.probe_fidelity); with `rehearsal`
    (parallel:N | sequential:N) also after test-time rehearsal of each task ("": none). Logs the
    metrics (to MLflow / W&B as `eval/*` at the model's RL iteration, when the config turns them
    on), writes a Markdown report; `results` points at the stored results (metrics.json,
    report.md, the trajectories)."""
    from envace import stages

    cfg = stages.setup(config, store_endpoint)
    layout = stages.RunLayout(store, run_id)
    result = stages.evaluate(
        cfg,
        stages.artifact_uri(model),
        stages.artifact_uri(tasks),
        layout.evaluation,
        rehearsal=rehearsal,
    )
    stages.log_kfp_metrics(metrics, result.metrics)
    held_out = {f"eval/{key}": value for key, value in result.metrics.items()}
    stages.track_metrics(cfg, layout.run_uri, result.iteration, held_out)
    with open(report.path, "w", encoding="utf-8") as handle:
        handle.write(result.report)
    stages.point_artifact(results, result.uri)
