"""The transformers backend: batched sampling with exact ids and log-probabilities, with each
of its decoders (`model.generate` and the static-cache loop)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from envace.policy.hf_backend import TransformersBackend
from envace.policy.types import SamplingParams

pytestmark = pytest.mark.parametrize("decode", ["generate", "static"])


def test_greedy_batch_matches_single_prompt_generation(
    micro_model: Any, tiny_tokenizer: Any, decode: str
) -> None:
    backend = TransformersBackend(micro_model, tiny_tokenizer, max_batch_size=2, decode=decode)
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14]]
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    batched = backend.generate(prompts, params)
    single = [backend.generate([p], params)[0] for p in prompts]
    assert [g.token_ids for g in batched] == [g.token_ids for g in single]
    for g in batched:
        assert len(g.token_ids) == len(g.logprobs) <= 6
        assert g.finish_reason in ("stop", "length")
        if g.finish_reason == "stop":
            assert g.token_ids[-1] == backend.eos_id


def test_logprobs_equal_the_model_distribution_at_temperature_one(
    micro_model: Any, tiny_tokenizer: Any, decode: str
) -> None:
    backend = TransformersBackend(micro_model, tiny_tokenizer, decode=decode)
    prompt = [5, 6, 7, 8]
    gen = backend.generate([prompt], SamplingParams(max_new_tokens=5, temperature=1.0, seed=3))[0]
    ids = torch.tensor([prompt + gen.token_ids])
    with torch.no_grad():
        logits = micro_model(ids).logits[0, len(prompt) - 1 : -1]  # (R, V)
    want = logits.log_softmax(-1).gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(gen.logprobs), want, atol=1e-4)


def test_seed_makes_sampling_reproducible_and_eos_cuts(
    micro_model: Any, tiny_tokenizer: Any, decode: str
) -> None:
    backend = TransformersBackend(micro_model, tiny_tokenizer, decode=decode)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=11)
    a = backend.generate([[5, 6], [7, 8]], params)
    b = backend.generate([[5, 6], [7, 8]], params)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert all(backend.eos_id not in g.token_ids[:-1] for g in a)
    assert backend.generated_tokens == sum(len(g.token_ids) for g in a + b)


def test_logprobs_follow_temperature_and_top_k_in_a_left_padded_batch(
    micro_model: Any, tiny_tokenizer: Any, decode: str
) -> None:
    """Log-probs are recorded step by step after our warpers: each equals log-softmax of the
    top-k-filtered logits / T at that step, for every row of a batch of unequal prompts."""
    backend = TransformersBackend(micro_model, tiny_tokenizer, decode=decode)
    prompts = [[5, 6, 7, 8], [9, 10]]
    t, k = 0.7, 4
    params = SamplingParams(max_new_tokens=6, temperature=t, top_k=k, seed=5)
    for prompt, gen in zip(prompts, backend.generate(prompts, params), strict=True):
        assert len(gen.logprobs) == len(gen.token_ids) >= 1
        ids = torch.tensor([prompt + gen.token_ids])
        with torch.no_grad():
            logits = micro_model(ids).logits[0, len(prompt) - 1 : -1] / t  # (R, V)
        kth = logits.topk(k, dim=-1).values[:, -1:]
        filtered = logits.masked_fill(logits < kth, float("-inf"))
        taken = torch.tensor(gen.token_ids)[:, None]
        assert bool((logits.gather(-1, taken) >= kth).all())  # sampled inside the top k
        want = filtered.log_softmax(-1).gather(-1, taken).squeeze(-1)
        assert torch.allclose(torch.tensor(gen.logprobs), want, atol=1e-4)


def test_no_prompts_is_no_work_and_an_empty_prompt_is_refused(
    micro_model: Any, tiny_tokenizer: Any, decode: str
) -> None:
    backend = TransformersBackend(micro_model, tiny_tokenizer, decode=decode)
    assert backend.generate([], SamplingParams(max_new_tokens=3)) == []
    with pytest.raises(ValueError, match="at least one token"):
        backend.generate([[5, 6], []], SamplingParams(max_new_tokens=3))
