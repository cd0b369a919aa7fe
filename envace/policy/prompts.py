"""The rehearse (simulator) prompt.

The same policy that acts is prompted as the environment: it sees the tool whitelist, optional
grounding examples (real calls and results logged for this task), the conversation, the caller's
raw message and the call to simulate, and must answer with an `<execution_result>` block.

Unlike the reference code (which truncates the whole prompt from the left and can cut its own
instructions), truncation here drops the OLDEST history entries first, then the oldest grounding
examples; the instructions, the caller's message and the current call are never cut.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from envace.policy.types import ToolCall

__all__ = [
    "SIMULATOR_SYSTEM",
    "GroundingExample",
    "RehearsalPrompt",
    "build_rehearse_messages",
    "compact_tools",
    "grounding_from_reference",
    "serialize_history",
]

SIMULATOR_SYSTEM = """You are a precise tool simulator. You play the environment: first validate \
the agent's tool call, then produce the result the real tool would return.
Check, in order:
1. The call is well-formed.
2. The tool is in the whitelist; else return {"error": {"code": "UNKNOWN_TOOL", ...}}.
3. The arguments satisfy the tool's parameter schema (required fields, types, enums); else return \
{"error": {"code": "INVALID_ARGUMENTS", ...}}.
4. The call is allowed in the current state (e.g. authentication or a prior lookup the tool \
needs); else return the error the tool would give.
Otherwise return the result. If a grounding example has the same tool and arguments, return its \
result; otherwise return a result consistent with the examples, the conversation and the schema.
Answer with exactly one block and nothing else:
<execution_result>
{JSON object or array}
</execution_result>"""

Whitelist = Literal["schemas", "names"]


@dataclass(frozen=True)
class GroundingExample:
    """A real call and its real result, logged for this task (few-shot for the simulator)."""

    name: str
    arguments: dict[str, Any]
    result: str


@dataclass(frozen=True)
class RehearsalPrompt:
    """The simulator chat plus what truncation removed (for metrics)."""

    messages: list[dict[str, Any]]
    dropped_history: int
    dropped_grounding: int
    fits: bool


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _call_name_args(call: dict[str, Any]) -> tuple[str, Any]:
    fn = call.get("function", call)
    args = fn.get("arguments", {})
    if isinstance(args, str):
        with contextlib.suppress(ValueError):
            args = json.loads(args)
    return str(fn.get("name", "")), args


# What a compact parameter schema keeps: enough to write a right call (names, types, enums,
# what is required, the descriptions), not the validation limits the real tools enforce anyway.
_COMPACT_KEYS = ("type", "description", "enum", "items", "properties", "required")


def _compact_schema(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key in _COMPACT_KEYS:
        if key not in schema:
            continue
        value = schema[key]
        if key == "properties" and isinstance(value, dict):
            value = {name: _compact_schema(sub) for name, sub in value.items()}
        elif key == "items":
            value = _compact_schema(value)
        out[key] = value
    return out


def compact_tools(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool specs with parameter schemas cut to names, types, enums, required fields and
    descriptions (no patterns, length or range limits, additionalProperties): about a fifth
    fewer prompt tokens. The caller and the simulator see the same compact text in training
    and evaluation; the real worlds still validate every call against the full schema."""
    out = []
    for tool in tools:
        fn = dict(tool.get("function", tool))
        if "parameters" in fn:
            fn["parameters"] = _compact_schema(fn["parameters"])
        out.append({**tool, "function": fn} if "function" in tool else fn)
    return out


def grounding_from_reference(reference: Sequence[dict[str, Any]]) -> list[GroundingExample]:
    """Pair every assistant tool call of a logged conversation with the tool result after it."""
    examples: list[GroundingExample] = []
    pending: list[tuple[str, Any]] = []
    for msg in reference:
        role = msg.get("role")
        if role == "assistant":
            pending = [_call_name_args(c) for c in msg.get("tool_calls") or []]
        elif role == "tool" and pending:
            name, args = pending.pop(0)
            content = msg.get("content", "")
            text = content if isinstance(content, str) else _dump(content)
            examples.append(GroundingExample(name, args if isinstance(args, dict) else {}, text))
    return examples


