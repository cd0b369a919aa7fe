"""Which prompt prefixes already have keys and values in a cache: the static decoder's lookup.

A multi-turn rollout sends every conversation back to the model once per turn: the caller's
next prompt is its previous prompt, its own answer and the new tool results; the rehearsal
prompts of one episode share the tools and the history; the n rollouts of a task start from the
same prompt. Without reuse each call prefills all of it again (on the CPU, prefill was two
thirds of multi-turn generation time: docs/benchmarks.md, 2026-11-30).

`RowKV` says where one sequence's keys/values sit in a cache (token i at some slot); a
`PrefixIndex` maps block-aligned prefixes (chain hashes of `BLOCK`-token blocks, as vLLM's
automatic prefix caching) to the rows holding them, and `match` returns the longest prefix of a
prompt that a row holds, to the token (verified against the row's tokens, so a hash collision
costs a miss, never a wrong cache entry).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["BLOCK", "PrefixIndex", "RowKV"]

BLOCK = 16  # tokens per hashed block


@dataclass
class RowKV:
    """One sequence in a cache: `tokens[i]` has its keys/values at cache slot `slots()[i]`.
    `segments` are runs of consecutive slots (first slot, count), in token order."""

    tokens: list[int]
    segments: list[tuple[int, int]] = field(default_factory=list)

    def slots(self, count: int) -> torch.Tensor:
        """The cache slots of the first `count` tokens."""
        out: list[torch.Tensor] = []
        left = count
        for first, n in self.segments:
            if left <= 0:
                break
            take = min(n, left)
            out.append(torch.arange(first, first + take))
            left -= take
        if left > 0:
            raise ValueError(f"the row holds {count - left} tokens, not {count}")
        return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def _chain(tokens: Sequence[int], blocks: int) -> list[int]:
    """Hash of each block-aligned prefix: h_k covers tokens[: (k + 1) * BLOCK]."""
    out: list[int] = []
    h = 0
    for k in range(blocks):
        h = hash((h, tuple(tokens[k * BLOCK : (k + 1) * BLOCK])))
        out.append(h)
    return out


class PrefixIndex:
    """Rows of one cache, findable by prefix."""

    def __init__(self) -> None:
        self.rows: list[RowKV] = []
        self._blocks: dict[int, int] = {}  # prefix hash -> row (the first row holding it)

    def add(self, row: RowKV) -> int:
        """Index `row`; returns its number (its batch row in the cache, when added in order)."""
        number = len(self.rows)
        self.rows.append(row)
        for h in _chain(row.tokens, len(row.tokens) // BLOCK):
            self._blocks.setdefault(h, number)
        return number

    def match(self, tokens: Sequence[int], limit: int) -> tuple[int, int]:
        """(row, count): the row holding the longest prefix of `tokens` (at most `limit`
        tokens) found through the block hashes, and how many tokens it holds; (-1, 0) if none
        holds a whole block."""
        best, blocks = -1, 0
        for h in _chain(tokens, min(limit, len(tokens)) // BLOCK):
            row = self._blocks.get(h)
            if row is None:
                break
            best, blocks = row, blocks + 1
        if best < 0:
            return -1, 0
        have = self.rows[best].tokens
        n = min(limit, len(tokens), len(have))
        count = blocks * BLOCK
        if have[:count] != list(tokens[:count]):  # a hash collision: no match
            return -1, 0
        while count < n and have[count] == tokens[count]:  # the last partial block
            count += 1
        return best, count
