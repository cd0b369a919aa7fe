"""BFCL (Berkeley Function Calling Leaderboard) through EnvACE, graded by bfcl-eval's checkers.

bfcl-eval runs only in a subprocess of its own virtual environment (`scripts/setup_bfcl.sh`);
see `client` for why and `worker` for the protocol. Public API:

    with BfclWorker() as worker:
        tasks = load_bfcl_tasks(worker, parse_categories("simple,multi_turn_base"), limit=20)
        episodes = run_bfcl(policy, [t for ts in tasks.values() for t in ts], cfg, worker)
        scores = summarize_bfcl(episodes)   # {category: CategoryScore}
        overall = bfcl_overall({c: s.accuracy for c, s in scores.items()},
                               worker.info["live_counts"])   # BFCL's weighted v4 overall
"""

from envace.evaluate.bfcl.adapter import (
    CATEGORY_ALIASES,
    SUPPORTED_CATEGORIES,
    UNAVAILABLE_CATEGORIES,
    BfclEnvironment,
    BfclEpisode,
    CategoryScore,
    bfcl_rollout_config,
    bfcl_settings,
    episode_output,
    load_bfcl_tasks,
    parse_categories,
    run_bfcl,
    summarize_bfcl,
    task_from_record,
)
from envace.evaluate.bfcl.client import BfclWorker, BfclWorkerError, bfcl_python, bfcl_venv_hint
from envace.evaluate.bfcl.policies import BfclOraclePolicy, EmptyPolicy
from envace.evaluate.bfcl.scoring import BfclOverall, bfcl_overall, category_weights

__all__ = [
    "CATEGORY_ALIASES",
    "SUPPORTED_CATEGORIES",
    "UNAVAILABLE_CATEGORIES",
    "BfclEnvironment",
    "BfclEpisode",
    "BfclOraclePolicy",
    "BfclOverall",
    "BfclWorker",
    "BfclWorkerError",
    "CategoryScore",
    "EmptyPolicy",
    "bfcl_overall",
    "bfcl_python",
    "bfcl_rollout_config",
    "bfcl_settings",
    "bfcl_venv_hint",
    "category_weights",
    "episode_output",
    "load_bfcl_tasks",
    "parse_categories",
    "run_bfcl",
    "summarize_bfcl",
    "task_from_record",
]
