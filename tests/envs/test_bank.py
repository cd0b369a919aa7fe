"""The bank world: authentication order, transfers, errors, determinism, snapshots."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from envace.envs.bank import BankWorld
from envace.errors import UserInputError

STATE: dict[str, Any] = {
    "customers": {"Alice": {"pin": "1234"}, "Bob": {"pin": "9876"}},
    "accounts": {
        "ACC-a1": {"owner": "Alice", "type": "checking", "balance": 500},
        "ACC-a2": {"owner": "Alice", "type": "savings", "balance": 100},
        "ACC-b1": {"owner": "Bob", "type": "checking", "balance": 70},
    },
    "ids": {"salt": "test", "next": 0},
}


def _bank(state: dict[str, Any] | None = None) -> BankWorld:
    world = BankWorld()
    world.reset(copy.deepcopy(STATE if state is None else state))
    return world


def _login(world: BankWorld, who: str = "Alice", pin: str = "1234") -> None:
    assert world.call("authenticate", {"customer": who, "pin": pin}) == {
        "authenticated": True,
        "customer": who,
    }


def _code(result: dict[str, Any]) -> str:
    return str(result["error"]["code"])


def test_transfer_before_authenticate_is_refused_and_changes_nothing() -> None:
    world = _bank()
    before = world.snapshot()
    result = world.call("transfer", {"from_account": "ACC-a1", "to_account": "ACC-a2", "amount": 5})
    assert _code(result) == "NOT_AUTHENTICATED"
    assert (
        world.call("list_accounts", {"customer": "Alice"})["error"]["code"] == "NOT_AUTHENTICATED"
    )
    assert _code(world.call("get_balance", {"account_id": "ACC-a1"})) == "NOT_AUTHENTICATED"
    assert world.snapshot() == before


def test_lookup_then_transfer_moves_money_and_records_it() -> None:
    world = _bank()
    _login(world)
    accounts = world.call("list_accounts", {"customer": "Alice"})
    assert accounts == {
        "accounts": [{"id": "ACC-a1", "type": "checking"}, {"id": "ACC-a2", "type": "savings"}]
    }
    done = world.call("transfer", {"from_account": "ACC-a1", "to_account": "ACC-a2", "amount": 120})
    assert set(done) == {"transaction_id", "balance"} and done["balance"] == 380
    assert world.call("get_balance", {"account_id": "ACC-a2"}) == {
        "account_id": "ACC-a2",
        "balance": 220,
    }
    tx = done["transaction_id"]
    assert world.call("get_transactions", {"account_id": "ACC-a2"}) == {
        "transactions": [{"id": tx, "from": "ACC-a1", "to": "ACC-a2", "amount": 120}]
    }
    snap = world.snapshot()
    assert snap["transactions"] == {tx: {"from": "ACC-a1", "to": "ACC-a2", "amount": 120}}
    assert snap["session"] == {"customer": "Alice"}


def test_paying_another_customer_needs_only_the_payer_logged_in() -> None:
    world = _bank()
    _login(world)
    world.call("transfer", {"from_account": "ACC-a1", "to_account": "ACC-b1", "amount": 30})
    assert world.snapshot()["accounts"]["ACC-b1"]["balance"] == 100
    # ...but Alice cannot touch Bob's account.
    back = world.call("transfer", {"from_account": "ACC-b1", "to_account": "ACC-a1", "amount": 1})
    assert _code(back) == "NOT_AUTHENTICATED" and "Bob" in back["error"]["message"]
    assert _code(world.call("list_accounts", {"customer": "Bob"})) == "NOT_AUTHENTICATED"


def test_logging_in_as_someone_else_ends_the_first_session() -> None:
    world = _bank()
    _login(world)
    _login(world, "Bob", "9876")
    assert _code(world.call("get_balance", {"account_id": "ACC-a1"})) == "NOT_AUTHENTICATED"


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        ({"from_account": "ACC-a2", "to_account": "ACC-a1", "amount": 101}, "INSUFFICIENT_FUNDS"),
        ({"from_account": "ACC-a1", "to_account": "ACC-a1", "amount": 1}, "SAME_ACCOUNT"),
        ({"from_account": "ACC-zz", "to_account": "ACC-a1", "amount": 1}, "UNKNOWN_ACCOUNT"),
        ({"from_account": "ACC-a1", "to_account": "ACC-zz", "amount": 1}, "UNKNOWN_ACCOUNT"),
        ({"from_account": "ACC-a1", "to_account": "ACC-a2", "amount": 0}, "INVALID_ARGUMENTS"),
        ({"from_account": "ACC-a1", "to_account": "ACC-a2", "amount": -5}, "INVALID_ARGUMENTS"),
        ({"from_account": "ACC-a1", "to_account": "ACC-a2", "amount": 2.5}, "INVALID_ARGUMENTS"),
        ({"from_account": "ACC-a1", "to_account": "ACC-a2", "amount": "5"}, "INVALID_ARGUMENTS"),
        ({"from_account": "ACC-a1", "amount": 5}, "INVALID_ARGUMENTS"),
        (
            {"from_account": "ACC-a1", "to_account": "ACC-a2", "amount": 5, "memo": "x"},
            "INVALID_ARGUMENTS",
        ),
    ],
)
def test_bad_transfers_fail_and_change_nothing(arguments: dict[str, Any], code: str) -> None:
    world = _bank()
    _login(world)
    before = world.snapshot()
    assert _code(world.call("transfer", arguments)) == code
    assert world.snapshot() == before


def test_whole_balance_can_be_moved() -> None:
    world = _bank()
    _login(world)
    ok = world.call("transfer", {"from_account": "ACC-a2", "to_account": "ACC-a1", "amount": 100})
    assert ok["balance"] == 0


def test_authentication_errors() -> None:
    world = _bank()
    assert _code(world.call("authenticate", {"customer": "Alice", "pin": "0000"})) == "WRONG_PIN"
    assert (
        _code(world.call("authenticate", {"customer": "Zed", "pin": "1234"})) == "UNKNOWN_CUSTOMER"
    )
    bad_pin = world.call("authenticate", {"customer": "Alice", "pin": "12a4"})
    assert _code(bad_pin) == "INVALID_ARGUMENTS"
    assert world.snapshot()["session"] == {"customer": None}
    assert _code(world.call("list_accounts", {"customer": "Zed"})) == "UNKNOWN_CUSTOMER"


def test_unknown_tool() -> None:
    result = _bank().call("withdraw", {"account_id": "ACC-a1"})
    assert _code(result) == "UNKNOWN_TOOL"


def _session(world: BankWorld) -> list[dict[str, Any]]:
    _login(world)
    calls = [
        ("transfer", {"from_account": "ACC-a1", "to_account": "ACC-a2", "amount": 10}),
        ("transfer", {"from_account": "ACC-a1", "to_account": "ACC-b1", "amount": 20}),
        ("get_transactions", {"account_id": "ACC-a1"}),
    ]
    return [world.call(name, args) for name, args in calls]


def test_same_state_and_calls_give_identical_results_and_states() -> None:
    first, second = _bank(), _bank()
    assert _session(first) == _session(second)
    assert json.dumps(first.snapshot()) == json.dumps(second.snapshot())
    salted = copy.deepcopy(STATE)
    salted["ids"]["salt"] = "other"
    third = _bank(salted)
    assert _session(third)[0]["transaction_id"] != _session(_bank())[0]["transaction_id"]


def test_transaction_ids_are_distinct_and_opaque() -> None:
    world = _bank()
    _login(world)
    ids = [
        world.call("transfer", {"from_account": "ACC-a1", "to_account": "ACC-a2", "amount": 1})[
            "transaction_id"
        ]
        for _ in range(30)
    ]
    assert len(set(ids)) == 30
    assert all(i.startswith("TX-") and len(i) == 7 for i in ids)


def test_snapshot_is_a_deep_copy() -> None:
    world = _bank()
    snap = world.snapshot()
    snap["accounts"]["ACC-a1"]["balance"] = 10**6
    snap["customers"].clear()
    assert world.snapshot()["accounts"]["ACC-a1"]["balance"] == 500
    json.dumps(world.snapshot())  # JSON-serialisable


def test_reset_copies_its_input_and_drops_the_previous_episode() -> None:
    state = copy.deepcopy(STATE)
    world = BankWorld()
    world.reset(state)
    state["accounts"]["ACC-a1"]["balance"] = 1
    assert world.snapshot()["accounts"]["ACC-a1"]["balance"] == 500
    _session(world)
    world.reset(copy.deepcopy(STATE))
    snap = world.snapshot()
    assert snap["transactions"] == {} and snap["session"] == {"customer": None}
    assert snap["ids"] == {"salt": "test", "next": 0}


def test_results_do_not_alias_the_state() -> None:
    world = _bank()
    _login(world)
    listed = world.call("list_accounts", {"customer": "Alice"})
    listed["accounts"][0]["id"] = "hacked"
    assert world.call("list_accounts", {"customer": "Alice"})["accounts"][0]["id"] == "ACC-a1"


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"accounts": {}}, "'customers' is a required property"),
        (
            {
                "customers": {},
                "accounts": {"ACC-1": {"owner": "X", "type": "checking", "balance": 1}},
            },
            "unknown customer 'X'",
        ),
        (
            {
                "customers": {"X": {"pin": "1111"}},
                "accounts": {"ACC-1": {"owner": "X", "type": "credit", "balance": 1}},
            },
            "malformed",
        ),
        (
            {"customers": {"X": {"pin": "1111"}}, "accounts": {}, "session": {"customer": "Y"}},
            "session",
        ),
    ],
)
def test_bad_initial_states_are_refused(state: dict[str, Any], message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        BankWorld().reset(state)


def test_tools_are_closed_openai_schemas() -> None:
    tools = BankWorld().tools()
    names = [t["function"]["name"] for t in tools]
    assert names == ["authenticate", "list_accounts", "get_balance", "transfer", "get_transactions"]
    for tool in tools:
        params = tool["function"]["parameters"]
        assert tool["type"] == "function" and params["additionalProperties"] is False
        assert set(params["required"]) == set(params["properties"])


def test_a_state_without_room_for_new_transaction_ids_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #20: a full id space is refused when the world loads, not found by a loop."""
    from envace.envs import state as state_module

    monkeypatch.setattr(state_module, "ID_SPACE", 8)  # at most 4 transactions then
    full = copy.deepcopy(STATE)
    full["transactions"] = {
        f"TX-{i}": {"from": "ACC-a1", "to": "ACC-b1", "amount": 1} for i in range(5)
    }
    with pytest.raises(UserInputError, match="bank initial_state is too full: transactions: 5 "):
        BankWorld().reset(full)
    del full["transactions"]["TX-0"]
    BankWorld().reset(full)
