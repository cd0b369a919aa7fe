"""Synthetic tool-use tasks for the bank, files and inventory worlds, with gold conversations.

Every task comes from a short template: a random world state, 1-3 templated user turns, and the
calls a perfect agent makes in each turn. The generator *executes* those calls in the real world
(`envace.envs`), so the gold conversation holds real results, later arguments can only be known
from earlier results (an order id, a balance, a file's text), and the success rule is the whole
real final state (`match: whole`: any other change to the world fails the task). A turn that
asks for information carries `answer_facts`, the values its real results gave (the balance, the
listing): an answer must state them. It checks itself: each call fails exactly when the template
expects it to, every gold answer states its facts, the success rule holds at the end, does not
hold at the start, and replaying the expected calls in a fresh world reaches the same final
state.

Splits: every pool value (customer, item, file and folder names, file texts, amounts,
quantities, balances, stock levels, prices, PINs) belongs to one split by a fixed rule,
`split_of(value)`, and entity ids drawn for a test task start with a hex digit 8-f (train: 0-7),
so train and test tasks share no entity and no value. Task `i` of a split depends only on
(seed, split, i), so a larger run extends a smaller one.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace.envs import files_state, is_error_result, make_environment, success_mismatch
from envace.errors import EnvaceError, UserInputError
from envace.tasks.io import atomic_write_text

__all__ = [
    "SPLITS",
    "GenerationError",
    "Splits",
    "generate_splits",
    "oracle_replay",
    "split_of",
    "write_splits",
]

log = logging.getLogger(__name__)

SPLITS = ("train", "test")


class GenerationError(EnvaceError):
    """A generated task failed its self-check (a template bug, never bad user input)."""


def split_of(value: str | int) -> str:
    """The split a pool value belongs to: "test" when crc32 of its text is divisible by 3."""
    return "test" if zlib.crc32(str(value).encode()) % 3 == 0 else "train"


# ---------------------------------------------------------------------------------------------
# Value pools. Each is split by `split_of`; the same value lands in the same split in every pool.


def _syllable_words(count: int, capitalize: bool) -> tuple[str, ...]:
    """`count` distinct two-syllable words ("kavo", "Rimu", ...), in a fixed order.

    Entity pools are large on purpose: with thousands of names, each used by a task or two, a
    model cannot memorise the training names and has to learn to copy them from the context,
    which is what carries over to held-out tasks whose names it has never seen.
    """
    words = [a + b for a in _SYLLABLES for b in _SYLLABLES]
    picked = words[:: max(1, len(words) // count)][:count]
    return tuple(w.capitalize() if capitalize else w for w in picked)


_SYLLABLES = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")
_CUSTOMERS = tuple(dict.fromkeys((  # dict.fromkeys: drop repeats, keep the order
    "Alice", "Bruno", "Carla", "Dmitri", "Elena", "Farah", "Gustav", "Hana", "Ivan", "Jonas",
    "Keiko", "Liam", "Mona", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Samir", "Tara",
    "Umar", "Vera", "Wes", "Xena", "Yuri", "Zoe", "Aaron", "Bella", "Cyrus", "Dana",
    "Emil", "Fiona", "Greta", "Hugo", "Ines", "Jakob", "Kara", "Leon", "Maya", "Nico",
    "Olga", "Pablo", "Rita", "Sven", "Tomas", "Ulla", "Victor", "Wanda", "Yara", "Zane",
    *_syllable_words(2000, capitalize=True),
)))  # fmt: skip
_ADJECTIVES = (
    "red",
    "blue",
    "green",
    "black",
    "white",
    "small",
    "large",
    "steel",
    "wooden",
    "glass",
)
_NOUNS = (
    "mug", "lamp", "chair", "desk", "kettle", "bowl", "plate", "shelf", "clock", "fan", "rug",
    *_syllable_words(200, capitalize=False),
)  # fmt: skip
_ITEMS = tuple(f"{adj} {noun}" for adj in _ADJECTIVES for noun in _NOUNS)
_STEMS = (
    "report", "budget", "notes", "outline", "draft", "invoice", "letter", "plan", "summary", "agenda",
    "minutes", "recipe", "poem", "log", "memo", "list", "schedule", "contract", "receipt", "resume",
    "story", "diary", "ideas", "goals", "chores", "menu", "quotes", "readme", "changes", "tasks",
    *_syllable_words(300, capitalize=False),
)  # fmt: skip
_FILE_NAMES = tuple(f"{stem}.{ext}" for stem in _STEMS for ext in ("txt", "md"))
_FOLDERS = (
    "inbox", "archive", "docs", "work", "home", "backup", "drafts", "old", "shared", "projects",
    "music", "photos", "misc", "trash", "temp", "reports", "mail", "school", "travel", "bills",
    "games", "books", "taxes", "clients",
    *_syllable_words(300, capitalize=False),
)  # fmt: skip
_VERBS = ("buy", "call", "fix", "send", "read", "pay", "clean", "book", "check", "plan")
_OBJECTS = ("milk", "rent", "car", "tickets", "email", "bills", "garden", "room", "notes", "trip")
_PHRASES = tuple(f"{verb} {obj}" for verb in _VERBS for obj in _OBJECTS)
_AMOUNTS = tuple(range(5, 500, 5))  # transfer amounts; also low balances
_BALANCES = tuple(range(500, 5000, 25))  # above every amount, so planned transfers succeed
_QUANTITIES = tuple(range(1, 30))  # order and restock quantities; also low stock
_STOCKS = tuple(range(30, 120))  # above every quantity, so planned orders succeed
_PRICES = tuple(range(2, 100))
_PINS = tuple(str(pin) for pin in range(1000, 10000))


def _part(pool: Sequence[Any], split: str, at_least: int, what: str) -> tuple[Any, ...]:
    kept = tuple(value for value in pool if split_of(value) == split)
    if len(kept) < at_least:
        raise GenerationError(f"pool {what!r} has {len(kept)} {split} values, needs {at_least}")
    return kept


@dataclass(frozen=True)
class _Pools:
    """The values one split may use."""

    split: str
    customers: tuple[str, ...]
    items: tuple[str, ...]
    file_names: tuple[str, ...]
    folders: tuple[str, ...]
    phrases: tuple[str, ...]
    amounts: tuple[int, ...]
    balances: tuple[int, ...]
    quantities: tuple[int, ...]
    stocks: tuple[int, ...]
    prices: tuple[int, ...]
    pins: tuple[str, ...]

    @classmethod
    def for_split(cls, split: str) -> _Pools:
        return cls(
            split=split,
            customers=_part(_CUSTOMERS, split, 3, "customers"),
            items=_part(_ITEMS, split, 4, "items"),
            file_names=_part(_FILE_NAMES, split, 8, "file names"),
            folders=_part(_FOLDERS, split, 4, "folders"),
            phrases=_part(_PHRASES, split, 2, "phrases"),
            amounts=_part(_AMOUNTS, split, 3, "amounts"),
            balances=_part(_BALANCES, split, 1, "balances"),
            quantities=_part(_QUANTITIES, split, 3, "quantities"),
            stocks=_part(_STOCKS, split, 1, "stocks"),
            prices=_part(_PRICES, split, 1, "prices"),
            pins=_part(_PINS, split, 1, "pins"),
        )


def _entity_id(rng: random.Random, prefix: str, split: str, taken: set[str]) -> str:
    """An opaque id like `ACC-7f3a`; the first hex digit is 0-7 for train, 8-f for test."""
    first = "01234567" if split == "train" else "89abcdef"
    while True:
        candidate = f"{prefix}-{rng.choice(first)}{rng.getrandbits(12):03x}"
        if candidate not in taken:
            taken.add(candidate)
            return candidate


def _salt(rng: random.Random) -> str:
    return f"{rng.getrandbits(32):08x}"


# ---------------------------------------------------------------------------------------------
# Recording an episode: run the calls in the real world, keep the expected calls and the gold
# conversation side by side.


class _Episode:
    """A world being driven by a template, with the expected calls and gold messages so far."""

    def __init__(self, world_name: str, system: str, initial_state: dict[str, Any]) -> None:
        self.world_name = world_name
        self.system = system
        self.world = make_environment(world_name)
        self.world.reset(initial_state)
        self.initial_state = self.world.snapshot()
        self.turns: list[dict[str, Any]] = []
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}]

    def user(self, text: str) -> None:
        self.turns.append({"user": text, "expected_calls": []})
        self.messages.append({"role": "user", "content": text})

    def call(self, name: str, arguments: dict[str, Any], *, fails: bool = False) -> dict[str, Any]:
        """Execute one expected call; the template says whether it must fail."""
        result = self.world.call(name, copy.deepcopy(arguments))
        if is_error_result(result) != fails:
            want = "an error" if fails else "success"
            raise GenerationError(
                f"{self.world_name}.{name}({arguments}) gave {result}, want {want}"
            )
        self.turns[-1]["expected_calls"].append({"name": name, "arguments": arguments})
        call_id = f"call_{sum(len(t['expected_calls']) for t in self.turns)}"
        function = {"name": name, "arguments": copy.deepcopy(arguments)}
        tool_call = {"id": call_id, "type": "function", "function": function}
        self.messages.append({"role": "assistant", "content": "", "tool_calls": [tool_call]})
        content = json.dumps(result, separators=(",", ":"), ensure_ascii=False)
        self.messages.append(
            {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}
        )
        return result

    def reply(self, text: str, facts: Sequence[object] = ()) -> None:
        """The gold answer; `facts` (what the real results gave the user asked for) must be in
        it, and every answer to this turn must state them (`answer_facts`)."""
        told = [str(f) for f in facts]
        missing = [f for f in told if f not in text]
        if missing:
            raise GenerationError(f"the gold reply {text!r} does not state {missing}")
        if told:
            self.turns[-1]["answer_facts"] = told
        self.messages.append({"role": "assistant", "content": text})


@dataclass
class _Draft:
    """A template's output: the recorded episode (its final world state is the expected one)."""

    template: str
    episode: _Episode


