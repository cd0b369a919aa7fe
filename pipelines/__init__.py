"""EnvACE on Kubeflow Pipelines v2: one component per stage and the pipeline that chains them.

    prepare -> warm start -> (rollout -> train) x rounds -> evaluate

`pipelines.pipeline.build_pipeline(PipelineOptions(...))` makes the pipeline; `envace pipeline
compile` writes it as IR YAML (the checked-in `envace_pipeline.yaml`), `envace pipeline submit`
starts a run through `kfp.Client`, and `envace pipeline run-local` runs it with KFP's local runner.
Every component calls a stage function of `envace.stages`; no logic lives here. See
docs/pipeline.md.
"""
