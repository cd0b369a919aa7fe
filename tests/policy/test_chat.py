"""Chat rendering: the Qwen3 tool format, incremental token ids, and generation prompts."""

from __future__ import annotations

import json
from typing import Any

from envace.policy.chat import ChatRenderer, format_assistant_response, tool_message_content
from envace.policy.types import ToolCall

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_balance",
            "description": "Balance of an account.",
            "parameters": {
                "type": "object",
                "properties": {"account_id": {"type": "string"}},
                "required": ["account_id"],
            },
        },
    }
]


def test_tools_are_in_a_tools_block_of_the_system_message(tiny_tokenizer: Any) -> None:
    r = ChatRenderer(tiny_tokenizer)
    text = r.render_text(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], TOOLS, True
    )
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(TOOLS[0], ensure_ascii=False) + "\n</tools>" in text
    assert text.endswith(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_assistant_calls_render_exactly_like_format_assistant_response(tiny_tokenizer: Any) -> None:
    r = ChatRenderer(tiny_tokenizer)
    call = ToolCall("get_balance", {"account_id": "ACC-1", "note": "ünï"})
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [call.to_message_dict("c0")]},
        {"role": "tool", "name": "get_balance", "content": tool_message_content({"balance": 5})},
        {"role": "user", "content": "thanks"},
    ]
    text = r.render_text(msgs, TOOLS)
    expected = (
        "<|im_start|>assistant\n" + format_assistant_response("Checking.", [call]) + "<|im_end|>\n"
    )
    assert expected in text
    assert '<|im_start|>user\n<tool_response>\n{"balance":5}\n</tool_response><|im_end|>\n' in text


def test_incremental_ids_equal_a_full_render(tiny_tokenizer: Any) -> None:
    """Appending generated ids + deltas gives the same ids as rendering the whole chat."""
    r = ChatRenderer(tiny_tokenizer)
    first = [{"role": "user", "content": "hi"}]
    ids = r.prompt_ids(first, TOOLS)
    response = r.encode(
        format_assistant_response("", [ToolCall("get_balance", {"account_id": "A"})])
    )
    response.append(r.eos_id)
    ids += response + r.close_response(response)
    tool = {"role": "tool", "name": "get_balance", "content": '{"balance":5}'}
    ids += r.delta_ids([tool]) + r.generation_prompt_ids
    full = r.render_text(first, TOOLS, True) + r.decode(response) + "<|im_end|>\n"
    full += '<|im_start|>user\n<tool_response>\n{"balance":5}\n</tool_response><|im_end|>\n'
    full += "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert r.tokenizer.decode(ids) == full


def test_close_response_adds_eos_only_when_cut(tiny_tokenizer: Any) -> None:
    r = ChatRenderer(tiny_tokenizer)
    assert r.close_response([5, r.eos_id]) == r.encode("\n")
    assert r.close_response([5, 6]) == [r.eos_id, *r.encode("\n")]


def test_thinking_switch_changes_the_generation_prompt(tiny_tokenizer: Any) -> None:
    on = ChatRenderer(tiny_tokenizer, enable_thinking=True)
    off = ChatRenderer(tiny_tokenizer, enable_thinking=False)
    assert on.decode(on.generation_prompt_ids) == "assistant\n"
    assert (
        off.tokenizer.decode(off.generation_prompt_ids)
        == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
