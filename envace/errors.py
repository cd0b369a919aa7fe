"""Errors a user can act on. Every one says what failed, with which input, and how to fix it."""

from __future__ import annotations

__all__ = ["ConfigError", "EnvaceError", "TrainingDiverged", "UserInputError", "require_finite"]


class EnvaceError(Exception):
    """Base class of every error EnvACE raises on purpose."""


class UserInputError(EnvaceError):
    """Bad input from the user (a file, a flag, a value): the CLI prints it and exits with code 2."""


class ConfigError(UserInputError):
    """A configuration key has a bad value. The message names the key path, the value and the fix."""


class TrainingDiverged(UserInputError):
    """A loss or the weights stopped being finite numbers (most often: the learning rate is too
    high). Raised before anything non-finite is saved, so the newest checkpoint is intact."""


def require_finite(value: float, what: str, fix: str) -> None:
    """Raise TrainingDiverged naming `what` and `fix` when `value` is nan or infinite."""
    if value != value or value in (float("inf"), float("-inf")):
        raise TrainingDiverged(
            f"training diverged: {what} is {value}; nothing non-finite was saved, the newest"
            f" committed checkpoint is intact (continue from it with --resume). {fix}"
        )