def serialize_history(messages: Sequence[dict[str, Any]]) -> list[str]:
    """One line per message: `User: ...`, `Assistant: ...`, `Tool[name]: ...` (no system)."""
    lines: list[str] = []
    for msg in messages:
        role = msg.get("role")
        content = msg.get("content") or ""
        if role == "user":
            lines.append(f"User: {content}")
        elif role == "assistant":
            calls = [
                _dump({"name": n, "arguments": a})
                for n, a in (_call_name_args(c) for c in msg.get("tool_calls") or [])
            ]
            lines.append("Assistant: " + " ".join([content, *calls]).strip())
        elif role == "tool":
            lines.append(f"Tool[{msg.get('name', '')}]: {content}")
    return lines


def _user_prompt(
    whitelist: str,
    grounding: Sequence[GroundingExample],
    history: Sequence[str],
    dropped: int,
    caller_raw: str,
    call: ToolCall,
    schema: dict[str, Any] | None,
    siblings: Sequence[tuple[ToolCall, str]],
) -> str:
    sections = [f"Candidate tools (whitelist):\n{whitelist}"]
    if grounding:
        shots = "\n".join(
            f"Tool name: {g.name}\nTool arguments: {_dump(g.arguments)}\n"
            f"Tool execution result: {g.result}"
            for g in grounding
        )
        sections.append(f"Previous tool calls and results (grounding):\n{shots}")
    hist = list(history)
    if dropped:
        hist.insert(0, f"[{dropped} earlier messages omitted]")
    sections.append("Current conversation history:\n" + ("\n".join(hist) if hist else "(empty)"))
    sections.append(f"Agent's latest response:\n{caller_raw}")
    if siblings:  # fixes the reference: earlier calls of the same message are visible
        done = "\n".join(
            f"{_dump({'name': c.name, 'arguments': c.arguments})} -> {r}" for c, r in siblings
        )
        sections.append(f"Results of earlier calls in this response:\n{done}")
    sections.append(
        "Current tool to simulate:\n"
        f"Tool name: {call.name}\n"
        f"Tool schema: {_dump(schema) if schema is not None else '(not in the whitelist)'}\n"
        f"Tool arguments: {_dump(call.arguments)}"
    )
    return "\n\n".join(sections)


def build_rehearse_messages(
    *,
    tools: Sequence[dict[str, Any]],
    grounding: Sequence[GroundingExample],
    history: Sequence[dict[str, Any]],
    caller_raw: str,
    call: ToolCall,
    siblings: Sequence[tuple[ToolCall, str]] = (),
    count_tokens: Callable[[list[dict[str, Any]]], int] | None = None,
    max_tokens: int | None = None,
    whitelist: Whitelist = "schemas",
    think_switch: str = "",
) -> RehearsalPrompt:
    """Build the simulator chat, fitting `max_tokens` (as measured by `count_tokens`).

    history: the conversation BEFORE the caller's latest message (system messages are skipped).
    siblings: earlier calls of the same caller message with their (rehearsed or real) results.
    think_switch: appended to the user prompt (e.g. "/think" for Qwen3 hybrid thinking).
    """
    fns = [t["function"] for t in tools]
    wl = _dump(fns) if whitelist == "schemas" else _dump([f["name"] for f in fns])
    schema = next((f for f in fns if f["name"] == call.name), None)
    lines = serialize_history(history)
    shots = list(grounding)
    dropped_h = dropped_g = 0

    def build() -> list[dict[str, Any]]:
        user = _user_prompt(
            wl, shots, lines[dropped_h:], dropped_h, caller_raw, call, schema, siblings
        )
        if think_switch:
            user = f"{user}\n\n{think_switch}"
        return [{"role": "system", "content": SIMULATOR_SYSTEM}, {"role": "user", "content": user}]

    messages = build()
    if count_tokens is None or max_tokens is None:
        return RehearsalPrompt(messages, 0, 0, True)
    while count_tokens(messages) > max_tokens:
        if dropped_h < len(lines):
            dropped_h += 1
        elif shots:
            shots.pop(0)
            dropped_g += 1
        else:
            return RehearsalPrompt(messages, dropped_h, dropped_g, False)
        messages = build()
    return RehearsalPrompt(messages, dropped_h, dropped_g, True)
