"""rollout.tool_schemas: compact gives the caller and the simulator the same cut-down tool text,
in warm-start rows exactly as in rollouts (one engine builds both)."""

from __future__ import annotations

from pathlib import Path

import pytest

from envace.config import load_config
from envace.policy.chat import ChatRenderer
from envace.run import load_splits, rollout_config, warm_start_rows
from envace.tasks.generate import write_splits


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
    assert rollout_config(cfg).tool_schemas == schemas
    renderer = ChatRenderer(tiny_tokenizer)
    rows, broken = warm_start_rows(cfg, renderer, splits)
    assert broken == 0
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
