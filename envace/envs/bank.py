"""The `bank` world: customers with a PIN, checking and savings accounts, transfers.

Rules: a customer must `authenticate` before anything touches their accounts (one customer is
logged in at a time); account ids are opaque (`ACC-7f3a`), so an agent finds them with
`list_accounts`; a transfer needs the owner of the source account logged in, two distinct
accounts, a positive whole-dollar amount and enough money. Amounts are integers (dollars), so
balances compare exactly.

State (also the `initial_state` format; optional keys default to empty):

    {"customers": {"Alice": {"pin": "4821"}},
     "accounts": {"ACC-1a2b": {"owner": "Alice", "type": "checking", "balance": 500}},
     "transactions": {"TX-9c0d": {"from": "ACC-1a2b", "to": "ACC-3e4f", "amount": 50}},
     "session": {"customer": null},
     "ids": {"salt": "5f1e", "next": 0}}
"""

from __future__ import annotations

from typing import Any

from envace.envs.base import tool_error
from envace.envs.document import DocumentWorld, Handler
from envace.envs.schema_check import function_tool
from envace.envs.state import next_opaque_id

__all__ = ["BankWorld"]

_NAME = {"type": "string", "minLength": 1, "maxLength": 64, "description": "customer name"}
_ACCOUNT = {"type": "string", "minLength": 1, "maxLength": 64, "description": "account id"}
_PIN = {"type": "string", "pattern": "^[0-9]{4}$", "description": "4-digit PIN"}

_TOOLS = [
    function_tool(
        "authenticate", "Log a customer in with their PIN.", {"customer": _NAME, "pin": _PIN}
    ),
    function_tool(
        "list_accounts",
        "List the accounts (id, type) of a logged-in customer.",
        {"customer": _NAME},
    ),
    function_tool(
        "get_balance",
        "Balance of an account in dollars. The owner must be logged in.",
        {"account_id": _ACCOUNT},
    ),
    function_tool(
        "transfer",
        "Move whole dollars between two accounts. The owner of from_account must be logged in.",
        {
            "from_account": _ACCOUNT,
            "to_account": _ACCOUNT,
            "amount": {"type": "integer", "minimum": 1, "description": "dollars"},
        },
    ),
    function_tool(
        "get_transactions",
        "Transfers into or out of an account, oldest first. The owner must be logged in.",
        {"account_id": _ACCOUNT},
    ),
]

_IDS_SCHEMA = {
    "type": "object",
    "required": ["salt", "next"],
    "additionalProperties": False,
    "properties": {"salt": {"type": "string"}, "next": {"type": "integer", "minimum": 0}},
}

_STATE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["customers", "accounts"],
    "additionalProperties": False,
    "properties": {
        "customers": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["pin"],
                "additionalProperties": False,
                "properties": {"pin": _PIN},
            },
        },
        "accounts": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["owner", "type", "balance"],
                "additionalProperties": False,
                "properties": {
                    "owner": {"type": "string"},
                    "type": {"enum": ["checking", "savings"]},
                    "balance": {"type": "integer", "minimum": 0},
                },
            },
        },
        "transactions": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["from", "to", "amount"],
                "additionalProperties": False,
                "properties": {
                    "from": {"type": "string"},
                    "to": {"type": "string"},
                    "amount": {"type": "integer", "minimum": 1},
                },
            },
        },
        "session": {
            "type": "object",
            "required": ["customer"],
            "additionalProperties": False,
            "properties": {"customer": {"type": ["string", "null"]}},
        },
        "ids": _IDS_SCHEMA,
    },
}


def _empty_state() -> dict[str, Any]:
    return {
        "customers": {},
        "accounts": {},
        "transactions": {},
        "session": {"customer": None},
        "ids": {"salt": "", "next": 0},
    }


def _reference_problems(state: dict[str, Any]) -> list[str]:
    """Cross-references the shape schema cannot express (owners, transfer ends, session)."""
    problems = [
        f"accounts.{acc}.owner: unknown customer {info['owner']!r}"
        for acc, info in state["accounts"].items()
        if info["owner"] not in state["customers"]
    ]
    for tx, info in state["transactions"].items():
        problems += [
            f"transactions.{tx}.{end}: unknown account {info[end]!r}"
            for end in ("from", "to")
            if info[end] not in state["accounts"]
        ]
    customer = state["session"]["customer"]
    if customer is not None and customer not in state["customers"]:
        problems.append(f"session.customer: unknown customer {customer!r}")
    return problems


