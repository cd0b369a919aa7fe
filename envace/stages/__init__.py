"""Pipeline stages: functions of artifact URIs to artifact URIs.

The Kubeflow pipeline (pipelines/) is this loop, one component per call, with the round state in
the artifact store instead of in memory:

    prepared = prepare(cfg, store)                               # tasks + initial model; cacheable
    ckpt = warm_start(cfg, prepared.checkpoint_uri, prepared.tasks_uri, layout.warm_start)
    for it in range(rounds):
        rolled = rollout(cfg, ckpt, prepared.tasks_uri, it, layout.rollout(it))
        ckpt = train(cfg, ckpt, rolled.uri, layout.checkpoint(it), total_iterations=rounds).uri
    result = evaluate(cfg, ckpt, prepared.tasks_uri, layout.evaluation)

Every stage fetches its inputs into a scratch folder (checked against their manifests), and
commits what it writes with a manifest, so a step that dies leaves nothing a later step accepts.
One round is one RL iteration of `envace run`: the rollout step runs `RLTrainer.collect` with the
checkpoint of the previous round and stores the rows (rewards and advantages included, see
`envace.rollout.io`); the train step rebuilds the trainer from the same checkpoint, optimizer
state included (`trainer_state.pt`), runs `RLTrainer.update` on those rows and commits the next
checkpoint. Checkpoints use the layout of `envace run` (`policy/`, `simulator/` in noshare mode,
`trainer_state.pt`), plus `checkpoint.json` (iteration count, where RL started).

With `TrainJobLaunch(nodes > 1)` the train step runs as a Kubeflow Trainer TrainJob
(`envace pipeline train-step` under torchrun) and waits for it, surfacing its status and logs.

The package by noun: `store` (config passing, run layout, committing), `checkpoint` (what one
round hands the next), `steps` (the stage functions), `trainjob` (the train step as a TrainJob),
`evaluate` (the evaluate step and its report).
"""

from __future__ import annotations

from envace.stages.checkpoint import CheckpointMeta
from envace.stages.evaluate import (
    REHEARSAL_PREFIX,
    Evaluation,
    evaluate,
    evaluation_rehearsal,
    evaluation_report,
)
from envace.stages.steps import (
    Prepared,
    Rollout,
    prepare,
    rollout,
    train,
    warm_start,
)
from envace.stages.store import (
    CHECKPOINT_META,
    EPISODES,
    ROLLOUT_META,
    TRAIN_METRICS,
    RunLayout,
    StageError,
    artifact_uri,
    config_digest,
    config_struct,
    config_text,
    log_kfp_metrics,
    pipeline_config,
    point_artifact,
    prepared_uri,
    setup,
    track_metrics,
)
from envace.stages.trainjob import (
    TRAIN_STEP_COMMAND,
    Trained,
    TrainJobLaunch,
    train_step_args,
    train_step_job_name,
)

__all__ = [
    "CHECKPOINT_META",
    "EPISODES",
    "REHEARSAL_PREFIX",
    "ROLLOUT_META",
    "TRAIN_METRICS",
    "TRAIN_STEP_COMMAND",
    "CheckpointMeta",
    "Evaluation",
    "Prepared",
    "Rollout",
    "RunLayout",
    "StageError",
    "TrainJobLaunch",
    "Trained",
    "artifact_uri",
    "config_digest",
    "config_struct",
    "config_text",
    "evaluate",
    "evaluation_rehearsal",
    "evaluation_report",
    "log_kfp_metrics",
    "pipeline_config",
    "point_artifact",
    "prepare",
    "prepared_uri",
    "rollout",
    "setup",
    "track_metrics",
    "train",
    "train_step_args",
    "train_step_job_name",
    "warm_start",
]