# ---------------------------------------------------------------------------------------------
# bank templates

_BANK_SYSTEM = (
    "You are a bank assistant. Authenticate the customer with their PIN before using "
    "their accounts. Amounts are whole dollars."
)


@dataclass(frozen=True)
class _Customer:
    name: str
    pin: str
    accounts: dict[str, str]  # type -> account id


def _bank_setup(rng: random.Random, pools: _Pools) -> tuple[dict[str, Any], list[_Customer]]:
    """Two or three customers, each with a checking and a savings account."""
    taken: set[str] = set()
    customers: dict[str, Any] = {}
    accounts: dict[str, Any] = {}
    people = []
    for name in rng.sample(pools.customers, rng.choice((2, 3))):
        pin = rng.choice(pools.pins)
        customers[name] = {"pin": pin}
        ids = {kind: _entity_id(rng, "ACC", pools.split, taken) for kind in ("checking", "savings")}
        for kind, acc in ids.items():
            accounts[acc] = {"owner": name, "type": kind, "balance": rng.choice(pools.balances)}
        people.append(_Customer(name, pin, ids))
    state = {"customers": customers, "accounts": accounts, "ids": {"salt": _salt(rng), "next": 0}}
    return state, people


def _hello(me: _Customer) -> str:
    return f"I am {me.name}, PIN {me.pin}."


