"""Types shared by the policy layer: tool calls, sampling parameters, generations, backends."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

__all__ = [
    "ChatBackend",
    "Generation",
    "GenerationBackend",
    "SamplingParams",
    "ToolCall",
    "check_prompts",
]


@dataclass(frozen=True)
class ToolCall:
    """A parsed tool call: a tool name and its JSON arguments."""

    name: str
    arguments: dict[str, Any]

    def to_message_dict(self, call_id: str) -> dict[str, Any]:
        """The OpenAI chat `tool_calls` entry for this call."""
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. temperature 0 means greedy decoding."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    seed: int | None = None


FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class Generation:
    """One sampled continuation.

    token_ids: the generated ids exactly as sampled, end-of-turn token included when it was
        produced (this is what a training row trains on: no re-tokenisation).
    logprobs: log-probability of each generated id under the sampling policy, same length.
    text: token_ids decoded, special tokens removed.
    finish_reason: "stop" (end-of-turn token) or "length" (hit max_new_tokens).
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def sampled(
        cls, ids: list[int], logprobs: Sequence[float], eos_id: int, tokenizer: Any
    ) -> Generation:
        """A backend's raw sample cut after its first end-of-turn token ("stop"), else whole
        ("length"), with the logprobs of the ids kept and the text decoded."""
        finish: FinishReason = "length"
        if eos_id in ids:
            ids = ids[: ids.index(eos_id) + 1]
            finish = "stop"
        return cls(
            token_ids=ids,
            logprobs=[float(x) for x in logprobs[: len(ids)]],
            text=tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=finish,
        )


def check_prompts(prompts: Sequence[Sequence[int]]) -> bool:
    """Whether there is anything to generate; an empty prompt is a ValueError (a backend has
    no position to continue from)."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    return len(prompts) > 0


class GenerationBackend(Protocol):
    """Token-in / token-out generation: the policy's engine (transformers, vLLM).

    Backends subclass it: the optional abilities below have defaults that fit a backend
    generating with the trainer's own model object, so callers never probe for them."""

    tokenizer: Any
    eos_id: int
    generated_tokens: int  # running count of sampled tokens (throughput metrics)
    # False: the backend holds its own copy of the weights, and `load_weights` must follow
    # every update; True: it generates with the trainer's model object, updates reach it at once
    shares_trainer_weights: bool = True

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        """Continue each prompt (token ids) once. Same order as `prompts`."""
        ...

    def load_weights(self, tensors: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Load trained weights, (Hugging Face name, tensor) pairs, into the backend's copy
        (a backend sharing the trainer's weights already has them: nothing to do)."""
        return None

    def release(self) -> None:
        """Free the decoding state kept between calls (caches, graphs); the next call rebuilds."""
        return None

    def close(self) -> None:
        """Stop what serves generation (an engine, a worker process)."""
        return None

    def sampled(self, ids: list[int], logprobs: Sequence[float]) -> Generation:
        """A raw sample as a `Generation` (see `Generation.sampled`), counted."""
        gen = Generation.sampled(ids, logprobs, self.eos_id, self.tokenizer)
        self.generated_tokens += len(gen.token_ids)
        return gen


@runtime_checkable
class ChatBackend(Protocol):
    """Messages-in / text-out generation: an external simulator or a judge behind HTTP."""

    def chat(
        self,
        messages: Sequence[dict[str, Any]],
        params: SamplingParams,
        response_format: dict[str, Any] | None = None,
    ) -> str:
        """Return the assistant message's text for one chat."""
        ...
