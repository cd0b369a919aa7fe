"""The evaluate component: committed execution in the real worlds (optionally after test-time
rehearsal) -> Metrics + a report."""

from kfp import dsl
from kfp.dsl import Markdown, Metrics, Output

from pipelines.components import DEFAULT_IMAGE

__all__ = ["evaluate"]


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)  # type: ignore[untyped-decorator]
def evaluate(
    config: str,
    store: str,
    store_endpoint: str,
    run_id: str,
    checkpoint_uri: str,
    tasks_uri: str,
    metrics: Output[Metrics],
    report: Output[Markdown],
    rehearsal: str = "",
) -> str:
    """Evaluate the checkpoint's policy on the held-out tasks by committed execution in their
    real worlds (with rehearsal-fidelity probes when eval.probe_fidelity); with `rehearsal`
    (parallel:N | sequential:N) also after test-time rehearsal of each task ("": none). Logs the
    metrics, writes a Markdown report and outputs the URI of the stored results."""
    from envace import stages

    cfg = stages.setup(config, store_endpoint)
    out_uri = stages.RunLayout(store, run_id).evaluation
    result = stages.evaluate(cfg, checkpoint_uri, tasks_uri, out_uri, rehearsal=rehearsal)
    stages.log_kfp_metrics(metrics, result.metrics)
    with open(report.path, "w", encoding="utf-8") as handle:
        handle.write(result.report)
    return result.uri