def _login(ep: _Episode, me: _Customer) -> dict[str, str]:
    """authenticate + list_accounts, as a perfect agent does; returns type -> id as read."""
    ep.call("authenticate", {"customer": me.name, "pin": me.pin})
    listed = ep.call("list_accounts", {"customer": me.name})["accounts"]
    return {acc["type"]: acc["id"] for acc in listed}


def _transfer(ep: _Episode, src: str, dst: str, amount: int, *, fails: bool = False) -> str:
    args = {"from_account": src, "to_account": dst, "amount": amount}
    result = ep.call("transfer", args, fails=fails)
    return "" if fails else str(result["transaction_id"])


def _bank_transfer_own(rng: random.Random, pools: _Pools) -> _Draft:
    state, people = _bank_setup(rng, pools)
    me, amount = people[0], rng.choice(pools.amounts)
    src, dst = rng.choice((("checking", "savings"), ("savings", "checking")))
    ep = _Episode("bank", _BANK_SYSTEM, state)
    ep.user(f"{_hello(me)} Move {amount} dollars from my {src} to my {dst}.")
    ids = _login(ep, me)
    tx = _transfer(ep, ids[src], ids[dst], amount)
    ep.reply(f"Done. Moved {amount} dollars to your {dst}, transaction {tx}.")
    return _Draft("transfer_own", ep)


def _bank_transfer_back(rng: random.Random, pools: _Pools) -> _Draft:
    state, people = _bank_setup(rng, pools)
    me, amount = people[0], rng.choice(pools.amounts)
    ep = _Episode("bank", _BANK_SYSTEM, state)
    ep.user(f"{_hello(me)} Move {amount} dollars from my checking to my savings.")
    ids = _login(ep, me)
    tx1 = _transfer(ep, ids["checking"], ids["savings"], amount)
    ep.reply(f"Done. Moved {amount} dollars to your savings, transaction {tx1}.")
    ep.user("Please move it back.")
    tx2 = _transfer(ep, ids["savings"], ids["checking"], amount)
    ep.reply(f"Moved {amount} dollars back to your checking, transaction {tx2}.")
    return _Draft("transfer_back", ep)


