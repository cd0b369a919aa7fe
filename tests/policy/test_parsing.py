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
