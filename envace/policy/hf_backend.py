"""Generation with a Hugging Face transformers model: the default backend (CPU and tests).

Prompts are token ids; outputs are the sampled ids with their log-probabilities under the
sampling distribution (after temperature / top-k / top-p), cut after the first end-of-turn id.
Prompts are sorted by length and left-padded in micro-batches, so padding waste stays small.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from envace.policy.types import Generation, SamplingParams

__all__ = ["TransformersBackend", "load_model_and_tokenizer"]

log = logging.getLogger(__name__)


def load_model_and_tokenizer(path: str | Path, dtype: str = "float32") -> tuple[Any, Any]:
    """Load a Hugging Face checkpoint (a local directory or a hub id) for generation/training."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    return model, tokenizer


class TransformersBackend:
    """`GenerationBackend` over a causal LM already in memory (shared with the trainer)."""

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 64) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.eos_id: int = int(tokenizer.convert_tokens_to_ids("<|im_end|>"))
        pad = tokenizer.pad_token_id
        self.pad_id: int = int(pad) if pad is not None else self.eos_id
        self.max_batch_size = max_batch_size
        self.generated_tokens = 0  # running counter for throughput metrics

    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if params.seed is not None:
            torch.manual_seed(params.seed)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        out: list[Generation | None] = [None] * len(prompts)
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            gens = self._generate_batch([prompts[i] for i in chunk], params)
            for i, gen in zip(chunk, gens, strict=True):
                out[i] = gen
        return [g for g in out if g is not None]

    def _generate_batch(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[Generation]:
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, p in enumerate(prompts):  # left padding: generation continues at the right edge
            ids[row, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            mask[row, width - len(p) :] = 1
        ids, mask = ids.to(self.model.device), mask.to(self.model.device)
        greedy = params.temperature <= 0
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                result = self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    max_new_tokens=params.max_new_tokens,
                    do_sample=not greedy,
                    temperature=None if greedy else params.temperature,
                    top_p=None if greedy else params.top_p,
                    top_k=None if greedy or params.top_k <= 0 else params.top_k,
                    eos_token_id=self.eos_id,
                    pad_token_id=self.pad_id,
                    output_scores=True,
                    return_dict_in_generate=True,
                )
        finally:
            self.model.train(was_training)
        seqs = result.sequences[:, width:]  # (B, T_new)
        # scores: T_new tensors of (B, V), already temperature/top-k/top-p processed
        logp = torch.stack(result.scores, dim=1).float().log_softmax(dim=-1)  # (B, T_new, V)
        tok_logp = logp.gather(-1, seqs.unsqueeze(-1)).squeeze(-1)  # (B, T_new)
        return [self._to_generation(seqs[b], tok_logp[b]) for b in range(len(prompts))]

    def _to_generation(self, seq: torch.Tensor, logps: torch.Tensor) -> Generation:
        ids = seq.cpu().tolist()
        finish: Any = "length"
        if self.eos_id in ids:
            ids = ids[: ids.index(self.eos_id) + 1]
            finish = "stop"
        self.generated_tokens += len(ids)
        return Generation(
            token_ids=ids,
            logprobs=[float(x) for x in logps[: len(ids)].tolist()],
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=finish,
        )
