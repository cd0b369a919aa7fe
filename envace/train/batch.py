"""Collating rows into padded tensors, and per-token log-probabilities without full logits.

A row is prompt ids + response ids; only response positions are trained. Rows are sorted by
length before being cut into micro-batches, so padding waste stays small.

A row may pack several generations that extend each other (a caller's turns: token-in /
token-out, so each prompt is the previous prompt + response + what came after): their shared
prefix runs through the model once. Per-generation maths (an RL advantage, a sequence's token
mean) runs on `MicroBatch.generations`, one generation per row whether packed or not.

`token_logprobs` never materialises the (tokens x vocabulary) logits of a whole batch: it runs
the decoder, keeps only the hidden states of positions that predict a response token, and
applies the LM head in checkpointed chunks (the logits of one chunk exist at a time, forward and
backward). With a 151,936-token vocabulary that is what lets long batches fit at all.

Rows are right-padded, so under causal attention no real token ever attends to a pad: the
decoder runs without an attention mask (exactly the same log-probs at real positions), which
lets SDPA take its fused causal (flash) kernel instead of a masked one.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from envace.rollout.types import Role, Row
from envace.train.distributed import all_reduce_sum

__all__ = [
    "ChunkFn",
    "Generations",
    "MicroBatch",
    "TrainRow",
    "chunk_logprobs",
    "collate",
    "compiled_chunk_logprobs",
    "logprob_gap",
    "make_micro_batches",
    "mini_batches",
    "pack_prefix_rows",
    "pack_trajectories",
    "token_logprobs",
]


@dataclass
class TrainRow:
    """What the trainer needs of one generation, or of several packed into one sequence.

    advantage: the response's advantage; None: not part of a policy loss (or unscored).
    old_logprobs: the sampling log-probs of every trained token, in position order (the extra
        spans', then the response's); None when unknown.
    extra_spans: further trained [start, end) spans inside `prompt_ids` — set when several
        generations that extend each other (a caller's turns, token-in / token-out) are packed
        into one sequence, so their shared prefix is computed once (`pack_prefix_rows`).
    extra_advantages: the advantage of each extra span (None: the warm start, which has none).
    env_spans: the [start, end) spans of `prompt_ids` between packed generations: what the
        world (real, rehearsed or external) and the chat template wrote there, the observations
        ECHO's auxiliary loss predicts (`algo.env_loss_coef`); set by `pack_prefix_rows`.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float | None = None
    old_logprobs: list[float] | None = None
    role: str = "caller"
    extra_spans: list[tuple[int, int]] | None = None
    extra_advantages: list[float | None] | None = None
    env_spans: list[tuple[int, int]] | None = None

    def __post_init__(self) -> None:
        if self.extra_advantages is not None and len(self.extra_advantages) != len(
            self.extra_spans or []
        ):
            raise ValueError(
                f"extra_advantages has {len(self.extra_advantages)} values for "
                f"{len(self.extra_spans or [])} extra spans; give one per span"
            )

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def num_trained(self) -> int:
        return len(self.response_ids) + sum(e - s for s, e in self.extra_spans or [])

    @property
    def spans(self) -> list[tuple[int, int]]:
        """Every trained [start, end) span, one per generation, in position order."""
        return [*(self.extra_spans or []), (len(self.prompt_ids), self.length)]

    @property
    def span_advantages(self) -> list[float | None]:
        """The advantage of each span of `spans`."""
        extra = self.extra_advantages or [None] * len(self.extra_spans or [])
        return [*extra, self.advantage]


def pack_prefix_rows(rows: Sequence[TrainRow]) -> list[TrainRow]:
    """Pack rows whose prompts extend the previous row's prompt + response into one row.

    Rows must be single generations (no extra spans) in generation order. The packed row trains
    exactly the same tokens with the same left context (causal attention; same positions), each
    span keeping its advantage and old log-probs, at the cost of one sequence instead of
    len(rows). A row that does not extend the previous one (another role, a context reset)
    starts a new pack.
    """
    packed: list[TrainRow] = []
    for row in rows:
        if row.extra_spans:
            raise ValueError("pack_prefix_rows packs single generations; this row is packed")
        last = packed[-1] if packed else None
        if last is not None and row.role == last.role:
            seq = last.prompt_ids + last.response_ids
            if row.prompt_ids[: len(seq)] == seq:
                packed[-1] = TrainRow(
                    row.prompt_ids,
                    row.response_ids,
                    row.advantage,
                    _joined_logprobs(last, row),
                    row.role,
                    extra_spans=[*(last.extra_spans or []), (len(last.prompt_ids), len(seq))],
                    extra_advantages=last.span_advantages,
                    env_spans=[*(last.env_spans or []), (len(seq), len(row.prompt_ids))],
                )
                continue
        packed.append(row)
    return packed


def _joined_logprobs(last: TrainRow, row: TrainRow) -> list[float] | None:
    """The old log-probs of `last`'s trained tokens then `row`'s; None unless both are whole."""
    if last.old_logprobs is None or row.old_logprobs is None:
        return None
    if len(last.old_logprobs) != last.num_trained or len(row.old_logprobs) != len(row.response_ids):
        return None
    return [*last.old_logprobs, *row.old_logprobs]


@dataclass(frozen=True)
class Generations:
    """A micro-batch's trained spans laid out one generation per row: G generations (a packed
    row holds several), L tokens in the longest. Per-generation maths — a sequence's token
    mean, its advantage — runs on this layout, so it is the same whether rows were packed or not.

    index (G, L): flat positions into the micro-batch's (B, T) tensors (0 where masked);
    mask (G, L): 1 on a generation's tokens; advantages (G,): unscored (None) as 0.
    """

    index: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor

    @classmethod
    def of(cls, rows: Sequence[TrainRow], width: int, device: torch.device) -> Generations:
        """The layout of `rows` collated to `width` (T) tokens."""
        spans = [(b, s, e) for b, r in enumerate(rows) for s, e in r.spans]
        longest = max((e - s for _, s, e in spans), default=0)
        index = torch.zeros((len(spans), longest), dtype=torch.long)
        mask = torch.zeros((len(spans), longest), dtype=torch.float32)
        for g, (b, s, e) in enumerate(spans):
            index[g, : e - s] = torch.arange(b * width + s, b * width + e)
            mask[g, : e - s] = 1.0
        adv = [a or 0.0 for r in rows for a in r.span_advantages]
        return cls(index.to(device), mask.to(device), torch.tensor(adv, device=device))

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T) per-token values -> (G, L), differentiable; masked positions hold x[0, 0]."""
        return x.reshape(-1)[self.index.to(x.device)]


@dataclass
class MicroBatch:
    """Right-padded tensors for B rows of max length T.

    input_ids (B, T); attention_mask (B, T); response_mask (B, T) 1 where the token at t is a
    response token (its log-prob is predicted from position t-1), on a packed row's extra spans
    too; advantages (B,) each row's response advantage. Per-generation values (every span's
    advantage, a sequence mean per generation) come from `generations`. env_mask (B, T): 1 on
    the observation tokens of packed rows (`TrainRow.env_spans`) when the batch was collated
    for ECHO's loss, else None; `token_logprobs` then scores those positions too.
    temperature: the log-probs are those of logits / temperature: the RL rollout's sampling
    temperature (`rollout.temperature`, as verl's actor), so the update scores the
    distribution the rows were drawn from; 1 for the warm start.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    rows: list[TrainRow]
    env_mask: torch.Tensor | None = None
    temperature: float = 1.0

    @property
    def target_mask(self) -> torch.Tensor:
        """(B, T) the positions whose log-probs are computed: responses, and observations when
        `env_mask` is set."""
        if self.env_mask is None:
            return self.response_mask
        return torch.maximum(self.response_mask, self.env_mask)

    @property
    def num_env_tokens(self) -> int:
        return 0 if self.env_mask is None else int(self.env_mask.sum().item())

    @property
    def num_tokens(self) -> int:
        return int(self.response_mask.sum().item())

    @property
    def num_generations(self) -> int:
        return sum(len(r.spans) for r in self.rows)

    @cached_property
    def generations(self) -> Generations:
        """The rows' generations one per row, on the device of `response_mask`."""
        return Generations.of(self.rows, self.input_ids.shape[1], self.response_mask.device)

    def to(self, device: torch.device | str) -> MicroBatch:
        """The same batch on `device` (a no-op when it is already there)."""
        return MicroBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.response_mask.to(device),
            self.advantages.to(device),
            self.rows,
            None if self.env_mask is None else self.env_mask.to(device),
            self.temperature,
        )


