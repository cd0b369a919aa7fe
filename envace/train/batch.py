"""Collating rows into padded tensors, and per-token log-probabilities without full logits.

A row is prompt ids + response ids; only response positions are trained. Rows are sorted by
length before being cut into micro-batches, so padding waste stays small.

`token_logprobs` never materialises the (tokens x vocabulary) logits of a whole batch: it runs
the decoder, keeps only the hidden states of positions that predict a response token, and
applies the LM head in checkpointed chunks (the logits of one chunk exist at a time, forward and
backward). With a 151,936-token vocabulary that is what lets long batches fit at all.

Rows are right-padded, so under causal attention no real token ever attends to a pad: the
decoder runs without an attention mask (exactly the same log-probs at real positions), which
lets SDPA take its fused causal (flash) kernel instead of a masked one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

__all__ = [
    "ChunkFn",
    "MicroBatch",
    "TrainRow",
    "chunk_logprobs",
    "collate",
    "compiled_chunk_logprobs",
    "make_micro_batches",
    "pack_prefix_rows",
    "token_logprobs",
]


@dataclass
class TrainRow:
    """What the trainer needs of one generation. advantage None: not part of a policy loss.

    extra_spans: further trained [start, end) spans inside `prompt_ids` — set when several
    generations that extend each other (a caller's turns, token-in / token-out) are packed into
    one sequence, so their shared prefix is computed once (warm start only).
    """

    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float | None = None
    old_logprobs: list[float] | None = None
    role: str = "caller"
    extra_spans: list[tuple[int, int]] | None = None

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def num_trained(self) -> int:
        return len(self.response_ids) + sum(e - s for s, e in self.extra_spans or [])


def pack_prefix_rows(rows: Sequence[TrainRow]) -> list[TrainRow]:
    """Pack rows whose prompts extend the previous row's prompt + response into one row.

    Rows must be in generation order. The packed row trains exactly the same tokens with the
    same left context (causal attention), at the cost of one sequence instead of len(rows).
    """
    packed: list[TrainRow] = []
    for row in rows:
        last = packed[-1] if packed else None
        if last is not None:
            seq = last.prompt_ids + last.response_ids
            if row.prompt_ids[: len(seq)] == seq:
                spans = [*(last.extra_spans or []), (len(last.prompt_ids), len(seq))]
                packed[-1] = TrainRow(
                    row.prompt_ids, row.response_ids, role=row.role, extra_spans=spans
                )
                continue
        packed.append(row)
    return packed


@dataclass
class MicroBatch:
    """Right-padded tensors for B rows of max length T.

    input_ids (B, T); attention_mask (B, T); response_mask (B, T) 1 where the token at t is a
    response token (its log-prob is predicted from position t-1); advantages (B,).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    rows: list[TrainRow]

    @property
    def num_tokens(self) -> int:
        return int(self.response_mask.sum().item())

    def to(self, device: torch.device | str) -> MicroBatch:
        """The same batch on `device` (a no-op when it is already there)."""
        return MicroBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.response_mask.to(device),
            self.advantages.to(device),
            self.rows,
        )


def collate(rows: Sequence[TrainRow], pad_id: int) -> MicroBatch:
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
    return MicroBatch(ids, attn, resp, adv, list(rows))


def make_micro_batches(
    rows: Sequence[TrainRow], micro_batch_rows: int, pad_id: int, max_tokens: int | None = None
) -> list[MicroBatch]:
    """Length-sorted micro-batches of at most `micro_batch_rows` rows (and `max_tokens` padded
    tokens, when given)."""
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
    return [collate(b, pad_id) for b in batches]


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
    temperature: float = 1.0,
    chunk_fn: ChunkFn = chunk_logprobs,
) -> torch.Tensor:
    """(B, T) log p(token_t | tokens_<t) at response positions, 0 elsewhere."""
    decoder = model.get_decoder()
    head = model.get_output_embeddings()
    # Right padding + causal attention: pads sit after every real token, so no mask is needed.
    mask = None if _is_right_padded(mb.attention_mask) else mb.attention_mask
    hidden = decoder(input_ids=mb.input_ids, attention_mask=mask, use_cache=False).last_hidden_state
    target_mask = mb.response_mask[:, 1:] > 0  # (B, T-1)
    h = hidden[:, :-1][target_mask]  # (N, H): positions that predict a response token
    targets = mb.input_ids[:, 1:][target_mask]  # (N,)
    if temperature != 1.0:
        h = h / temperature  # equivalent to dividing the logits: the head is linear, no bias
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
