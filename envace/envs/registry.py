"""Environment names -> executable worlds. A task's `environment.name` is looked up here."""

from __future__ import annotations

from collections.abc import Callable

from envace.envs.bank import BankWorld
from envace.envs.base import Environment
from envace.envs.files import FilesWorld
from envace.envs.inventory import InventoryWorld
from envace.errors import UserInputError

__all__ = ["environment_names", "make_environment", "read_only_tools"]

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


def read_only_tools(name: str | None) -> frozenset[str] | None:
    """The tools of world `name` that never change its state (`READ_ONLY`); None when the
    world is unknown or declares none: then every call may change something."""
    factory = _FACTORIES.get(name or "")
    read_only = getattr(factory, "READ_ONLY", None)
    return frozenset(read_only) if read_only is not None else None
