"""Worlds whose whole state is one JSON document (bank, inventory).

A subclass names its tools, the state's shape schema and the rule its cross-references follow,
and gives the empty state, the cross-reference check and one handler per tool; loading,
validation, dispatch and snapshots are shared here.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

from envace.envs.schema_check import ToolTable, check_state_shape
from envace.envs.state import id_room_problem
from envace.errors import UserInputError

__all__ = ["DocumentWorld"]

Handler = Callable[[dict[str, Any]], dict[str, Any]]


class DocumentWorld(ABC):
    """`Environment` over one JSON state document; see the module docstring."""

    name: str
    TOOLS: ClassVar[list[dict[str, Any]]]
    STATE_SCHEMA: ClassVar[dict[str, Any]]
    RULE: ClassVar[str]  # what a consistent initial state is, said when one is not
    READ_ONLY: ClassVar[frozenset[str]]  # tools that never change the state
    # state collections whose keys are drawn by `next_opaque_id` (each must leave room for more)
    ID_COLLECTIONS: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        self._state = self.empty_state()
        self._table = ToolTable(self.name, self.TOOLS, self.handlers())

    # --- what a subclass gives -----------------------------------------------------------------
    @abstractmethod
    def empty_state(self) -> dict[str, Any]:
        """The state with no entities (defaults for keys an initial state may leave out)."""

    def problems(self, state: dict[str, Any]) -> list[str]:
        """Cross-references the shape schema cannot express; empty when consistent."""
        return []

    @abstractmethod
    def handlers(self) -> dict[str, Handler]:
        """Tool name -> handler; arguments reach a handler after passing the tool's schema."""

    # --- the Environment interface -------------------------------------------------------------
    def tools(self) -> list[dict[str, Any]]:
        return self._table.schemas()

    def reset(self, initial_state: dict[str, Any]) -> None:
        check_state_shape(self.name, self.STATE_SCHEMA, initial_state)
        state = self.empty_state()
        state.update(copy.deepcopy(initial_state))
        full = [id_room_problem(key, state[key]) for key in self.ID_COLLECTIONS]
        if any(full):
            raise UserInputError(
                f"{self.name} initial_state is too full: {'; '.join(p for p in full if p)}; "
                "remove entries so that new ids can be drawn"
            )
        problems = self.problems(state)
        if problems:
            raise UserInputError(
                f"{self.name} initial_state is inconsistent: {'; '.join(problems)}; {self.RULE}"
            )
        self._state = state

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self._table.call(name, arguments)

    def snapshot(self) -> dict[str, Any]:
        return copy.deepcopy(self._state)
