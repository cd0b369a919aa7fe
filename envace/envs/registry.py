"""Environment names -> executable worlds. A task's `environment.name` is looked up here."""

from __future__ import annotations

from collections.abc import Callable

from envace.envs.bank import BankWorld
from envace.envs.base import Environment
from envace.envs.files import FilesWorld
from envace.envs.inventory import InventoryWorld
from envace.errors import UserInputError

__all__ = ["environment_names", "make_environment"]

# A new world is one new module plus one line here.
_FACTORIES: dict[str, Callable[[], Environment]] = {
    BankWorld.name: BankWorld,
    FilesWorld.name: FilesWorld,
    InventoryWorld.name: InventoryWorld,
}


def environment_names() -> list[str]:
    """The names `make_environment` accepts, sorted."""
    return sorted(_FACTORIES)


def make_environment(name: str) -> Environment:
    """A fresh, empty world called `name`; call `reset(initial_state)` before using it."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise UserInputError(
            f"unknown environment {name!r}; known environments: {', '.join(environment_names())}"
        )
    return factory()