def _bank_pay_other(rng: random.Random, pools: _Pools) -> _Draft:
    state, people = _bank_setup(rng, pools)
    me, other, amount = people[0], people[1], rng.choice(pools.amounts)
    payee = other.accounts["checking"]
    ep = _Episode("bank", _BANK_SYSTEM, state)
    ep.user(f"{_hello(me)} Send {amount} dollars from my checking to account {payee}.")
    ids = _login(ep, me)
    tx = _transfer(ep, ids["checking"], payee, amount)
    ep.reply(f"Sent {amount} dollars to {payee}, transaction {tx}.")
    ep.user("Show me the transactions of my checking account.")
    history = ep.call("get_transactions", {"account_id": ids["checking"]})["transactions"]
    ep.reply(f"Your checking has {len(history)} transaction(s); the last is {tx}.", [tx])
    return _Draft("pay_other", ep)


def _bank_sweep(rng: random.Random, pools: _Pools) -> _Draft:
    state, people = _bank_setup(rng, pools)
    me = people[0]
    ep = _Episode("bank", _BANK_SYSTEM, state)
    ep.user(f"{_hello(me)} How much is in my savings?")
    ids = _login(ep, me)
    balance = int(ep.call("get_balance", {"account_id": ids["savings"]})["balance"])
    ep.reply(f"Your savings has {balance} dollars.", [balance])
    ep.user("Move all of it to my checking.")
    tx = _transfer(ep, ids["savings"], ids["checking"], balance)
    ep.reply(f"Moved {balance} dollars to your checking, transaction {tx}.")
    return _Draft("sweep", ep)


def _bank_insufficient(rng: random.Random, pools: _Pools) -> _Draft:
    state, people = _bank_setup(rng, pools)
    me = people[0]
    smaller, low, larger = sorted(rng.sample(pools.amounts, 3))
    state["accounts"][me.accounts["checking"]]["balance"] = low
    ep = _Episode("bank", _BANK_SYSTEM, state)
    ep.user(f"{_hello(me)} Move {larger} dollars from my checking to my savings.")
    ids = _login(ep, me)
    _transfer(ep, ids["checking"], ids["savings"], larger, fails=True)
    ep.reply("The transfer failed: your checking does not have enough money.")
    ep.user(f"Then move {smaller} dollars instead.")
    tx = _transfer(ep, ids["checking"], ids["savings"], smaller)
    ep.reply(f"Done. Moved {smaller} dollars to your savings, transaction {tx}.")
    return _Draft("insufficient_funds", ep)


def _bank_wrong_pin(rng: random.Random, pools: _Pools) -> _Draft:
    state, people = _bank_setup(rng, pools)
    me, amount = people[0], rng.choice(pools.amounts)
    wrong = me.pin
    while wrong == me.pin:
        wrong = rng.choice(pools.pins)
    ep = _Episode("bank", _BANK_SYSTEM, state)
    ep.user(f"I am {me.name}, PIN {wrong}. Move {amount} dollars from my savings to my checking.")
    ep.call("authenticate", {"customer": me.name, "pin": wrong}, fails=True)
    ep.reply("That PIN is wrong. Please check it.")
    ep.user(f"Sorry, my PIN is {me.pin}.")
    ids = _login(ep, me)
    tx = _transfer(ep, ids["savings"], ids["checking"], amount)
    ep.reply(f"Done. Moved {amount} dollars to your checking, transaction {tx}.")
    return _Draft("wrong_pin", ep)


# ---------------------------------------------------------------------------------------------
# files templates

_FILES_SYSTEM = "You are a file assistant. Use absolute paths like /docs/a.txt."


@dataclass
class _Layout:
    """Top-level folders with files; `spare` names and folders are unused, for new entries."""

    folders: list[str]
    files: dict[str, str]
    spare_names: list[str]
    spare_folders: list[str]

    def in_folder(self, folder: str) -> list[str]:
        return sorted(p for p in self.files if p.rsplit("/", 1)[0] == folder)

    def state(self) -> dict[str, Any]:
        return files_state(self.files, self.folders)


