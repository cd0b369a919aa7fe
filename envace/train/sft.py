"""Warm start: supervised fine-tuning of BOTH roles on gold conversations.

The rows are produced by the rollout engine itself, driven by a `GoldPolicy` that replays the
gold conversation: caller rows are the gold assistant messages, simulator rows are the gold
(real) tool results. So warm-start prompts are built by exactly the code that builds RL and
evaluation prompts — token for token — and the simulator learns from real results.

A share of tasks (`grounding_dropout`) is replayed without grounding examples, so the simulator
also learns to predict results from the conversation alone (held-out tasks have no grounding).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from envace.errors import require_finite
from envace.policy.chat import ChatRenderer, format_assistant_response
from envace.policy.types import Generation, SamplingParams, ToolCall
from envace.rollout.engine import RolloutConfig, RolloutEngine
from envace.rollout.grading import TaskGrader
from envace.rollout.policies import GenRequest, Policy
from envace.rollout.types import Role
from envace.tasks.model import Task
from envace.train.batch import TrainRow, make_micro_batches, pack_prefix_rows
from envace.train.engine import TrainingEngine

__all__ = ["GoldPolicy", "SFTStats", "build_sft_rows", "run_sft", "sft_steps"]

log = logging.getLogger(__name__)


def _gold_steps(messages: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """The caller texts (one per assistant message) and tool contents, in order."""
    caller: list[str] = []
    tools: list[str] = []
    for m in messages:
        if m.get("role") == "assistant":
            calls = []
            for c in m.get("tool_calls") or []:
                fn = c.get("function", c)
                args = fn.get("arguments", {})
                calls.append(
                    ToolCall(fn["name"], json.loads(args) if isinstance(args, str) else args)
                )
            caller.append(format_assistant_response(m.get("content") or "", calls))
        elif m.get("role") == "tool":
            content = m.get("content", "")
            tools.append(content if isinstance(content, str) else json.dumps(content))
    return caller, tools


class GoldPolicy(Policy):
    """Replays gold conversations (keyed by task id) as a policy for both roles."""

    trainable = True

    def __init__(self, gold: Mapping[str, Sequence[Mapping[str, Any]]], renderer: ChatRenderer):
        self.renderer: ChatRenderer | None = renderer
        self.steps = {tid: _gold_steps(msgs) for tid, msgs in gold.items()}

    def generate(self, requests: Sequence[GenRequest], params: SamplingParams) -> list[Generation]:
        return [self._one(r) for r in requests]

    def _one(self, req: GenRequest) -> Generation:
        ep = req.episode
        caller, tools = self.steps[ep.task.id]
        if req.role is Role.CALLER:
            idx = sum(1 for m in ep.traj.messages if m.get("role") == "assistant")
            text = caller[idx] if idx < len(caller) else "Done."
        else:
            idx = len(ep.issued) - len(ep.pending) + ep.cursor
            text = f"<execution_result>\n{tools[idx]}\n</execution_result>"
        assert self.renderer is not None
        ids = [*self.renderer.encode(text), self.renderer.eos_id]
        return Generation(ids, [0.0] * len(ids), text, "stop")


def build_sft_rows(
    tasks: Sequence[Task],
    gold: Mapping[str, Sequence[Mapping[str, Any]]],
    renderer: ChatRenderer,
    rollout: RolloutConfig,
    grounding_dropout: float,
    seed: int,
) -> tuple[list[TrainRow], int]:
    """SFT rows of both roles; returns (rows, number of gold episodes that did not replay)."""
    usable = [t for t in tasks if t.id in gold]
    rng = random.Random(seed)
    ungrounded = {t.id for t in usable if rng.random() < grounding_dropout}
    policy = GoldPolicy(gold, renderer)
    rows: list[TrainRow] = []
    broken = 0
    for grounded in (True, False):
        subset = [t for t in usable if (t.id in ungrounded) != grounded]
        if not subset:
            continue
        cfg = dataclasses.replace(rollout, mode="rehearsal", grounding=grounded)
        for traj in RolloutEngine(policy, cfg, TaskGrader()).run(subset):
            if traj.reward is None or traj.reward < 1.0:
                broken += 1  # the gold did not replay cleanly (e.g. a length limit): skip it
                continue
            callers = [
                TrainRow(r.prompt_ids, r.response_ids, role="caller")
                for r in traj.rows
                if r.role is Role.CALLER
            ]
            rows += pack_prefix_rows(callers)
            rows += [
                TrainRow(r.prompt_ids, r.response_ids, role="simulator")
                for r in traj.rows
                if r.role is Role.SIMULATOR
            ]
    return rows, broken


def sft_steps(n_rows: int, epochs: float, batch_rows: int) -> int:
    """Optimizer steps of `epochs` passes over `n_rows` rows: none for 0 epochs, at least one
    for any positive number."""
    if epochs <= 0:
        return 0
    return max(1, round(epochs * n_rows / batch_rows))


@dataclass(frozen=True)
class SFTStats:
    steps: int
    rows: int
    final_loss: float
    losses: list[float]


def run_sft(
    engine: TrainingEngine,
    rows: Sequence[TrainRow],
    *,
    epochs: float,
    batch_rows: int,
    pad_id: int,
    seed: int,
    progress: bool = True,
    micro_batch_tokens: int | None = None,
) -> SFTStats:
    """Token-mean cross-entropy on response tokens; one optimizer step per batch of rows,
    accumulated over length-sorted micro-batches of at most `micro_batch_tokens` padded tokens
    (None: the whole batch at once)."""
    if not rows:
        raise ValueError("no warm-start rows: check the gold conversations and the limits")
    rng = random.Random(seed)
    total = sft_steps(len(rows), epochs, batch_rows)
    order: list[TrainRow] = []
    losses: list[float] = []
    device = next(engine.model.parameters()).device  # the engine's (a GPU's under CUDA)
    bar = tqdm(range(total), desc="warm start", unit="step", disable=not progress)
    for _ in bar:
        if len(order) < batch_rows:
            fresh = list(rows)
            rng.shuffle(fresh)
            order += fresh
        batch, order = order[:batch_rows], order[batch_rows:]
        n_tokens = sum(r.num_trained for r in batch)
        loss_sum = 0.0
        for mb in make_micro_batches(batch, batch_rows, pad_id, micro_batch_tokens):
            mb = mb.to(device)
            logp = engine.logprobs(mb)
            loss = -(logp * mb.response_mask).sum() / n_tokens
            require_finite(
                float(loss.detach()),
                f"the warm-start loss at step {len(losses) + 1}",
                "Lower warm_start.lr.",
            )
            engine.backward(loss)
            loss_sum += float(loss.detach())
        engine.step()
        losses.append(loss_sum)
        bar.set_postfix(loss=f"{loss_sum:.3f}")
    return SFTStats(total, len(rows), losses[-1], losses)
