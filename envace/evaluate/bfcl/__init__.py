"""BFCL (Berkeley Function Calling Leaderboard) through EnvACE, graded by bfcl-eval's checkers.

bfcl-eval runs only in a subprocess of its own virtual environment (`scripts/setup_bfcl.sh`);
see `client` for why and `worker` for the protocol. Public API:

    with BfclWorker() as worker:
        tasks = load_bfcl_tasks(worker, parse_categories("simple,multi_turn_base"), limit=20)
        episodes = run_bfcl(policy, [t for ts in tasks.values() for t in ts], cfg, worker)
        scores = summarize_bfcl(episodes)   # {category: CategoryScore}
"""

from envace.evaluate.bfcl.adapter import (
    SUPPORTED_CATEGORIES,
    BfclEnvironment,
    BfclEpisode,
    CategoryScore,
    bfcl_rollout_config,
    episode_output,
    load_bfcl_tasks,
    parse_categories,
    run_bfcl,
    summarize_bfcl,
    task_from_record,
)
from envace.evaluate.bfcl.client import BfclWorker, BfclWorkerError, bfcl_python, bfcl_venv_hint
from envace.evaluate.bfcl.policies import BfclOraclePolicy, EmptyPolicy

__all__ = [
    "SUPPORTED_CATEGORIES",
    "BfclEnvironment",
    "BfclEpisode",
    "BfclOraclePolicy",
    "BfclWorker",
    "BfclWorkerError",
    "CategoryScore",
    "EmptyPolicy",
    "bfcl_python",
    "bfcl_rollout_config",
    "bfcl_venv_hint",
    "episode_output",
    "load_bfcl_tasks",
    "parse_categories",
    "run_bfcl",
    "summarize_bfcl",
    "task_from_record",
]