def _layout(rng: random.Random, pools: _Pools, counts: Sequence[int]) -> _Layout:
    folders = [f"/{name}" for name in rng.sample(pools.folders, len(counts) + 1)]
    names = rng.sample(pools.file_names, sum(counts) + 2)
    files: dict[str, str] = {}
    for folder, count in zip(folders, counts, strict=False):  # the last folder stays spare
        for _ in range(count):
            files[f"{folder}/{names.pop()}"] = rng.choice(pools.phrases)
    return _Layout(folders[: len(counts)], files, names, [folders[-1]])


def _counts(rng: random.Random, *fixed: int) -> list[int]:
    """File counts per folder: the `fixed` ones, then one folder of 0-2 distractor files."""
    return [*fixed, rng.randint(0, 2)]


def _files_write(rng: random.Random, pools: _Pools) -> _Draft:
    lay = _layout(rng, pools, _counts(rng, rng.randint(0, 2)))
    path, text = f"{lay.folders[0]}/{lay.spare_names[0]}", rng.choice(pools.phrases)
    ep = _Episode("files", _FILES_SYSTEM, lay.state())
    ep.user(f"Write '{text}' to {path}.")
    ep.call("write_file", {"path": path, "content": text})
    ep.reply(f"Created {path}.")
    return _Draft("write", ep)


def _files_move(rng: random.Random, pools: _Pools) -> _Draft:
    lay = _layout(rng, pools, _counts(rng, 1))
    src_dir, dst_dir = lay.folders
    ep = _Episode("files", _FILES_SYSTEM, lay.state())
    ep.user(f"Move the file in {src_dir} to {dst_dir}.")
    name = ep.call("list_dir", {"path": src_dir})["entries"][0]
    ep.call("move", {"src": f"{src_dir}/{name}", "dst": f"{dst_dir}/{name}"})
    ep.reply(f"Moved {name} to {dst_dir}.")
    return _Draft("move_lookup", ep)


def _files_move_rename(rng: random.Random, pools: _Pools) -> _Draft:
    lay = _layout(rng, pools, _counts(rng, 1))
    src_dir, dst_dir = lay.folders
    new_name = lay.spare_names[0]
    ep = _Episode("files", _FILES_SYSTEM, lay.state())
    ep.user(f"Move the file in {src_dir} to {dst_dir}.")
    name = ep.call("list_dir", {"path": src_dir})["entries"][0]
    ep.call("move", {"src": f"{src_dir}/{name}", "dst": f"{dst_dir}/{name}"})
    ep.reply(f"Moved {name} to {dst_dir}.")
    ep.user(f"Now rename it to {new_name}.")
    ep.call("move", {"src": f"{dst_dir}/{name}", "dst": f"{dst_dir}/{new_name}"})
    ep.reply(f"Renamed it to {new_name}.")
    return _Draft("move_rename", ep)


def _files_copy(rng: random.Random, pools: _Pools) -> _Draft:
    lay = _layout(rng, pools, _counts(rng, rng.randint(1, 2)))
    src_dir, dst_dir = lay.folders
    src = rng.choice(lay.in_folder(src_dir))
    dst = f"{dst_dir}/{src.rsplit('/', 1)[1]}"
    ep = _Episode("files", _FILES_SYSTEM, lay.state())
    ep.user(f"Copy {src} into {dst_dir}.")
    text = ep.call("read_file", {"path": src})["content"]
    ep.call("write_file", {"path": dst, "content": text})
    ep.reply(f"Copied {src} to {dst}.")
    return _Draft("copy", ep)


def _files_append(rng: random.Random, pools: _Pools) -> _Draft:
    lay = _layout(rng, pools, _counts(rng, rng.randint(1, 3)))
    path = rng.choice(lay.in_folder(lay.folders[0]))
    line = rng.choice(pools.phrases)
    ep = _Episode("files", _FILES_SYSTEM, lay.state())
    ep.user(f"Add the line '{line}' to {path}.")
    text = ep.call("read_file", {"path": path})["content"]
    ep.call("write_file", {"path": path, "content": f"{text}\n{line}"})
    ep.reply(f"Added the line to {path}.")
    return _Draft("append", ep)