class BankWorld(DocumentWorld):
    """The executable bank (see the module docstring for the rules and the state format)."""

    name = "bank"
    TOOLS = _TOOLS
    STATE_SCHEMA = _STATE_SCHEMA
    RULE = "every account owner, transfer end and session customer must exist"
    ID_COLLECTIONS = ("transactions",)
    # authenticate is not read-only: it changes who the session belongs to.
    READ_ONLY = frozenset({"list_accounts", "get_balance", "get_transactions"})

    def empty_state(self) -> dict[str, Any]:
        return _empty_state()

    def problems(self, state: dict[str, Any]) -> list[str]:
        return _reference_problems(state)

    def handlers(self) -> dict[str, Handler]:
        return {
            "authenticate": self._authenticate,
            "list_accounts": self._list_accounts,
            "get_balance": self._get_balance,
            "transfer": self._transfer,
            "get_transactions": self._get_transactions,
        }

    # Handlers: arguments have passed the tool's schema.

    def _authenticate(self, args: dict[str, Any]) -> dict[str, Any]:
        customer = args["customer"]
        record = self._state["customers"].get(customer)
        if record is None:
            return _unknown_customer(customer)
        if record["pin"] != args["pin"]:
            return tool_error("WRONG_PIN", f"wrong PIN for {customer}")
        self._state["session"]["customer"] = customer
        return {"authenticated": True, "customer": customer}

    def _list_accounts(self, args: dict[str, Any]) -> dict[str, Any]:
        customer = args["customer"]
        if customer not in self._state["customers"]:
            return _unknown_customer(customer)
        if self._state["session"]["customer"] != customer:
            return _not_logged_in(customer)
        accounts = [
            {"id": acc, "type": info["type"]}
            for acc, info in sorted(self._state["accounts"].items())
            if info["owner"] == customer
        ]
        return {"accounts": accounts}

    def _owner_error(self, account_id: str) -> dict[str, Any] | None:
        """The error for acting on `account_id`, or None when it exists and its owner is in."""
        account = self._state["accounts"].get(account_id)
        if account is None:
            return tool_error("UNKNOWN_ACCOUNT", f"no account {account_id}; use list_accounts")
        if self._state["session"]["customer"] != account["owner"]:
            return _not_logged_in(account["owner"])
        return None

    def _get_balance(self, args: dict[str, Any]) -> dict[str, Any]:
        account_id = args["account_id"]
        error = self._owner_error(account_id)
        if error is not None:
            return error
        return {"account_id": account_id, "balance": self._state["accounts"][account_id]["balance"]}

    def _transfer(self, args: dict[str, Any]) -> dict[str, Any]:
        source, target, amount = args["from_account"], args["to_account"], args["amount"]
        error = self._owner_error(source)
        if error is not None:
            return error
        accounts = self._state["accounts"]
        if target not in accounts:
            return tool_error("UNKNOWN_ACCOUNT", f"no account {target}")
        if target == source:
            return tool_error("SAME_ACCOUNT", "from_account and to_account must differ")
        if accounts[source]["balance"] < amount:
            return tool_error("INSUFFICIENT_FUNDS", f"{source} has less than {amount} dollars")
        accounts[source]["balance"] -= amount
        accounts[target]["balance"] += amount
        transactions = self._state["transactions"]
        tx = next_opaque_id(self._state["ids"], "TX", transactions)
        transactions[tx] = {"from": source, "to": target, "amount": amount}
        return {"transaction_id": tx, "balance": accounts[source]["balance"]}

    def _get_transactions(self, args: dict[str, Any]) -> dict[str, Any]:
        account_id = args["account_id"]
        error = self._owner_error(account_id)
        if error is not None:
            return error
        history = [
            {"id": tx, **info}
            for tx, info in self._state["transactions"].items()
            if account_id in (info["from"], info["to"])
        ]
        return {"transactions": history}


def _unknown_customer(customer: str) -> dict[str, Any]:
    return tool_error("UNKNOWN_CUSTOMER", f"no customer named {customer}")


def _not_logged_in(customer: str) -> dict[str, Any]:
    return tool_error("NOT_AUTHENTICATED", f"{customer} must authenticate first")
