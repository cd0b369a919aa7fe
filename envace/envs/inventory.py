"""The `inventory` world: a shop's items (sku, name, stock, price) and orders.

Rules: every tool but `find_item` takes an opaque sku (`SKU-4b1c`), so an agent looks the sku up
by item name first; an order needs enough stock and takes it out; cancelling an open order puts
its stock back; `restock` adds units. Quantities and prices are integers.

State (also the `initial_state` format; optional keys default to empty):

    {"items": {"SKU-4b1c": {"name": "red mug", "stock": 12, "price": 8}},
     "orders": {"ORD-77aa": {"sku": "SKU-4b1c", "quantity": 2, "status": "open"}},
     "ids": {"salt": "5f1e", "next": 0}}
"""

from __future__ import annotations

from typing import Any

from envace.envs.base import tool_error
from envace.envs.document import DocumentWorld, Handler
from envace.envs.schema_check import function_tool
from envace.envs.state import next_opaque_id

__all__ = ["InventoryWorld"]

_SKU = {"type": "string", "minLength": 1, "maxLength": 64, "description": "sku from find_item"}
_QUANTITY = {"type": "integer", "minimum": 1, "maximum": 10000}

_TOOLS = [
    function_tool(
        "find_item",
        "Look an item up by its name; returns its sku and price.",
        {"name": {"type": "string", "minLength": 1, "maxLength": 64}},
    ),
    function_tool("get_stock", "Units in stock for a sku.", {"sku": _SKU}),
    function_tool(
        "create_order",
        "Order units of a sku; needs enough stock. Returns the order id.",
        {"sku": _SKU, "quantity": _QUANTITY},
    ),
    function_tool(
        "cancel_order",
        "Cancel an open order; its units go back to stock.",
        {"order_id": {"type": "string", "minLength": 1, "maxLength": 64}},
    ),
    function_tool("restock", "Add units of a sku to stock.", {"sku": _SKU, "quantity": _QUANTITY}),
]

_STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["items"],
    "additionalProperties": False,
    "properties": {
        "items": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["name", "stock", "price"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "stock": {"type": "integer", "minimum": 0},
                    "price": {"type": "integer", "minimum": 0},
                },
            },
        },
        "orders": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["sku", "quantity", "status"],
                "additionalProperties": False,
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer", "minimum": 1},
                    "status": {"enum": ["open", "cancelled"]},
                },
            },
        },
        "ids": {
            "type": "object",
            "required": ["salt", "next"],
            "additionalProperties": False,
            "properties": {"salt": {"type": "string"}, "next": {"type": "integer", "minimum": 0}},
        },
    },
}


def _empty_state() -> dict[str, Any]:
    return {"items": {}, "orders": {}, "ids": {"salt": "", "next": 0}}


def _name_key(name: str) -> str:
    """Item names match case-insensitively, ignoring surrounding spaces."""
    return name.strip().lower()


def _state_problems(state: dict[str, Any]) -> list[str]:
    problems = [
        f"orders.{order}.sku: unknown sku {info['sku']!r}"
        for order, info in state["orders"].items()
        if info["sku"] not in state["items"]
    ]
    seen: dict[str, str] = {}
    for sku, info in state["items"].items():
        key = _name_key(info["name"])
        if key in seen:
            problems.append(f"items.{sku}.name: {info['name']!r} is also the name of {seen[key]}")
        seen[key] = sku
    return problems


class InventoryWorld(DocumentWorld):
    """The executable shop (see the module docstring for the rules and the state format)."""

    name = "inventory"
    TOOLS = _TOOLS
    STATE_SCHEMA = _STATE_SCHEMA
    RULE = "orders must name existing skus and item names must be unique"
    ID_COLLECTIONS = ("orders",)
    READ_ONLY = frozenset({"find_item", "get_stock"})

    def empty_state(self) -> dict[str, Any]:
        return _empty_state()

    def problems(self, state: dict[str, Any]) -> list[str]:
        return _state_problems(state)

    def handlers(self) -> dict[str, Handler]:
        return {
            "find_item": self._find_item,
            "get_stock": self._get_stock,
            "create_order": self._create_order,
            "cancel_order": self._cancel_order,
            "restock": self._restock,
        }

    # Handlers: arguments have passed the tool's schema.

    def _find_item(self, args: dict[str, Any]) -> dict[str, Any]:
        wanted = _name_key(args["name"])
        for sku, info in self._state["items"].items():
            if _name_key(info["name"]) == wanted:
                return {"sku": sku, "name": info["name"], "price": info["price"]}
        return tool_error("NOT_FOUND", f"no item named {args['name']}")

    def _get_stock(self, args: dict[str, Any]) -> dict[str, Any]:
        item = self._state["items"].get(args["sku"])
        if item is None:
            return _unknown_sku(args["sku"])
        return {"sku": args["sku"], "stock": item["stock"]}

    def _create_order(self, args: dict[str, Any]) -> dict[str, Any]:
        sku, quantity = args["sku"], args["quantity"]
        item = self._state["items"].get(sku)
        if item is None:
            return _unknown_sku(sku)
        if item["stock"] < quantity:
            return tool_error("INSUFFICIENT_STOCK", f"only {item['stock']} in stock")
        item["stock"] -= quantity
        orders = self._state["orders"]
        order_id = next_opaque_id(self._state["ids"], "ORD", orders)
        orders[order_id] = {"sku": sku, "quantity": quantity, "status": "open"}
        return {"order_id": order_id, "total": quantity * item["price"]}

    def _cancel_order(self, args: dict[str, Any]) -> dict[str, Any]:
        order_id = args["order_id"]
        order = self._state["orders"].get(order_id)
        if order is None:
            return tool_error("UNKNOWN_ORDER", f"no order {order_id}")
        if order["status"] == "cancelled":
            return tool_error("ALREADY_CANCELLED", f"order {order_id} is already cancelled")
        order["status"] = "cancelled"
        self._state["items"][order["sku"]]["stock"] += order["quantity"]
        return {"order_id": order_id, "status": "cancelled"}

    def _restock(self, args: dict[str, Any]) -> dict[str, Any]:
        item = self._state["items"].get(args["sku"])
        if item is None:
            return _unknown_sku(args["sku"])
        item["stock"] += args["quantity"]
        return {"sku": args["sku"], "stock": item["stock"]}


def _unknown_sku(sku: str) -> dict[str, Any]:
    return tool_error("UNKNOWN_SKU", f"no item with sku {sku}; use find_item")
