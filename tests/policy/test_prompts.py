"""The rehearse prompt: sections, grounding, sibling results, and truncation that never cuts
the instructions."""

from __future__ import annotations

from typing import Any

from envace.policy.prompts import (
    SIMULATOR_SYSTEM,
    build_rehearse_messages,
    grounding_from_reference,
    serialize_history,
)
from envace.policy.types import ToolCall

TOOLS = [
    {"type": "function", "function": {"name": "find_item", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "get_stock", "parameters": {"type": "object"}}},
]
REFERENCE = [
    {"role": "user", "content": "How many blue widgets?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "1",
                "type": "function",
                "function": {"name": "find_item", "arguments": '{"name": "blue widget"}'},
            }
        ],
    },
    {"role": "tool", "content": '{"sku":"SKU-9"}'},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_stock", "arguments": {"sku": "SKU-9"}}}],
    },
    {"role": "tool", "content": '{"stock":4}'},
]


def _history(n: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"message number {i} " + "word " * 20} for i in range(n)]


def test_grounding_pairs_each_call_with_its_result() -> None:
    shots = grounding_from_reference(REFERENCE)
    assert [(g.name, g.arguments, g.result) for g in shots] == [
        ("find_item", {"name": "blue widget"}, '{"sku":"SKU-9"}'),
        ("get_stock", {"sku": "SKU-9"}, '{"stock":4}'),
    ]


def test_sections_and_current_call() -> None:
    p = build_rehearse_messages(
        tools=TOOLS,
        grounding=grounding_from_reference(REFERENCE),
        history=REFERENCE[:1],
        caller_raw="<tool_call>...",
        call=ToolCall("get_stock", {"sku": "SKU-1"}),
        siblings=[(ToolCall("find_item", {"name": "x"}), '{"sku":"SKU-1"}')],
        whitelist="names",
    )
    system, user = p.messages
    assert system == {"role": "system", "content": SIMULATOR_SYSTEM}
    text = user["content"]
    assert text.startswith('Candidate tools (whitelist):\n["find_item","get_stock"]')
    assert 'Tool name: find_item\nTool arguments: {"name":"blue widget"}' in text
    assert "User: How many blue widgets?" in text
    assert (
        'Results of earlier calls in this response:\n{"name":"find_item","arguments":{"name":"x"}} -> {"sku":"SKU-1"}'
        in text
    )
    assert text.endswith(
        'Tool name: get_stock\nTool schema: {"name":"get_stock","parameters":{"type":"object"}}\nTool arguments: {"sku":"SKU-1"}'
    )


def test_truncation_drops_oldest_history_first_and_keeps_instructions() -> None:
    def count(messages: list[dict[str, Any]]) -> int:
        return sum(len(m["content"].split()) for m in messages)

    full = build_rehearse_messages(
        tools=TOOLS,
        grounding=[],
        history=_history(10),
        caller_raw="raw",
        call=ToolCall("get_stock", {}),
    )
    budget = count(full.messages) - 50
    p = build_rehearse_messages(
        tools=TOOLS,
        grounding=grounding_from_reference(REFERENCE),
        history=_history(10),
        caller_raw="raw",
        call=ToolCall("get_stock", {}),
        count_tokens=count,
        max_tokens=budget,
    )
    assert p.fits and count(p.messages) <= budget
    assert p.messages[0]["content"] == SIMULATOR_SYSTEM
    text = p.messages[1]["content"]
    assert p.dropped_history >= 1 and p.dropped_grounding == 0
    assert f"[{p.dropped_history} earlier messages omitted]" in text
    assert "message number 0 " not in text and "message number 9 " in text
    assert "Tool name: get_stock" in text


def test_when_nothing_else_fits_grounding_goes_then_it_reports_no_fit() -> None:
    def count(messages: list[dict[str, Any]]) -> int:
        return sum(len(m["content"]) for m in messages)

    args = dict(
        tools=TOOLS,
        grounding=grounding_from_reference(REFERENCE),
        history=_history(3),
        caller_raw="raw",
        call=ToolCall("get_stock", {}),
        count_tokens=count,
    )
    bare = build_rehearse_messages(**{**args, "grounding": [], "history": []})  # type: ignore[arg-type]
    p = build_rehearse_messages(**args, max_tokens=count(bare.messages) + 40)  # type: ignore[arg-type]
    assert p.fits and p.dropped_history == 3 and p.dropped_grounding == 2
    too_small = build_rehearse_messages(**args, max_tokens=10)  # type: ignore[arg-type]
    assert not too_small.fits
    assert too_small.messages[0]["content"] == SIMULATOR_SYSTEM


def test_serialize_history_skips_system_and_inlines_calls() -> None:
    lines = serialize_history([{"role": "system", "content": "s"}, *REFERENCE[:3]])
    assert lines == [
        "User: How many blue widgets?",
        'Assistant: {"name":"find_item","arguments":{"name":"blue widget"}}',
        'Tool[]: {"sku":"SKU-9"}',
    ]
