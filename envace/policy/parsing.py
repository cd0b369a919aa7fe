"""Strict parsers for the two roles' outputs. Model output is data: parsed as JSON, never evaluated.

Caller (act): free text, then zero or more blocks

    <tool_call>
    {"name": "...", "arguments": {...}}
    </tool_call>

Simulator (rehearse): exactly one block

    <execution_result>
    {...json object or array...}
    </execution_result>

Both strip a leading `<think>...</think>` first. Any violation returns a structured error code
(the reference code's codes) instead of raising: a malformed output ends the episode.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from envace.policy.types import ToolCall

__all__ = [
    "CallerParse",
    "ParseError",
    "SimulatorParse",
    "parse_execution_result",
    "parse_tool_calls",
    "strip_thinking",
]

# A block starts at the beginning of the text or right after a newline, with exact inner newlines:
# an opening line (these patterns), the inner text, then "\n</tag>" (the first one after it).
_TOOL_CALL_OPEN = re.compile(r"(?:^|\n)<tool_call>\n")
_EXEC_OPEN = re.compile(r"(?:^|\n)<execution_result>\n")
_THINK_RE = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)


@dataclass(frozen=True)
class ParseError:
    """Why an output was rejected: a stable code and a human-readable message."""

    code: str
    message: str

    def to_tool_content(self) -> dict[str, Any]:
        """The tool message that records a format failure (it ends the episode)."""
        return {"error_tool_call": {"code": self.code, "message": self.message}}


@dataclass(frozen=True)
class CallerParse:
    """A caller output: user-visible content and the calls, or an error."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    error: ParseError | None = None

    @property
    def is_answer(self) -> bool:
        """True when the caller answered the user (no calls, no error): the turn ends."""
        return self.error is None and not self.calls


@dataclass(frozen=True)
class SimulatorParse:
    """A simulator output: the rehearsed result (a JSON object or array), or an error."""

    result: dict[str, Any] | list[Any] | None
    error: ParseError | None = None


def strip_thinking(text: str) -> str:
    """Remove one leading `<think>...</think>` block (Qwen3 hybrid thinking)."""
    return _THINK_RE.sub("", text, count=1)


def _blocks(
    body: str, opening: re.Pattern[str], close: str, limit: int | None = None
) -> list[tuple[int, str]]:
    """(start, inner text) of each block, in order, as a lazy regex would find them.

    Linear in the text (a model can write thousands of opening tags): each block's end is the
    first `close` after its opening line, and once no `close` follows, no later block can end.
    """
    found: list[tuple[int, str]] = []
    pos = 0
    while limit is None or len(found) < limit:
        m = opening.search(body, pos)
        if m is None:
            break
        end = body.find(close, m.end())  # the inner text may be empty: "<tag>\n\n</tag>"
        if end == -1:
            break
        inner = body[m.end() : end]
        found.append((m.start(), inner))
        pos = end + len(close)
    return found


def _finite_json(text: str) -> Any:
    """json.loads that rejects what cannot go back into a conversation: NaN/Infinity and numbers
    that overflow to infinity (not JSON), and lone surrogates (not UTF-8)."""

    def reject(token: str) -> Any:
        raise ValueError(f"non-finite number {token}")

    def finite_float(token: str) -> float:
        value = float(token)
        if value in (float("inf"), float("-inf")):
            raise ValueError(f"number {token[:40]} overflows to infinity")
        return value

    obj = json.loads(text, parse_constant=reject, parse_float=finite_float)
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("a string holds a lone surrogate escape (not UTF-8 text)") from None
    return obj


def _call_from_obj(obj: Any) -> ToolCall | ParseError:
    if not isinstance(obj, dict):
        return ParseError("JSON_DECODE_ERROR", "a tool call must be a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return ParseError("INVALID_TOOL_NAME", "the tool call has no non-empty string 'name'")
    args = obj.get("arguments", obj.get("parameters"))
    if args is None:
        return ParseError("NO_ARGUMENTS", f"the call to {name!r} has no 'arguments'")
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = _finite_json(args)
        except (ValueError, RecursionError) as exc:
            return ParseError("JSON_DECODE_ERROR", f"arguments of {name!r}: {exc}")
    if not isinstance(args, dict):
        return ParseError("NO_ARGUMENTS", f"the arguments of {name!r} are not a JSON object")
    return ToolCall(name=name, arguments=args)


def _calls_from_block(block: str) -> list[ToolCall] | ParseError:
    try:
        obj = _finite_json(block)
    except (ValueError, RecursionError) as exc:
        return ParseError("JSON_DECODE_ERROR", f"tool call is not valid JSON: {exc}")
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        return ParseError("NO_TOOL_CALL_FOUND", "the tool call block holds an empty list")
    calls: list[ToolCall] = []
    for item in items:
        call = _call_from_obj(item)
        if isinstance(call, ParseError):
            return call
        calls.append(call)
    return calls


def parse_tool_calls(text: str) -> CallerParse:
    """Parse a caller output. Any malformed block rejects every call of the message."""
    body = strip_thinking(text)
    if "<tool_call>" not in body:
        return CallerParse(content=body.strip())
    matches = _blocks(body, _TOOL_CALL_OPEN, "\n</tool_call>")
    if not matches or body.count("<tool_call>") != len(matches):
        return CallerParse(
            content=body.strip(),
            error=ParseError(
                "NO_TOOL_CALL_FOUND",
                "found <tool_call> but no well-formed '<tool_call>\\n{...}\\n</tool_call>' block",
            ),
        )
    calls: list[ToolCall] = []
    for _start, inner in matches:
        parsed = _calls_from_block(inner)
        if isinstance(parsed, ParseError):
            return CallerParse(content=body.strip(), error=parsed)
        calls.extend(parsed)
    content = body[: matches[0][0]].strip()
    return CallerParse(content=content, calls=calls)


def parse_execution_result(text: str) -> SimulatorParse:
    """Parse a simulator output into a JSON object (non-empty) or array."""
    body = strip_thinking(text)
    if not body.strip():
        return SimulatorParse(None, ParseError("EMPTY_SIMULATOR_OUTPUT", "the output is empty"))
    if "<execution_result>" not in body:
        return SimulatorParse(
            None, ParseError("NO_EXECUTION_RESULT_TAG_FOUND", "no <execution_result> tag")
        )
    blocks = _blocks(body, _EXEC_OPEN, "\n</execution_result>", limit=1)
    if not blocks:
        return SimulatorParse(
            None,
            ParseError(
                "EXECUTION_RESULT_TAG_MALFORMED",
                "expected '<execution_result>\\n{...}\\n</execution_result>'",
            ),
        )
    try:
        result = _finite_json(blocks[0][1])
    except (ValueError, RecursionError) as exc:
        return SimulatorParse(None, ParseError("SIMULATOR_JSON_DECODE_ERROR", str(exc)))
    if isinstance(result, dict) and result:
        return SimulatorParse(result)
    if isinstance(result, list):
        return SimulatorParse(result)
    return SimulatorParse(
        None,
        ParseError(
            "INVALID_EXECUTION_RESULT_TYPE", "the result must be a non-empty object or an array"
        ),
    )
