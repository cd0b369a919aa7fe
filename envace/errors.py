"""Errors a user can act on. Every one says what failed, with which input, and how to fix it."""

from __future__ import annotations

__all__ = ["ConfigError", "EnvaceError", "UserInputError"]


class EnvaceError(Exception):
    """Base class of every error EnvACE raises on purpose."""


class UserInputError(EnvaceError):
    """Bad input from the user (a file, a flag, a value): the CLI prints it and exits with code 2."""


class ConfigError(UserInputError):
    """A configuration key has a bad value. The message names the key path, the value and the fix."""
