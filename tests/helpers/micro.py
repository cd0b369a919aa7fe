"""Config overrides for a micro run: a 2-layer model and a handful of tasks (~10 s end to end)."""

MICRO = [
    "model.preset=test-micro",
    "model.vocab_size=1024",
    "tasks.n_train=6",
    "tasks.n_test=3",
    "warm_start.epochs=1",
    "warm_start.batch_rows=16",
    "rollout.n=2",
    "rollout.batch_tasks=2",
    "rollout.caller_max_new_tokens=24",
    "rollout.simulator_max_new_tokens=24",
    "rollout.max_steps_per_turn=2",
    "train.lr=1e-3",
    "eval.max_tasks=2",
    "tensorboard=false",
]