def _files_list_delete(rng: random.Random, pools: _Pools) -> _Draft:
    lay = _layout(rng, pools, _counts(rng, rng.randint(2, 3)))
    folder = lay.folders[0]
    victim = rng.choice(lay.in_folder(folder)).rsplit("/", 1)[1]
    ep = _Episode("files", _FILES_SYSTEM, lay.state())
    ep.user(f"What is in {folder}?")
    entries = ep.call("list_dir", {"path": folder})["entries"]
    ep.reply(f"{folder} holds {', '.join(entries)}.", entries)
    ep.user(f"Delete {victim}.")
    ep.call("delete", {"path": f"{folder}/{victim}"})
    ep.reply(f"Deleted {folder}/{victim}.")
    return _Draft("list_delete", ep)


def _files_mkdir_move(rng: random.Random, pools: _Pools) -> _Draft:
    lay = _layout(rng, pools, _counts(rng, rng.randint(1, 2)))
    path = rng.choice(lay.in_folder(lay.folders[0]))
    new_dir = lay.spare_folders[0]
    name = path.rsplit("/", 1)[1]
    ep = _Episode("files", _FILES_SYSTEM, lay.state())
    ep.user(f"Make a folder {new_dir} and move {path} into it.")
    ep.call("make_dir", {"path": new_dir})
    ep.call("move", {"src": path, "dst": f"{new_dir}/{name}"})
    ep.reply(f"Created {new_dir} and moved {name} into it.")
    return _Draft("mkdir_move", ep)


def _files_read_move_list(rng: random.Random, pools: _Pools) -> _Draft:
    lay = _layout(rng, pools, _counts(rng, rng.randint(1, 2)))
    src_dir, dst_dir = lay.folders
    path = rng.choice(lay.in_folder(src_dir))
    name = path.rsplit("/", 1)[1]
    ep = _Episode("files", _FILES_SYSTEM, lay.state())
    ep.user(f"Read {path}.")
    text = ep.call("read_file", {"path": path})["content"]
    ep.reply(f"It says: {text}", [text])
    ep.user(f"Move it to {dst_dir}.")
    ep.call("move", {"src": path, "dst": f"{dst_dir}/{name}"})
    ep.reply(f"Moved it to {dst_dir}/{name}.")
    ep.user(f"What is in {dst_dir} now?")
    entries = ep.call("list_dir", {"path": dst_dir})["entries"]
    ep.reply(f"{dst_dir} holds {', '.join(entries)}.", entries)
    return _Draft("read_move_list", ep)


# ---------------------------------------------------------------------------------------------
# inventory templates

_INVENTORY_SYSTEM = (
    "You are a shop assistant. Look up an item's sku with find_item before using it."
)


def _shop_setup(rng: random.Random, pools: _Pools) -> tuple[dict[str, Any], list[str]]:
    taken: set[str] = set()
    names = rng.sample(pools.items, rng.randint(3, 4))
    items = {
        _entity_id(rng, "SKU", pools.split, taken): {
            "name": name,
            "stock": rng.choice(pools.stocks),
            "price": rng.choice(pools.prices),
        }
        for name in names
    }
    return {"items": items, "orders": {}, "ids": {"salt": _salt(rng), "next": 0}}, names


def _find(ep: _Episode, item: str) -> str:
    return str(ep.call("find_item", {"name": item})["sku"])


def _order(ep: _Episode, sku: str, quantity: int, *, fails: bool = False) -> dict[str, Any]:
    return ep.call("create_order", {"sku": sku, "quantity": quantity}, fails=fails)


def _shop_order(rng: random.Random, pools: _Pools) -> _Draft:
    state, names = _shop_setup(rng, pools)
    item, quantity = names[0], rng.choice(pools.quantities)
    ep = _Episode("inventory", _INVENTORY_SYSTEM, state)
    ep.user(f"Order {quantity} units of {item}.")
    sku = _find(ep, item)
    placed = _order(ep, sku, quantity)
    ep.reply(f"Ordered {quantity} {item}: order {placed['order_id']}, {placed['total']} dollars.")
    return _Draft("order", ep)


def _shop_order_cancel(rng: random.Random, pools: _Pools) -> _Draft:
    state, names = _shop_setup(rng, pools)
    item, quantity = names[0], rng.choice(pools.quantities)
    ep = _Episode("inventory", _INVENTORY_SYSTEM, state)
    ep.user(f"Order {quantity} units of {item}.")
    sku = _find(ep, item)
    order_id = _order(ep, sku, quantity)["order_id"]
    ep.reply(f"Ordered {quantity} {item}: order {order_id}.")
    ep.user("Cancel that order.")
    ep.call("cancel_order", {"order_id": order_id})
    ep.reply(f"Order {order_id} is cancelled.")
    return _Draft("order_cancel", ep)


