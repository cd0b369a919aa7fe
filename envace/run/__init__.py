"""`envace run`: the whole method on one machine.

generate tasks -> build (or load) the model -> evaluate untrained -> warm start -> evaluate ->
RL with world rehearsal -> evaluate, with a progress bar per stage, a final comparison table,
metrics.jsonl / summary.json / a PNG plot / TensorBoard events, and checkpoints committed to the
artifact store (a local folder by default) with manifests, so `--resume` continues from the
newest complete one.

Started by torchrun with several processes (`train.engine: deepspeed`), every rank runs this
same function: rank 0 alone writes reports, metrics and commits; the first process of each node
prepares the tasks and the initial checkpoint on its disk while the others wait at a barrier;
the warm start runs on every rank and rank 0's weights are broadcast so the replicas are
identical; RL is data parallel (`envace.train.rl`); evaluations run on rank 0 with the weights
gathered (`generation_context`) while the other ranks wait at a barrier. RL checkpoints are
committed from every node (`commit_from_ranks`: each node's first rank uploads its ranks'
DeepSpeed shards, rank 0 writes the manifest), so the nodes share the store, not a disk.
"""

from envace.run.blocks import (
    evaluate_model,
    init_model,
    model_policy,
    push_weights,
    rollout_policy,
    tokenizer_corpus,
    tool_results,
    warm_start,
    warm_start_rows,
)
from envace.run.job import leave_job, require_data_parallel
from envace.run.layout import RunPaths, TaskSplits, commit_from_ranks, load_splits, prepare_tasks
from envace.run.loop import RunContext, rl_stage, save_rl_checkpoint
from envace.run.main import commit_report, run_main

__all__ = [
    "RunContext",
    "RunPaths",
    "TaskSplits",
    "commit_from_ranks",
    "commit_report",
    "evaluate_model",
    "init_model",
    "leave_job",
    "load_splits",
    "model_policy",
    "prepare_tasks",
    "push_weights",
    "require_data_parallel",
    "rl_stage",
    "rollout_policy",
    "run_main",
    "save_rl_checkpoint",
    "tokenizer_corpus",
    "tool_results",
    "warm_start",
    "warm_start_rows",
]
