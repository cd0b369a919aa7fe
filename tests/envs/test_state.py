"""Success-rule matching and opaque ids (envace.envs.state)."""

from __future__ import annotations

import pytest

from envace.envs.state import (
    ID_SPACE,
    MAX_ID_DRAWS,
    final_state_matches,
    first_mismatch,
    id_room_problem,
    next_opaque_id,
)
from envace.errors import UserInputError

STATE = {
    "accounts": {"ACC-1": {"owner": "Al", "balance": 450}, "ACC-2": {"balance": 0}},
    "dirs": {"/docs": ["a.txt", "b.txt"]},
    "session": {"customer": None},
    "flag": True,
}


@pytest.mark.parametrize(
    "subset",
    [
        {},
        {"accounts": {}},
        {"accounts": {"ACC-1": {"balance": 450}}},
        {"accounts": {"ACC-1": {"balance": 450.0}}},  # JSON numbers: 450 == 450.0
        {"dirs": {"/docs": ["a.txt", "b.txt"]}},
        {"session": {"customer": None}},
        {"flag": True, "accounts": {"ACC-2": {"balance": 0}}},
    ],
)
def test_subsets_match(subset: dict[str, object]) -> None:
    assert final_state_matches(subset, STATE)
    assert first_mismatch(subset, STATE) is None


@pytest.mark.parametrize(
    ("subset", "where"),
    [
        ({"accounts": {"ACC-1": {"balance": 500}}}, "$.accounts.ACC-1.balance: expected 500"),
        ({"accounts": {"ACC-9": {}}}, "$.accounts.ACC-9: missing"),
        ({"dirs": {"/docs": ["a.txt"]}}, "$.dirs./docs: expected ['a.txt']"),  # lists are whole
        ({"dirs": {"/docs": ["b.txt", "a.txt"]}}, "$.dirs./docs"),  # and ordered
        ({"flag": 1}, "$.flag: expected 1, got True"),  # true is not 1
        ({"accounts": {"ACC-2": {"balance": False}}}, "$.accounts.ACC-2.balance"),
        ({"session": "x"}, "$.session: expected 'x'"),
        ({"flag": {"a": 1}}, "$.flag: expected an object, got True"),
        ({"session": {"customer": "Al"}}, "$.session.customer: expected 'Al', got None"),
    ],
)
def test_mismatches_name_the_path(subset: dict[str, object], where: str) -> None:
    assert not final_state_matches(subset, STATE)
    found = first_mismatch(subset, STATE)
    assert found is not None and found.startswith(where)


def test_nested_dicts_inside_lists_compare_exactly() -> None:
    state = {"log": [{"a": 1, "b": 2}]}
    assert final_state_matches({"log": [{"a": 1, "b": 2}]}, state)
    assert not final_state_matches({"log": [{"a": 1}]}, state)  # no subset inside lists
    assert not final_state_matches({"log": [{"a": True, "b": 2}]}, state)


def test_opaque_ids_are_deterministic_and_advance_the_counter() -> None:
    first = {"salt": "s1", "next": 0}
    again = {"salt": "s1", "next": 0}
    ids = [next_opaque_id(first, "TX", set()) for _ in range(5)]
    assert ids == [next_opaque_id(again, "TX", set()) for _ in range(5)]
    assert first["next"] == 5
    assert all(len(i) == len("TX-7f3a") and i.startswith("TX-") for i in ids)
    assert len(set(ids)) == 5
    other_salt = [next_opaque_id({"salt": "s2", "next": 0}, "TX", set()) for _ in range(1)]
    assert other_salt[0] != ids[0]


def test_opaque_ids_skip_taken_ids() -> None:
    taken = {next_opaque_id({"salt": "s", "next": 0}, "ORD", set())}
    ids = {"salt": "s", "next": 0}
    fresh = next_opaque_id(ids, "ORD", taken)
    assert fresh not in taken
    assert ids["next"] == 2


def test_an_id_search_is_bounded_when_every_id_is_taken() -> None:
    """Issue #20: a state whose id space is exhausted used to loop forever."""
    ids = {"salt": "s", "next": 0}
    everything = {f"TX-{n:04x}" for n in range(ID_SPACE)}
    with pytest.raises(UserInputError, match=f"no free TX id after {MAX_ID_DRAWS} draws"):
        next_opaque_id(ids, "TX", everything)
    assert ids["next"] == MAX_ID_DRAWS


def test_id_room_allows_half_the_id_space() -> None:
    assert id_room_problem("orders", range(ID_SPACE // 2)) is None
    assert id_room_problem("orders", range(ID_SPACE // 2 + 1)) == (
        f"orders: {ID_SPACE // 2 + 1} entries leave no room for new ids (at most {ID_SPACE // 2})"
    )