def _shop_restock(rng: random.Random, pools: _Pools) -> _Draft:
    state, names = _shop_setup(rng, pools)
    item, quantity = names[0], rng.choice(pools.quantities)
    ep = _Episode("inventory", _INVENTORY_SYSTEM, state)
    ep.user(f"Restock {quantity} units of {item}.")
    sku = _find(ep, item)
    stock = ep.call("restock", {"sku": sku, "quantity": quantity})["stock"]
    ep.reply(f"{item} now has {stock} in stock.")
    return _Draft("restock", ep)


def _shop_order_all(rng: random.Random, pools: _Pools) -> _Draft:
    state, names = _shop_setup(rng, pools)
    item = names[0]
    ep = _Episode("inventory", _INVENTORY_SYSTEM, state)
    ep.user(f"How many {item} are in stock?")
    sku = _find(ep, item)
    stock = int(ep.call("get_stock", {"sku": sku})["stock"])
    ep.reply(f"There are {stock} {item} in stock.", [stock])
    ep.user("Order all of them.")
    order_id = _order(ep, sku, stock)["order_id"]
    ep.reply(f"Ordered {stock} {item}: order {order_id}.")
    return _Draft("order_all", ep)


def _shop_insufficient(rng: random.Random, pools: _Pools) -> _Draft:
    state, names = _shop_setup(rng, pools)
    item = names[0]
    smaller, low, larger = sorted(rng.sample(pools.quantities, 3))
    sku_of = {info["name"]: sku for sku, info in state["items"].items()}
    state["items"][sku_of[item]]["stock"] = low
    ep = _Episode("inventory", _INVENTORY_SYSTEM, state)
    ep.user(f"Order {larger} units of {item}.")
    sku = _find(ep, item)
    failed = _order(ep, sku, larger, fails=True)
    ep.reply(f"I could not order: {failed['error']['message']}.")
    ep.user(f"Then order {smaller} instead.")
    order_id = _order(ep, sku, smaller)["order_id"]
    ep.reply(f"Ordered {smaller} {item}: order {order_id}.")
    return _Draft("insufficient_stock", ep)


def _shop_price_order_cancel(rng: random.Random, pools: _Pools) -> _Draft:
    state, names = _shop_setup(rng, pools)
    item, quantity = names[0], rng.choice(pools.quantities)
    ep = _Episode("inventory", _INVENTORY_SYSTEM, state)
    ep.user(f"How much does the {item} cost?")
    found = ep.call("find_item", {"name": item})
    ep.reply(f"The {item} costs {found['price']} dollars.", [found["price"]])
    ep.user(f"Order {quantity} of them.")
    order_id = _order(ep, found["sku"], quantity)["order_id"]
    ep.reply(f"Ordered {quantity} {item}: order {order_id}.")
    ep.user("Actually, cancel it.")
    ep.call("cancel_order", {"order_id": order_id})
    ep.reply(f"Order {order_id} is cancelled.")
    return _Draft("price_order_cancel", ep)


Template = Callable[[random.Random, _Pools], _Draft]

# Task i of a split uses domain i % 3 and a template drawn from that domain's table.
_TEMPLATES: dict[str, tuple[Template, ...]] = {
    "bank": (
        _bank_transfer_own,
        _bank_transfer_back,
        _bank_pay_other,
        _bank_sweep,
        _bank_insufficient,
        _bank_wrong_pin,
    ),
    "files": (
        _files_write,
        _files_move,
        _files_move_rename,
        _files_copy,
        _files_append,
        _files_list_delete,
        _files_mkdir_move,
        _files_read_move_list,
    ),
    "inventory": (
        _shop_order,
        _shop_order_cancel,
        _shop_restock,
        _shop_order_all,
        _shop_insufficient,
        _shop_price_order_cancel,
    ),
}
_DOMAINS = tuple(_TEMPLATES)


# ---------------------------------------------------------------------------------------------
# Assembling, checking and writing tasks


@dataclass(frozen=True)
class Splits:
    """Generated tasks (task JSON objects) and one gold conversation per train task."""

    train: list[dict[str, Any]]
    test: list[dict[str, Any]]
    gold_train: list[dict[str, Any]]


