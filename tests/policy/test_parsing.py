"""Strict parsers: exact formats, structured error codes, and no string crashes them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.policy.chat import format_assistant_response
from envace.policy.parsing import parse_execution_result, parse_tool_calls
from envace.policy.types import ToolCall


def test_single_call_roundtrips_with_the_template_format() -> None:
    call = ToolCall("transfer", {"amount": 50, "to": "ACC-2", "memo": "é"})
    parsed = parse_tool_calls(format_assistant_response("", [call]))
    assert parsed.error is None
    assert parsed.calls == [call]
    assert parsed.content == ""


def test_content_before_calls_and_several_calls() -> None:
    calls = [ToolCall("a", {"x": 1}), ToolCall("b", {})]
    parsed = parse_tool_calls(format_assistant_response("Let me check.", calls))
    assert parsed.calls == calls
    assert parsed.content == "Let me check."


def test_thinking_is_stripped_and_answer_has_no_calls() -> None:
    parsed = parse_tool_calls("<think>\nhmm\n</think>\n\nYour balance is 5.")
    assert parsed.is_answer
    assert parsed.content == "Your balance is 5."


def test_list_of_calls_in_one_block_and_parameters_alias() -> None:
    text = '<tool_call>\n[{"name": "a", "parameters": {"k": 1}}, {"name": "b", "arguments": {}}]\n</tool_call>'
    parsed = parse_tool_calls(text)
    assert parsed.calls == [ToolCall("a", {"k": 1}), ToolCall("b", {})]


def test_string_arguments_are_decoded() -> None:
    parsed = parse_tool_calls(
        '<tool_call>\n{"name": "a", "arguments": "{\\"k\\": 2}"}\n</tool_call>'
    )
    assert parsed.calls == [ToolCall("a", {"k": 2})]


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("<tool_call>{}</tool_call>", "NO_TOOL_CALL_FOUND"),
        ('<tool_call>\n{"name": "a", "arguments": {}}', "NO_TOOL_CALL_FOUND"),
        ("<tool_call>\n{not json}\n</tool_call>", "JSON_DECODE_ERROR"),
        ('<tool_call>\n{"name": "a"}\n</tool_call>', "NO_ARGUMENTS"),
        ('<tool_call>\n{"name": "", "arguments": {}}\n</tool_call>', "INVALID_TOOL_NAME"),
        ('<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>', "INVALID_TOOL_NAME"),
        ('<tool_call>\n{"name": "a", "arguments": [1]}\n</tool_call>', "NO_ARGUMENTS"),
        ('<tool_call>\n{"name": "a", "arguments": {"x": NaN}}\n</tool_call>', "JSON_DECODE_ERROR"),
        ("<tool_call>\n[1]\n</tool_call>", "JSON_DECODE_ERROR"),
    ],
)
def test_caller_errors_have_codes_and_reject_every_call(text: str, code: str) -> None:
    good = '<tool_call>\n{"name": "ok", "arguments": {}}\n</tool_call>\n'
    parsed = parse_tool_calls(good + text)
    assert parsed.error is not None
    assert parsed.error.code == code
    assert parsed.calls == []
    assert parsed.error.to_tool_content()["error_tool_call"]["code"] == code


def test_execution_result_object_and_array() -> None:
    assert parse_execution_result('<execution_result>\n{"a": 1}\n</execution_result>').result == {
        "a": 1
    }
    assert parse_execution_result("<execution_result>\n[]\n</execution_result>").result == []
    thinking = '<think>\nok\n</think>\n\n<execution_result>\n{"b": [1]}\n</execution_result>'
    assert parse_execution_result(thinking).result == {"b": [1]}


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("", "EMPTY_SIMULATOR_OUTPUT"),
        ("<think>x</think>   ", "EMPTY_SIMULATOR_OUTPUT"),
        ('{"a": 1}', "NO_EXECUTION_RESULT_TAG_FOUND"),
        ('<execution_result>{"a": 1}</execution_result>', "EXECUTION_RESULT_TAG_MALFORMED"),
        ("<execution_result>\n{bad}\n</execution_result>", "SIMULATOR_JSON_DECODE_ERROR"),
        ("<execution_result>\n{}\n</execution_result>", "INVALID_EXECUTION_RESULT_TYPE"),
        ('<execution_result>\n"text"\n</execution_result>', "INVALID_EXECUTION_RESULT_TYPE"),
        ("<execution_result>\n[Infinity]\n</execution_result>", "SIMULATOR_JSON_DECODE_ERROR"),
    ],
)
def test_simulator_errors_have_codes(text: str, code: str) -> None:
    parsed = parse_execution_result(text)
    assert parsed.result is None
    assert parsed.error is not None and parsed.error.code == code


_TAGS = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<execution_result>",
        "</execution_result>",
        "<think>",
        "</think>",
        "\n",
        "{",
        "}",
        "[",
        "]",
        '"name"',
        '"arguments"',
        ":",
        ",",
        '"',
        "\\",
        "NaN",
        "1e999",
        "null",
        "true",
    ]
)
_TEXT = st.lists(st.one_of(_TAGS, st.text(max_size=8)), max_size=40).map("".join)


@settings(max_examples=400, deadline=None)
@given(_TEXT)
def test_no_string_crashes_the_caller_parser(text: str) -> None:
    parsed = parse_tool_calls(text)
    assert parsed.error is None or parsed.calls == []
    for call in parsed.calls:
        assert isinstance(call.arguments, dict) and call.name.strip()


@settings(max_examples=400, deadline=None)
@given(_TEXT)
def test_no_string_crashes_the_simulator_parser(text: str) -> None:
    parsed = parse_execution_result(text)
    assert (parsed.result is None) != (parsed.error is None)


def test_deeply_nested_json_is_an_error_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    assert parse_execution_result(f"<execution_result>\n{deep}\n</execution_result>").error
    assert parse_tool_calls(f"<tool_call>\n{deep}\n</tool_call>").error


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ('{"name": "a", "arguments": "' + "[" * 100000 + '"}', "JSON_DECODE_ERROR"),
        ('{"name": "a", "arguments": {"x": 1e999}}', "JSON_DECODE_ERROR"),
        ('{"name": "a", "arguments": {"x": "\\ud800"}}', "JSON_DECODE_ERROR"),
        ('{"name": "a\\udfff", "arguments": {}}', "JSON_DECODE_ERROR"),
    ],
)
def test_hostile_call_json_is_a_parse_error(text: str, code: str) -> None:
    """Deep nesting, numbers that overflow to infinity and lone surrogates cannot go back into
    a conversation (or a row file): an error code, never an exception or an `inf`."""
    parsed = parse_tool_calls(f"<tool_call>\n{text}\n</tool_call>")
    assert parsed.error is not None and parsed.error.code == code, parsed


def test_hostile_result_json_is_a_parse_error() -> None:
    for inner in ('{"a": "\\ud800"}', '{"a": -1e400}'):
        parsed = parse_execution_result(f"<execution_result>\n{inner}\n</execution_result>")
        assert parsed.error is not None and parsed.error.code == "SIMULATOR_JSON_DECODE_ERROR"


def test_many_opening_tags_are_rejected() -> None:
    """A model can write thousands of opening tags; the block scan is linear (the old lazy
    regex took seconds at 8,000 and did not finish at 100,000)."""
    assert parse_tool_calls("<tool_call>\n" * 100_000).error.code == "NO_TOOL_CALL_FOUND"  # type: ignore[union-attr]
    result = parse_execution_result("\n<execution_result>\n" * 100_000)
    assert result.error is not None and result.error.code == "EXECUTION_RESULT_TAG_MALFORMED"


def test_block_scan_finds_what_the_block_regex_finds() -> None:
    """The linear scan returns the blocks of the pattern it replaced, on random tag soup."""
    import random
    import re

    from envace.policy.parsing import _EXEC_OPEN, _TOOL_CALL_OPEN, _blocks

    calls = re.compile(r"(?:^|\n)<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
    result = re.compile(r"(?:^|\n)<execution_result>\n(.*?)\n</execution_result>", re.DOTALL)
    pieces = ["<tool_call>", "</tool_call>", "\n", "x", "<execution_result>", "</execution_result>"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 14)))
        want = [(m.start(), m.group(1)) for m in calls.finditer(text)]
        assert _blocks(text, _TOOL_CALL_OPEN, "\n</tool_call>") == want, text
        first = result.search(text)
        want = [(first.start(), first.group(1))] if first else []
        assert _blocks(text, _EXEC_OPEN, "\n</execution_result>", limit=1) == want, text


def test_an_empty_call_list_is_not_an_answer() -> None:
    parsed = parse_tool_calls("<tool_call>\n[]\n</tool_call>")
    assert not parsed.is_answer
    assert parsed.error is not None and parsed.error.code == "NO_TOOL_CALL_FOUND"
