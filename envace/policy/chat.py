"""Chat rendering through the tokenizer's chat template, kept token-in / token-out.

The caller's context is built incrementally as token ids: the first prompt is rendered by the
chat template; afterwards each generated response is appended as the exact ids that were sampled
(no decode -> re-encode round trip, so no multi-turn token drift) and each new user / tool message
is appended as the ids of its rendered delta. The delta of a message is obtained by rendering it
after a fixed two-message base and slicing the base off (the reference code's trick), so any chat
template — our tiny tokenizer's or a real Qwen3 checkpoint's — works unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from envace.policy.types import ToolCall

__all__ = ["ChatRenderer", "format_assistant_response", "tool_message_content"]

_BASE: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "I am a user."},
]


def format_assistant_response(content: str, calls: Sequence[ToolCall]) -> str:
    """The assistant text a Qwen3-format template renders for `content` + `calls`.

    This is also exactly what the caller is trained to generate (warm start), so a generated
    response and a rendered gold message are the same string.
    """
    parts = [content] if content else []
    for call in calls:
        args = json.dumps(call.arguments, ensure_ascii=False)
        parts.append(f'<tool_call>\n{{"name": "{call.name}", "arguments": {args}}}\n</tool_call>')
    return "\n".join(parts)


def tool_message_content(result: Any) -> str:
    """Serialise a tool result (real or rehearsed) for a tool message, compactly."""
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"))


class ChatRenderer:
    """Renders chats to token ids with a Hugging Face tokenizer's chat template.

    enable_thinking: passed to the template (Qwen3 hybrid thinking). With False the generation
        prompt carries an empty think block and the model answers directly.
    """

    def __init__(self, tokenizer: Any, enable_thinking: bool = False) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(
                "the tokenizer has no chat_template; use a chat model's tokenizer or the "
                "default tokenizer built by `envace.policy.tiny`"
            )
        self.tokenizer = tokenizer
        self.enable_thinking = enable_thinking
        self.eos_id: int = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        pad = tokenizer.pad_token_id
        self.pad_id: int = int(pad) if pad is not None else self.eos_id
        base = self.render_text(_BASE)
        self._base_len = len(base)
        self._gen_prompt_ids = self.encode(
            self.render_text(_BASE, add_generation_prompt=True)[self._base_len :]
        )
        self._newline_ids = self.encode("\n")

    def render_text(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        text: str = self.tokenizer.apply_chat_template(
            list(messages),
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            enable_thinking=self.enable_thinking,
        )
        return text

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False)
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return text

    def prompt_ids(
        self, messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None = None
    ) -> list[int]:
        """A full prompt ending with the assistant generation prompt."""
        return self.encode(self.render_text(messages, tools, add_generation_prompt=True))

    def delta_ids(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Ids of user / tool `messages` appended to an ongoing chat (no generation prompt)."""
        text = self.render_text([*_BASE, *messages])
        return self.encode(text[self._base_len :])

    @property
    def generation_prompt_ids(self) -> list[int]:
        return list(self._gen_prompt_ids)

    def close_response(self, response_ids: Sequence[int]) -> list[int]:
        """Ids to append after a generated response so the chat continues well-formed.

        A response that stopped on <|im_end|> needs only the template's newline; one cut by the
        length limit also needs the end-of-turn token.
        """
        if response_ids and response_ids[-1] == self.eos_id:
            return list(self._newline_ids)
        return [self.eos_id, *self._newline_ids]