def _turn_dict(turn: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"user": turn["user"]}
    calls = turn["expected_calls"]
    if calls:
        out["expected_calls"] = copy.deepcopy(calls)
    if len(calls) > 1:  # each later call needs an id or value an earlier one returned
        out["ordered"] = True
    if turn.get("answer_facts"):
        out["answer_facts"] = list(turn["answer_facts"])
    return out


def _task_dict(task_id: str, split: str, draft: _Draft) -> dict[str, Any]:
    ep = draft.episode
    task: dict[str, Any] = {
        "id": task_id,
        "system": ep.system,
        "tools": ep.world.tools(),
        "turns": [_turn_dict(turn) for turn in ep.turns],
        "environment": {"name": ep.world_name, "initial_state": copy.deepcopy(ep.initial_state)},
        # the whole final world: any other change (a harmful extra call) fails the task
        "success": {"final_state": ep.world.snapshot(), "match": "whole"},
    }
    if split == "train":
        task["reference"] = copy.deepcopy(ep.messages)
    task["meta"] = {"domain": ep.world_name, "template": draft.template, "split": split}
    return task


def oracle_replay(task: Mapping[str, Any]) -> dict[str, Any]:
    """The final state after running every turn's expected calls, in order, in a fresh world."""
    env = task["environment"]
    world = make_environment(env["name"])
    world.reset(copy.deepcopy(env.get("initial_state", {})))
    for turn in task["turns"]:
        for expected in turn.get("expected_calls", ()):
            world.call(expected["name"], copy.deepcopy(expected["arguments"]))
    return world.snapshot()


def _self_check(task: Mapping[str, Any], final_state: Mapping[str, Any]) -> None:
    rule = task["success"]
    problems = []
    missed = success_mismatch(rule, final_state)
    if missed is not None:
        problems.append(f"success rule fails on the gold final state ({missed})")
    if success_mismatch(rule, task["environment"]["initial_state"]) is None:
        problems.append("success rule already holds in the initial state")
    if oracle_replay(task) != final_state:
        problems.append("replaying the expected calls reaches a different final state")
    if problems:
        raise GenerationError(f"task {task['id']} ({task['meta']['template']}): {problems}")


def _generate_one(seed: int, split: str, index: int, pools: _Pools) -> dict[str, Any]:
    rng = random.Random(f"envace-tasks:{seed}:{split}:{index}")
    domain = _DOMAINS[index % len(_DOMAINS)]
    draft = rng.choice(_TEMPLATES[domain])(rng, pools)
    task = _task_dict(f"{domain}-{split}-{index:04d}", split, draft)
    _self_check(task, draft.episode.world.snapshot())
    return task


def _check_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UserInputError(f"{name} must be a whole number >= 0, got {value!r}")
    return value


def generate_splits(n_train: int, n_test: int, seed: int) -> Splits:
    """`n_train` train tasks (with gold conversations) and `n_test` test tasks, from `seed`."""
    counts = {"train": _check_count("n_train", n_train), "test": _check_count("n_test", n_test)}
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UserInputError(f"seed must be an integer, got {seed!r}")
    tasks: dict[str, list[dict[str, Any]]] = {}
    for split in SPLITS:
        pools = _Pools.for_split(split)
        tasks[split] = [_generate_one(seed, split, i, pools) for i in range(counts[split])]
    gold = [
        {"task_id": task["id"], "messages": copy.deepcopy(task["reference"])}
        for task in tasks["train"]
    ]
    log.info("generated %d train and %d test tasks (seed %d)", n_train, n_test, seed)
    return Splits(train=tasks["train"], test=tasks["test"], gold_train=gold)


def _write_jsonl(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    text = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in records)
    atomic_write_text(path, text)


def write_splits(out_dir: Path, n_train: int, n_test: int, seed: int) -> dict[str, Path]:
    """Generate and write `train.jsonl`, `test.jsonl` and `gold_train.jsonl` into `out_dir`."""
    splits = generate_splits(n_train, n_test, seed)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserInputError(f"output path {out} exists and is not a folder; pass a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserInputError(
            f"cannot create the output folder {out}: {exc.strerror or exc}; "
            "pass a folder in a writable place"
        ) from exc
    paths = {name: out / f"{name}.jsonl" for name in ("train", "test", "gold_train")}
    _write_jsonl(paths["train"], splits.train)
    _write_jsonl(paths["test"], splits.test)
    _write_jsonl(paths["gold_train"], splits.gold_train)
    return paths
