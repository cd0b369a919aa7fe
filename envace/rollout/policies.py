"""Who writes a generation: the trained model, a frozen or remote model, or a scripted policy.

Every policy answers `GenRequest`s. Model policies use the rendered `prompt_ids`; scripted
policies (oracle, random) read the structured episode instead. The same interface serves the
caller role and the simulator role.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from envace.policy.chat import ChatRenderer, format_assistant_response
from envace.policy.types import (
    ChatBackend,
    Generation,
    GenerationBackend,
    SamplingParams,
    ToolCall,
)
from envace.rollout.types import Role

if TYPE_CHECKING:
    from envace.rollout.engine import Episode

__all__ = [
    "ChatPolicy",
    "GenRequest",
    "ModelPolicy",
    "OraclePolicy",
    "Policy",
    "RandomPolicy",
]


@dataclass
class GenRequest:
    """One generation an episode needs. `prompt_ids` is empty for policies without a renderer."""

    role: Role
    prompt_ids: list[int]
    messages: list[dict[str, Any]]
    episode: Episode


class Policy(Protocol):
    """Writes generations. `renderer` is None for policies that do not read token ids.

    Policies subclass it: the optional abilities below have defaults that fit a policy keeping
    nothing between calls, so callers never probe for them."""

    renderer: ChatRenderer | None
    trainable: bool
    # False: its simulator role executes calls in a copy of the real world (the oracle), so
    # it cannot rehearse privately at test time
    rehearses_privately: bool = True

    def generate(
        self, requests: Sequence[GenRequest], params: SamplingParams
    ) -> list[Generation]: ...

    def release(self) -> None:
        """Free the decoding state kept between calls (the update needs the memory)."""
        return None

    def close(self) -> None:
        """Stop what serves generation (an engine, a worker process)."""
        return None


def _text_generation(text: str, renderer: ChatRenderer | None) -> Generation:
    """A scripted generation; tokenised with the renderer when there is one."""
    ids: list[int] = []
    if renderer is not None:
        ids = [*renderer.encode(text), renderer.eos_id]
    return Generation(token_ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason="stop")


class ModelPolicy(Policy):
    """A language model behind a token-level backend (transformers now, vLLM later)."""

    def __init__(
        self, backend: GenerationBackend, renderer: ChatRenderer, trainable: bool = True
    ) -> None:
        self.backend = backend
        self.renderer: ChatRenderer | None = renderer
        self.trainable = trainable

    def generate(self, requests: Sequence[GenRequest], params: SamplingParams) -> list[Generation]:
        return self.backend.generate([r.prompt_ids for r in requests], params)

    def release(self) -> None:
        self.backend.release()

    def close(self) -> None:
        self.backend.close()


class ChatPolicy(Policy):
    """A model behind an OpenAI-compatible endpoint (the external simulator baseline)."""

    renderer: ChatRenderer | None = None
    trainable = False

    def __init__(self, client: ChatBackend) -> None:
        self.client = client

    def generate(self, requests: Sequence[GenRequest], params: SamplingParams) -> list[Generation]:
        return [
            _text_generation(self.client.chat(r.messages, _request_params(r, params)), None)
            for r in requests
        ]


def _request_params(req: GenRequest, params: SamplingParams) -> SamplingParams:
    """A seeded request of the k-th copy of a task samples with seed + k: an endpoint given one
    seed for every copy would write the same text n times (the local backends already draw
    distinct streams per prompt of a batch)."""
    if params.seed is None or req.episode.sample_index == 0:
        return params
    return dataclasses.replace(params, seed=params.seed + req.episode.sample_index)


class OraclePolicy(Policy):
    """Perfect play, for checking the pipeline end to end (it must score 1.0).

    Caller: issues the current turn's expected calls one per message, then answers with the
    turn's expected facts (`Turn.answer_facts`).
    Simulator: executes the episode's calls on a private copy of the task's real world, so its
    rehearsal equals the real result (rehearsal fidelity 1.0). That is real execution, so the
    oracle cannot rehearse privately at test time (`rehearses_privately` is False).
    """

    trainable = False
    rehearses_privately = False

    def __init__(self, renderer: ChatRenderer | None = None) -> None:
        self.renderer = renderer

    def generate(self, requests: Sequence[GenRequest], params: SamplingParams) -> list[Generation]:
        return [_text_generation(self._text(r), self.renderer) for r in requests]

    def _text(self, req: GenRequest) -> str:
        ep = req.episode
        if req.role is Role.CALLER:
            expected = ep.task.turns[ep.turn].expected_calls
            done = len(ep.turn_calls)
            if done < len(expected):
                nxt = expected[done]
                return format_assistant_response("", [ToolCall(nxt.name, dict(nxt.arguments))])
            facts = ep.task.turns[ep.turn].answer_facts
            return "Done: " + ", ".join(facts) + "." if facts else "Done."
        result = ep.shadow_result()
        return f"<execution_result>\n{json.dumps(result, ensure_ascii=False)}\n</execution_result>"


class RandomPolicy(Policy):
    """Uniformly random play: a floor for every metric (it should score about 0)."""

    trainable = False

    def __init__(self, seed: int = 0, renderer: ChatRenderer | None = None) -> None:
        self.rng = random.Random(seed)
        self.renderer = renderer

    def generate(self, requests: Sequence[GenRequest], params: SamplingParams) -> list[Generation]:
        return [_text_generation(self._text(r), self.renderer) for r in requests]

    def _value(self, schema: Any) -> Any:
        """A random value for one parameter. Any valid schema may come here, `true` and an empty
        enum included: this policy never crashes on a task that loaded, it just plays badly."""
        if not isinstance(schema, dict):
            schema = {}
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = self.rng.choice(kind) if kind else None
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            return copy.deepcopy(self.rng.choice(enum))
        if kind == "integer":
            return self.rng.randint(0, 500)
        if kind == "number":
            return round(self.rng.uniform(0, 500), 2)
        if kind == "boolean":
            return self.rng.random() < 0.5
        return "".join(self.rng.choice("abcdefgh0123456789-") for _ in range(6))

    def _text(self, req: GenRequest) -> str:
        if req.role is Role.SIMULATOR:
            return '<execution_result>\n{"status": "ok"}\n</execution_result>'
        if self.rng.random() < 0.3:
            return "Done."

        tool = self.rng.choice(req.episode.task.tools)["function"]
        parameters = tool.get("parameters")
        props = parameters.get("properties") if isinstance(parameters, dict) else None
        args = {k: self._value(v) for k, v in props.items()} if isinstance(props, dict) else {}
        return format_assistant_response("", [ToolCall(tool["name"], args)])