def collate(
    rows: Sequence[TrainRow], pad_id: int, env: bool = False, temperature: float = 1.0
) -> MicroBatch:
    """`rows` right-padded into one batch; `env`: also the observation mask (`env_mask`);
    `temperature`: the one its log-probs are taken at (`MicroBatch`)."""
    width = max(r.length for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    resp = torch.zeros((len(rows), width), dtype=torch.float32)
    for b, r in enumerate(rows):
        seq = r.prompt_ids + r.response_ids
        ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[b, : len(seq)] = 1
        resp[b, len(r.prompt_ids) : len(seq)] = 1.0
        for start, end in r.extra_spans or []:
            resp[b, start:end] = 1.0
    adv = torch.tensor([r.advantage or 0.0 for r in rows], dtype=torch.float32)
    env_mask = None
    if env:
        env_mask = torch.zeros_like(resp)
        for b, r in enumerate(rows):
            for start, end in r.env_spans or []:
                env_mask[b, start:end] = 1.0
    return MicroBatch(ids, attn, resp, adv, list(rows), env_mask, temperature)


def make_micro_batches(
    rows: Sequence[TrainRow],
    micro_batch_rows: int,
    pad_id: int,
    max_tokens: int | None = None,
    env: bool = False,
    temperature: float = 1.0,
) -> list[MicroBatch]:
    """Length-sorted micro-batches of at most `micro_batch_rows` rows (and `max_tokens` padded
    tokens, when given); `env`, `temperature`: as `collate`'s."""
    ordered = sorted(rows, key=lambda r: r.length)
    batches: list[list[TrainRow]] = []
    for r in ordered:
        cur = batches[-1] if batches else None
        fits = cur is not None and len(cur) < micro_batch_rows
        if fits and cur is not None and max_tokens is not None:
            fits = (len(cur) + 1) * r.length <= max_tokens
        if fits and cur is not None:
            cur.append(r)
        else:
            batches.append([r])
    return [collate(b, pad_id, env, temperature) for b in batches]


def chunk_logprobs(head: Any, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = head(hidden).float()  # (N_chunk, V)
    return logits.log_softmax(-1).gather(-1, targets[:, None]).squeeze(-1)


ChunkFn = Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]


def compiled_chunk_logprobs() -> ChunkFn:
    """The head chunk (linear, fp32 cast, log-softmax, gather) as one compiled graph: the fp32
    logits and log-softmax of a chunk are never written out whole."""
    fn: ChunkFn = torch.compile(chunk_logprobs)  # shapes become dynamic after the first change
    return fn


def _is_right_padded(mask: torch.Tensor) -> bool:
    """Every row is ones then zeros (or all ones)."""
    return bool((mask[:, 1:] <= mask[:, :-1]).all()) if mask.shape[1] > 1 else True


def token_logprobs(
    model: Any,
    mb: MicroBatch,
    chunk_tokens: int = 4096,
    chunk_fn: ChunkFn = chunk_logprobs,
) -> torch.Tensor:
    """(B, T) log p(token_t | tokens_<t) at `mb.target_mask`'s positions (the responses, and the
    observations of an `env_mask`), 0 elsewhere; p is softmax(logits / `mb.temperature`)."""
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    # Right padding + causal attention: pads sit after every real token, so no mask is needed.
    mask = None if _is_right_padded(mb.attention_mask) else mb.attention_mask
    hidden = decoder(input_ids=mb.input_ids, attention_mask=mask, use_cache=False).last_hidden_state
    target_mask = mb.target_mask[:, 1:] > 0  # (B, T-1)
    h = hidden[:, :-1][target_mask]  # (N, H): positions that predict a target token
    targets = mb.input_ids[:, 1:][target_mask]  # (N,)
    if mb.temperature != 1.0:
        h = h / mb.temperature  # dividing the logits: the head is linear, without a bias
    pieces = []
    for start in range(0, h.shape[0], chunk_tokens):
        hs, ts = h[start : start + chunk_tokens], targets[start : start + chunk_tokens]
        if torch.is_grad_enabled():
            pieces.append(checkpoint(chunk_fn, head, hs, ts, use_reentrant=False))
        else:
            pieces.append(chunk_fn(head, hs, ts))
    flat = torch.cat(pieces) if pieces else hidden.new_zeros(0)
    out = torch.zeros(target_mask.shape, dtype=flat.dtype, device=flat.device)
    out[target_mask] = flat
    return torch.nn.functional.pad(out, (1, 0))  # align: position t holds log p(token_t)


def mini_batches(rows: Sequence[Row], k: int) -> list[list[Row]]:
    """`rows` cut into at most `k` mini-batches of whole task groups (a task's rollouts, both
    roles, stay together: its advantages were computed within it), in order of first
    appearance, as even in task count as the division allows; fewer when there are fewer
    tasks. The same rows give the same cut on every rank."""
    groups: dict[str, list[Row]] = {}
    for r in rows:
        groups.setdefault(r.uid, []).append(r)
    tasks = list(groups.values())
    k = max(1, min(k, len(tasks)))
    bounds = [len(tasks) * i // k for i in range(k + 1)]
    return [[r for g in tasks[a:b] for r in g] for a, b in itertools.pairwise(bounds)]


def pack_trajectories(rows: Sequence[Row]) -> list[TrainRow]:
    """Trainer rows of `rows` (in generation order within each trajectory): each trajectory's
    caller generations packed where one extends the previous (envace.train.rl's module
    docstring says why the loss is the unpacked one); simulator rows one each."""
    callers: dict[str, list[TrainRow]] = {}
    out: list[TrainRow] = []
    for r in rows:
        row = TrainRow(r.prompt_ids, r.response_ids, r.advantage, list(r.logprobs), str(r.role))
        if r.role == Role.CALLER:
            callers.setdefault(r.traj_id, []).append(row)
        else:
            out.append(row)
    for group in callers.values():
        out += pack_prefix_rows(group)
    return out


def logprob_gap(mbs: Sequence[MicroBatch], old: Sequence[torch.Tensor]) -> float:
    """Mean |log p_trainer - log p_sampler| over the response tokens of all ranks' rows: how
    far the generating weights (a vLLM engine, or another precision) are from the trained
    ones. ~0 when the rollout ran on the trainer's own weights at temperature 1."""
    total, count = 0.0, 0
    for mb, lp in zip(mbs, old, strict=True):
        for b, row in enumerate(mb.rows):
            if not row.old_logprobs or len(row.old_logprobs) != row.num_trained:
                continue
            mine = torch.cat([lp[b, s:e] for s, e in row.spans]).float().cpu()
            total += float((mine - torch.tensor(row.old_logprobs)).abs().sum())
            count += row.num_trained
    count_all = all_reduce_sum(count)
    return all_reduce_sum(total) / count_all if count_all else 0.0
