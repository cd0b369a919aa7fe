"""Prefix caching in the static decoder: prompt prefixes computed before are copied, not
recomputed, and decoding from them gives what decoding from scratch gives.

Runs the decoder eagerly on the CPU (the GPU's graph replays the same step); exactness is
checked against a teacher-forced forward of the whole sequence and against the same decoder
with `prefix_cache=False`.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from envace.policy.hf_backend import TransformersBackend
from envace.policy.prefix_cache import BLOCK, PrefixIndex, RowKV
from envace.policy.static_decode import StaticDecoder
from envace.policy.types import Generation, SamplingParams

P1 = [(7 * i) % 200 + 5 for i in range(40)]
P2 = [(11 * i) % 190 + 7 for i in range(35)]
P3 = [3, 4, 5, 6, 7, 8, 9, 10, 11]


def _backend(model: Any, tok: Any, prefix_cache: bool = True) -> TransformersBackend:
    backend = TransformersBackend(model, tok, decode="static", prefix_cache=prefix_cache)
    assert backend.static is not None
    backend.static.max_slots = 4
    return backend


def _decoder(backend: TransformersBackend) -> StaticDecoder:
    assert backend.static is not None
    return backend.static


def _teacher_forced(model: Any, prompt: list[int], ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


def _assert_exact(model: Any, prompts: list[list[int]], gens: list[Generation]) -> None:
    for prompt, g in zip(prompts, gens, strict=True):
        want = _teacher_forced(model, prompt, g.token_ids)
        assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-4)


def test_the_index_finds_the_longest_held_prefix_to_the_token() -> None:
    index = PrefixIndex()
    a = list(range(100, 140))  # 40 tokens
    b = [*a[:20], 1, 2, 3, *list(range(60))]
    assert index.add(RowKV(a, [(5, 40)])) == 0
    assert index.add(RowKV(b, [(0, 83)])) == 1
    assert index.match([*a[:33], 9, 9], limit=100) == (0, 33)  # 2 blocks by hash, 1 by token
    assert index.match(b[:50], limit=100) == (1, 50)
    assert index.match(a, limit=len(a) - 1) == (0, 39)  # the limit: keep one to compute
    assert index.match(a[: BLOCK - 1], limit=100) == (-1, 0)  # under a block: not worth it
    assert index.match([0] * 40, limit=100) == (-1, 0)
    index._blocks = dict.fromkeys(index._blocks, 1)  # a "collision": every hash says row 1
    assert index.match(a[:40], limit=100) == (-1, 0)  # verified against the row: no match


def test_a_row_layout_gives_the_cache_slots_of_its_tokens() -> None:
    row = RowKV(list(range(7)), [(10, 3), (20, 4)])
    assert row.slots(5).tolist() == [10, 11, 12, 20, 21]
    assert row.slots(0).tolist() == []
    with pytest.raises(ValueError, match="holds 7 tokens, not 8"):
        row.slots(8)


@pytest.mark.parametrize("seed", [None, 3], ids=["greedy", "sampled"])
def test_the_rollouts_of_a_task_compute_their_prompt_once(
    micro_model: Any, tiny_tokenizer: Any, seed: int | None
) -> None:
    """Four copies of two prompts and a short unique one: the leaders' prompts are computed
    once (all but their last token), every row then only its last token; greedy output equals
    the decoder without prefix caching, sampled log-probabilities a teacher-forced forward."""
    prompts = [P1] * 4 + [P2] * 4 + [P3]
    params = SamplingParams(max_new_tokens=10, temperature=0.0 if seed is None else 1.0, seed=seed)
    cached = _backend(micro_model, tiny_tokenizer)
    got = cached.generate(prompts, params)
    counts = _decoder(cached).counts
    assert counts["prompt_tokens"] == 4 * 40 + 4 * 35 + 9
    assert counts["computed_tokens"] == 39 + 34 + 8 + len(prompts)
    _assert_exact(micro_model, prompts, got)
    if seed is None:
        plain = _backend(micro_model, tiny_tokenizer, prefix_cache=False)
        assert [g.token_ids for g in got] == [g.token_ids for g in plain.generate(prompts, params)]
        assert _decoder(plain).counts["computed_tokens"] == 4 * 40 + 4 * 35 + 9


def test_the_next_turn_reuses_the_conversation_so_far(
    micro_model: Any, tiny_tokenizer: Any
) -> None:
    """A second call whose prompts continue the first call's prompts and answers (the caller's
    next turn) computes only the new tokens: the answer's last token (never fed back) and what
    follows. A call of other prompts in between (rehearsal) does not evict them."""
    backend = _backend(micro_model, tiny_tokenizer)
    dec = _decoder(backend)
    # with this seed no call ends all its rows early: every call runs its 6 steps
    params = SamplingParams(max_new_tokens=6, seed=1)
    first = backend.generate([P1, P2], params)
    backend.generate([P3, P3[:5]], params)  # another role's call
    tail = [40, 41, 42]
    turn2 = [p + g.token_ids + tail for p, g in zip([P1, P2], first, strict=True)]
    before = dict(dec.counts)
    second = backend.generate(turn2, params)
    fed = [min(len(g.token_ids), 5) for g in first]  # the last sampled token is not fed
    computed = dec.counts["computed_tokens"] - before["computed_tokens"]
    assert computed == sum(
        len(t) - (len(p) + f) for t, p, f in zip(turn2, [P1, P2], fed, strict=True)
    )
    _assert_exact(micro_model, turn2, second)


def test_prefixes_are_not_reused_once_the_weights_change(
    micro_model: Any, tiny_tokenizer: Any
) -> None:
    """An in-place update that bypasses the version counters (`p.data.copy_`, as DeepSpeed
    writes its updates back) still invalidates what the caches hold: the same call recomputes
    every prompt token and matches the new weights."""
    backend = _backend(micro_model, tiny_tokenizer)
    dec = _decoder(backend)
    params = SamplingParams(max_new_tokens=4, temperature=0.0)
    backend.generate([P1, P1], params)
    weight = next(micro_model.parameters())
    saved = weight.detach().clone()
    try:
        weight.data.mul_(1.5)
        before = dec.counts["computed_tokens"]
        again = backend.generate([[*P1, 9]], params)
        assert dec.counts["computed_tokens"] - before == len(P1) + 1
        _assert_exact(micro_model, [[*P1, 9]], again)
    finally:
        weight.data.copy_(saved)


def test_buckets_and_a_reused_slot_keep_prefixes_exact(
    micro_model: Any, tiny_tokenizer: Any
) -> None:
    """With the GPU's shape buckets the next turn lands in the slot that holds its prefix:
    the prefix is read before the slot is overwritten, and the result stays exact."""
    backend = TransformersBackend(micro_model, tiny_tokenizer, decode="static")
    backend.static = StaticDecoder(micro_model, backend.eos_id, backend.pad_id, bucket=True)
    params = SamplingParams(max_new_tokens=6, seed=5)
    first = backend.generate([P1, P2, P1], params)
    turn2 = [p + g.token_ids + [50] for p, g in zip([P1, P2, P1], first, strict=True)]
    before = backend.static.counts["computed_tokens"]
    second = backend.generate(turn2, params)
    assert len(backend.static._slots) == 1  # (8, 128) both times
    assert backend.static.counts["computed_tokens"] - before < sum(len(t) for t in turn2) / 4
    _assert_exact(micro_model, turn2, second)


def test_a_held_prefix_that_would_only_widen_the_call_is_not_copied(
    micro_model: Any, tiny_tokenizer: Any
) -> None:
    """Held prefixes sit left of the computed columns: next to a prompt with nothing held and a
    longer remainder, copying saves no column and widens the cache, so the plan holds nothing;
    next to a short new prompt it copies."""
    backend = _backend(micro_model, tiny_tokenizer)
    dec = _decoder(backend)
    first = backend.generate([P1], SamplingParams(max_new_tokens=4, temperature=0.0))
    turn2 = [*P1, *first[0].token_ids, 60, 61]
    fresh = [(13 * i) % 180 + 9 for i in range(60)]
    plan = dec.plan([turn2, fresh])
    assert plan.sources == [None, None] and plan.width == 60
    plan = dec.plan([turn2, P3])
    assert plan.sources[0] is not None and plan.sources[0].count >= len(P1)
    assert plan.width == plan.sources[0].count + len(P3)


@pytest.mark.parametrize("bucket", [False, True], ids=["eager", "buckets"])
def test_random_conversations_stay_exact(
    micro_model: Any, tiny_tokenizer: Any, bucket: bool
) -> None:
    """Six calls of a seeded random mix: continued conversations, repeated prompts, prompts
    sharing only a head, one-token prompts, fresh ones. Every returned log-probability equals a
    teacher-forced forward, whatever mix of copied and computed prefixes each call used."""
    import random

    rng = random.Random(7)
    backend = TransformersBackend(micro_model, tiny_tokenizer, decode="static")
    backend.static = StaticDecoder(micro_model, backend.eos_id, backend.pad_id, bucket=bucket)
    head = [rng.randrange(5, 400) for _ in range(20)]
    history: list[list[int]] = [head + [rng.randrange(5, 400) for _ in range(k)] for k in (3, 9)]
    for call in range(6):
        prompts: list[list[int]] = []
        for seq in rng.sample(history, min(len(history), 4)):  # the next turn of some
            prompts.append([*seq, *[rng.randrange(5, 400) for _ in range(rng.randrange(1, 6))]])
        prompts += [prompts[0]] * rng.randrange(0, 3)  # rollouts of one task
        prompts.append(head + [rng.randrange(5, 400) for _ in range(rng.randrange(1, 30))])
        prompts.append([rng.randrange(5, 400)])  # one token
        params = SamplingParams(max_new_tokens=rng.randrange(2, 9), seed=call)
        gens = backend.generate(prompts, params)
        _assert_exact(micro_model, prompts, gens)
        history += [p + g.token_ids for p, g in zip(prompts, gens, strict=True)]
    counts = backend.static.counts
    assert counts["computed_tokens"] < 0.6 * counts["prompt_tokens"]
