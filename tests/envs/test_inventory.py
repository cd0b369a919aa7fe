"""The inventory world: sku lookups, orders, cancellation, restock, determinism."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from envace.envs.inventory import InventoryWorld
from envace.errors import UserInputError

STATE: dict[str, Any] = {
    "items": {
        "SKU-01": {"name": "red mug", "stock": 10, "price": 8},
        "SKU-02": {"name": "blue lamp", "stock": 0, "price": 30},
    },
    "ids": {"salt": "shop", "next": 0},
}


def _shop() -> InventoryWorld:
    world = InventoryWorld()
    world.reset(copy.deepcopy(STATE))
    return world


def _code(result: dict[str, Any]) -> str:
    return str(result["error"]["code"])


def test_find_then_order_then_cancel_restores_stock() -> None:
    world = _shop()
    found = world.call("find_item", {"name": " Red Mug "})
    assert found == {"sku": "SKU-01", "name": "red mug", "price": 8}
    order = world.call("create_order", {"sku": "SKU-01", "quantity": 3})
    assert order["total"] == 24 and order["order_id"].startswith("ORD-")
    assert world.call("get_stock", {"sku": "SKU-01"}) == {"sku": "SKU-01", "stock": 7}
    oid = order["order_id"]
    assert world.snapshot()["orders"] == {oid: {"sku": "SKU-01", "quantity": 3, "status": "open"}}
    assert world.call("cancel_order", {"order_id": oid}) == {"order_id": oid, "status": "cancelled"}
    assert world.call("get_stock", {"sku": "SKU-01"})["stock"] == 10
    assert _code(world.call("cancel_order", {"order_id": oid})) == "ALREADY_CANCELLED"
    assert world.call("get_stock", {"sku": "SKU-01"})["stock"] == 10  # not restored twice


def test_name_is_not_a_sku() -> None:
    world = _shop()
    result = world.call("create_order", {"sku": "red mug", "quantity": 1})
    assert _code(result) == "UNKNOWN_SKU" and "find_item" in result["error"]["message"]
    assert _code(world.call("find_item", {"name": "green mug"})) == "NOT_FOUND"


def test_insufficient_stock_changes_nothing() -> None:
    world = _shop()
    before = world.snapshot()
    result = world.call("create_order", {"sku": "SKU-01", "quantity": 11})
    assert _code(result) == "INSUFFICIENT_STOCK" and "only 10" in result["error"]["message"]
    assert (
        _code(world.call("create_order", {"sku": "SKU-02", "quantity": 1})) == "INSUFFICIENT_STOCK"
    )
    assert world.snapshot() == before
    assert "order_id" in world.call("create_order", {"sku": "SKU-01", "quantity": 10})


def test_restock_adds_units() -> None:
    world = _shop()
    assert world.call("restock", {"sku": "SKU-02", "quantity": 5}) == {"sku": "SKU-02", "stock": 5}
    assert _code(world.call("restock", {"sku": "SKU-99", "quantity": 5})) == "UNKNOWN_SKU"


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("create_order", {"sku": "SKU-01", "quantity": 0}),
        ("create_order", {"sku": "SKU-01", "quantity": 1.5}),
        ("create_order", {"sku": "SKU-01"}),
        ("restock", {"sku": "SKU-01", "quantity": -1}),
        ("find_item", {"name": ""}),
        ("get_stock", {"sku": "SKU-01", "extra": True}),
    ],
)
def test_schema_violations(name: str, arguments: dict[str, Any]) -> None:
    world = _shop()
    before = world.snapshot()
    result = world.call(name, arguments)
    assert _code(result) == "INVALID_ARGUMENTS" and result["error"]["details"]["errors"]
    assert world.snapshot() == before


def test_unknown_tool() -> None:
    assert _code(_shop().call("delete_item", {"sku": "SKU-01"})) == "UNKNOWN_TOOL"


def _run(world: InventoryWorld) -> list[dict[str, Any]]:
    return [world.call("create_order", {"sku": "SKU-01", "quantity": 1}) for _ in range(4)]


def test_determinism_and_distinct_order_ids() -> None:
    first, second = _shop(), _shop()
    results = _run(first)
    assert results == _run(second)
    assert json.dumps(first.snapshot()) == json.dumps(second.snapshot())
    assert len({r["order_id"] for r in results}) == 4


def test_snapshot_deep_copy_and_reset() -> None:
    world = _shop()
    snap = world.snapshot()
    snap["items"]["SKU-01"]["stock"] = 999
    assert world.snapshot()["items"]["SKU-01"]["stock"] == 10
    _run(world)
    world.reset(copy.deepcopy(STATE))
    assert world.snapshot() == {**copy.deepcopy(STATE), "orders": {}}


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"items": {"S": {"name": "a", "stock": -1, "price": 1}}}, "malformed"),
        (
            {
                "items": {
                    "S1": {"name": "Mug", "stock": 1, "price": 1},
                    "S2": {"name": "mug", "stock": 1, "price": 1},
                }
            },
            "also the name of S1",
        ),
        (
            {"items": {}, "orders": {"O": {"sku": "S", "quantity": 1, "status": "open"}}},
            "unknown sku 'S'",
        ),
    ],
)
def test_bad_initial_states_are_refused(state: dict[str, Any], message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        InventoryWorld().reset(state)
