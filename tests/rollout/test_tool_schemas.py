"""rollout.tool_schemas: compact gives the caller and the simulator the same cut-down tool text,
in warm-start rows exactly as in RL rollouts (one engine builds both, from one RolloutConfig)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from envace.config import load_config
from envace.policy.chat import ChatRenderer
from envace.rollout.engine import RolloutConfig
from envace.rollout.grading import TaskGrader
from envace.rollout.policies import OraclePolicy
from envace.run import load_splits, warm_start_rows
from envace.tasks.generate import write_splits
from envace.train.rl import RLTrainer
from tests.rollout.rl_testlib import roomy_rl_setup


@pytest.mark.parametrize("schemas", ["full", "compact"])
def test_both_roles_see_the_chosen_tool_schemas(
    schemas: str, tmp_path: Path, tiny_tokenizer: object
) -> None:
    write_splits(tmp_path, 3, 1, 0)
    splits = load_splits(tmp_path)
    sets = [
        f"rollout.tool_schemas={schemas}",
        "rollout.sim_whitelist=schemas",
        "rollout.max_context_tokens=100000",
        "rollout.max_sim_prompt_tokens=100000",
        "rollout.caller_max_new_tokens=4096",
        "rollout.simulator_max_new_tokens=4096",
        "warm_start.max_tokens=100000",
    ]
    cfg = load_config(None, sets)
    assert RolloutConfig.from_config(cfg).tool_schemas == schemas
    renderer = ChatRenderer(tiny_tokenizer)
    rows, broken = warm_start_rows(cfg, renderer, splits)
    assert broken == 0
    _check_prompts(rows, tiny_tokenizer, schemas)


@pytest.mark.parametrize("schemas", ["full", "compact"])
def test_rl_rollouts_see_the_chosen_tool_schemas(
    schemas: str, tmp_path: Path, tiny_tokenizer: object
) -> None:
    """The trainer's rollouts are built from the same RolloutConfig as evaluation's (it once
    built its own and dropped `tool_schemas`: RL trained on full schemas whatever was set)."""
    splits, cfg = roomy_rl_setup(tmp_path, 3, 2, f"rollout.tool_schemas={schemas}")
    policy = OraclePolicy(ChatRenderer(tiny_tokenizer))
    trainer = RLTrainer(cfg, splits.train, policy, [], TaskGrader())
    assert trainer.rollout_cfg == RolloutConfig.from_config(cfg)
    rows, _ = trainer.collect(0)
    _check_prompts(rows, tiny_tokenizer, schemas)


def _check_prompts(rows: list[Any], tiny_tokenizer: Any, schemas: str) -> None:
    texts = {
        role: [tiny_tokenizer.decode(r.prompt_ids) for r in rows if r.role == role]
        for role in ("caller", "simulator")
    }
    assert texts["caller"] and texts["simulator"]
    for role, prompts in texts.items():
        for text in prompts:
            # Every generated task's schemas carry limits (maxLength, additionalProperties).
            assert ("additionalProperties" in text) == (schemas == "full"), role
            assert '"description"' in text, role  # descriptions stay in both forms
