"""Errors a user can act on. Every one says what failed, with which input, and how to fix it."""

from __future__ import annotations

import math

__all__ = [
    "ConfigError",
    "EnvaceError",
    "TrainingDiverged",
    "UserInputError",
    "diverged",
    "require_finite",
]


class EnvaceError(Exception):
    """Base class of every error EnvACE raises on purpose."""


class UserInputError(EnvaceError):
    """Bad input from the user (a file, a flag, a value): the CLI prints it and exits with code 2."""


class ConfigError(UserInputError):
    """A configuration key has a bad value. The message names the key path, the value and the fix."""


class TrainingDiverged(UserInputError):
    """A loss or the weights stopped being finite numbers (most often: the learning rate is too
    high). Raised before anything non-finite is saved, so the newest checkpoint is intact."""


def diverged(what: str, fix: str) -> TrainingDiverged:
    """The error for a run whose numbers stopped being finite: `what` says which, `fix` how."""
    return TrainingDiverged(
        f"training diverged: {what}; nothing non-finite was saved, the newest committed"
        f" checkpoint is intact (continue from it with --resume). {fix}"
    )


def require_finite(value: float, what: str, fix: str) -> None:
    """Raise TrainingDiverged naming `what` and `fix` when `value` is nan or infinite."""
    if not math.isfinite(value):
        raise diverged(f"{what} is {value}", fix)
