"""Real executable tool worlds (the ground truth for evaluation and the "real" baseline).

Each world implements `Environment`: JSON-schema tools, hidden state, deterministic dynamics.
Look one up by name with `make_environment`; grade a final state with `success_mismatch` (a task's success rule).
"""

from envace.envs.bank import BankWorld
from envace.envs.base import Environment, is_error_result, tool_error
from envace.envs.files import FilesWorld, files_state
from envace.envs.inventory import InventoryWorld
from envace.envs.registry import environment_names, make_environment
from envace.envs.state import final_state_matches, first_mismatch, success_mismatch

__all__ = [
    "BankWorld",
    "Environment",
    "FilesWorld",
    "InventoryWorld",
    "environment_names",
    "files_state",
    "final_state_matches",
    "first_mismatch",
    "is_error_result",
    "make_environment",
    "success_mismatch",
    "tool_error",
]
