"""Rule grader: canonical argument comparison, ordered / unordered matching, turn score."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envace.policy.types import ToolCall
from envace.reward.rules import (
    canonical,
    fact_in_answer,
    match_expected_calls,
    turn_answers,
    turn_score_rules,
)
from envace.tasks.model import ExpectedCall, Turn


def exp(name: str, **arguments: object) -> ExpectedCall:
    return ExpectedCall(name, dict(arguments))


def call(name: str, **arguments: object) -> ToolCall:
    return ToolCall(name, dict(arguments))


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (50, 50.0, True),
        ({"x": 1, "y": [1, 2.0]}, {"y": [1.0, 2], "x": 1.0}, True),
        (0.1, 0.1000001, False),
        (True, 1, False),
        (False, 0, False),
        (None, 0, False),
        ("50", 50, False),
        ("Paris", "paris", False),
        ("a ", "a", False),
        ([1, 2], [2, 1], False),
        ({"a": 1}, {"a": 1, "b": None}, False),
        (2**60 + 1, float(2**60), False),  # exact, not float-rounded
    ],
)
def test_canonical_equality(a: object, b: object, equal: bool) -> None:
    assert (canonical(a) == canonical(b)) is equal


def test_canonical_rejects_non_json() -> None:
    with pytest.raises(TypeError, match="not a JSON value"):
        canonical({"when": object()})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=10,
)


@given(json_values)
def test_canonical_is_hashable_and_reflexive(value: object) -> None:
    assert hash(canonical(value)) == hash(canonical(value))
    assert canonical(value) == canonical(value)


def test_unordered_multiset_matching() -> None:
    expected = [exp("transfer", amount=50), exp("transfer", amount=50), exp("balance", acct="A")]
    issued = [
        call("balance", acct="A"),
        call("transfer", amount=50.0),
        call("lookup", q="x"),
    ]
    match = match_expected_calls(expected, issued, ordered=False)
    assert match.matched == 2
    assert match.missing == (exp("transfer", amount=50),)  # expected twice, issued once
    assert match.unexpected == (call("lookup", q="x"),)


def test_unordered_ignores_order_and_argument_key_order() -> None:
    expected = [exp("a", x=1, y="s"), exp("b")]
    issued = [call("b"), ToolCall("a", {"y": "s", "x": 1.0})]
    match = match_expected_calls(expected, issued, ordered=False)
    assert (match.matched, match.missing, match.unexpected) == (2, (), ())


def test_wrong_argument_or_name_does_not_match() -> None:
    expected = [exp("get_weather", city="Paris")]
    for issued in ([call("get_weather", city="paris")], [call("get_forecast", city="Paris")]):
        match = match_expected_calls(expected, issued, ordered=False)
        assert match.matched == 0
        assert match.missing == tuple(expected)
        assert match.unexpected == tuple(issued)


def test_ordered_subsequence_with_calls_in_between() -> None:
    expected = [exp("login"), exp("pay", amount=5), exp("logout")]
    issued = [call("login"), call("balance"), call("pay", amount=5.0), call("logout")]
    match = match_expected_calls(expected, issued, ordered=True)
    assert (match.matched, match.missing) == (3, ())
    assert match.unexpected == (call("balance"),)


def test_ordered_wrong_order_counts_the_longest_in_order_part() -> None:
    expected = [exp("a"), exp("b"), exp("c")]
    issued = [call("c"), call("a"), call("b")]
    match = match_expected_calls(expected, issued, ordered=True)
    assert match.matched == 2
    assert match.missing == (exp("c"),)
    assert match.unexpected == (call("c"),)
    # the same calls unordered are a full match
    assert match_expected_calls(expected, issued, ordered=False).matched == 3


def test_ordered_missing_first_call_keeps_later_ones() -> None:
    expected = [exp("a"), exp("b"), exp("c")]
    match = match_expected_calls(expected, [call("b"), call("c")], ordered=True)
    assert match.matched == 2
    assert match.missing == (exp("a"),)


READS = frozenset({"read", "a"})  # the world's read-only tools in these tests


def test_turn_score_counts_expected_calls_once_and_costs_extra_writes() -> None:
    turn = Turn(user="u", expected_calls=(exp("a", n=1), exp("b")))
    assert turn_score_rules(turn, [call("a", n=1), call("b")], read_only=READS) == 1.0
    # a first look-up with a read-only tool is free
    assert turn_score_rules(turn, [call("a", n=1), call("b"), call("read")], read_only=READS) == 1.0
    # its repeat costs half a unit (of 2)
    repeated = [call("a", n=1), call("b"), call("read"), call("read")]
    assert turn_score_rules(turn, repeated, read_only=READS) == 0.75
    # an expected call issued twice counts once; a repeated write costs a whole unit
    assert turn_score_rules(turn, [call("a", n=1), call("b"), call("b")], read_only=READS) == 0.5
    assert turn_score_rules(turn, [call("a", n=2), call("b")], read_only=READS) == 0.5
    assert turn_score_rules(turn, [], read_only=READS) == 0.0
    # in an unknown world every unexpected call may change something
    assert turn_score_rules(turn, [call("a", n=1), call("b"), call("read")]) == 0.5


def test_spraying_and_repeating_do_not_pay() -> None:
    transfer = Turn(user="u", expected_calls=(exp("transfer", amount=50),))
    sprayed = [call("transfer", amount=a) for a in (10, 20, 50, 80, 100)]
    assert turn_score_rules(transfer, sprayed, read_only=READS) == 0.0
    every_call_twice = [call("transfer", amount=50), call("transfer", amount=50)]
    assert turn_score_rules(transfer, every_call_twice, read_only=READS) == 0.0
    two = Turn(user="u", expected_calls=(exp("a"), exp("w")))
    twice = [call("a"), call("a"), call("w"), call("w")]
    assert turn_score_rules(two, twice, read_only=READS) == pytest.approx((2 - 0.5 - 1) / 2)


def test_turn_score_ordered_turn_uses_order() -> None:
    turn = Turn(user="u", expected_calls=(exp("a"), exp("b")), ordered=True)
    # one call matches in order; the other, out of place, is an unrequested write
    assert turn_score_rules(turn, [call("b"), call("a")], read_only=READS) == 0.5
    assert turn_score_rules(turn, [call("a"), call("b")], read_only=READS) == 1.0


def test_answer_facts_are_units_of_the_same_scale() -> None:
    turn = Turn(user="balance?", expected_calls=(exp("a"),), answer_facts=("450", "ACC-81f2"))
    told = "Your savings ACC-81f2 holds 450 dollars."
    assert turn_score_rules(turn, [call("a")], told, READS) == 1.0
    assert turn_score_rules(turn, [call("a")], "It holds 450.", READS) == pytest.approx(2 / 3)
    assert turn_score_rules(turn, [call("a")], "Done.", READS) == pytest.approx(1 / 3)
    assert turn_score_rules(turn, [], "", READS) == 0.0
    # a fact is a whole token: 1450 and 450.5 do not state 450
    assert not fact_in_answer("450", "you have 1450 dollars")
    assert not fact_in_answer("450", "you have 450.5 dollars")
    assert fact_in_answer("450", "you have 450.")
    assert fact_in_answer("a b", "(a b)") and not fact_in_answer("", "anything")


def test_turn_answers_are_the_last_plain_assistant_message_of_each_turn() -> None:
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "1"},
        {"role": "assistant", "content": "", "tool_calls": [{}]},
        {"role": "tool", "content": "{}"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "2"},
        {"role": "assistant", "content": "", "tool_calls": [{}]},
    ]
    assert turn_answers(msgs) == ["first", ""]


def test_turn_without_expected_calls_wants_a_direct_answer() -> None:
    turn = Turn(user="just say hi")
    assert turn_score_rules(turn, []) == 1.0
    assert turn_score_rules(turn, [call("anything")]) == 0.0
