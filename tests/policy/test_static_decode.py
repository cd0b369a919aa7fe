"""The static-cache decoder: the same samples and log-probabilities as `model.generate`.

Its CUDA-graph step cannot run here (no GPU): these tests run the same loop eagerly, with the
same shape buckets, slots and masks the graph uses; bench/gpu.py checks the captured graph's
log-probabilities against a teacher-forced forward on the GPU (`max_logprob_gap`).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from envace.policy.hf_backend import TransformersBackend, resolve_decode
from envace.policy.static_decode import StaticDecoder, _decode_attention, static_decode_supported
from envace.policy.types import SamplingParams

PROMPTS = [[5, 6, 7], [8, 9], [10, 11, 12, 13, 14], [20] * 9, [3, 4, 5]]


def _backends(model: Any, tok: Any, **static_kw: Any) -> tuple[TransformersBackend, Any]:
    gen = TransformersBackend(model, tok, decode="generate")
    static = TransformersBackend(model, tok, decode="static")
    if static_kw:
        static.static = StaticDecoder(model, static.eos_id, static.pad_id, **static_kw)
    return gen, static


def _teacher_forced(model: Any, prompt: list[int], ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids)[:, None]).squeeze(-1)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=12, temperature=0.0),
        SamplingParams(max_new_tokens=12, temperature=1.0, seed=4),
        SamplingParams(max_new_tokens=12, temperature=0.7, top_k=5, top_p=0.9, seed=4),
    ],
    ids=["greedy", "sampled", "top-k-top-p"],
)
def test_static_samples_what_generate_samples(
    micro_model: Any, tiny_tokenizer: Any, params: SamplingParams
) -> None:
    """Same generator, same order of draws, same logits: token-for-token equal to generate,
    log-probabilities equal, on a left-padded batch of unequal prompts."""
    gen, static = _backends(micro_model, tiny_tokenizer)
    want, got = gen.generate(PROMPTS, params), static.generate(PROMPTS, params)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    assert [g.finish_reason for g in got] == [g.finish_reason for g in want]
    for a, b in zip(got, want, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_bucketed_rows_and_stale_cache_slots_change_nothing(
    micro_model: Any, tiny_tokenizer: Any
) -> None:
    """With the GPU's shape buckets (5 rows -> 8, length -> 128) the extra rows are dropped
    and the unused cache slots masked: greedy output equals generate's, and a second, shorter
    call in the same slot (whose cache still holds the first call's keys) equals a fresh one."""
    gen, static = _backends(micro_model, tiny_tokenizer, bucket=True)
    greedy = SamplingParams(max_new_tokens=20, temperature=0.0)
    assert [g.token_ids for g in static.generate(PROMPTS, greedy)] == [
        g.token_ids for g in gen.generate(PROMPTS, greedy)
    ]
    assert static.static is not None and next(iter(static.static._slots))[:2] == (8, 128)
    short = [[30, 31], [32]]
    assert [g.token_ids for g in static.generate(short, greedy)] == [
        g.token_ids for g in gen.generate(short, greedy)
    ]
    assert len(static.static._slots) == 1  # reused: same bucket
    sampled = static.generate(PROMPTS, SamplingParams(max_new_tokens=10, seed=2))
    for prompt, g in zip(PROMPTS, sampled, strict=True):
        want = _teacher_forced(micro_model, prompt, g.token_ids)
        assert torch.allclose(torch.tensor(g.logprobs), want, atol=1e-4)


def test_slots_follow_shapes_and_parameter_addresses(micro_model: Any, tiny_tokenizer: Any) -> None:
    """A slot per (batch, length); the oldest is dropped past max_slots; moving a parameter
    (new storage, as a reload would) makes a new slot instead of reusing a stale one."""
    _, static = _backends(micro_model, tiny_tokenizer, bucket=False, max_slots=2)
    dec = static.static
    assert dec is not None
    p = SamplingParams(max_new_tokens=4, temperature=0.0)
    static.generate([[5, 6]], p)
    static.generate([[5, 6]], p)
    assert len(dec._slots) == 1
    static.generate([[5, 6, 7]], p)
    static.generate([[5, 6], [7, 8]], p)
    assert [k[:2] for k in dec._slots] == [(1, 7), (2, 6)]
    first = static.generate([[5, 6]], p)[0]
    weight = next(micro_model.parameters())
    old = weight.data
    try:
        weight.data = old.clone()
        again = static.generate([[5, 6]], p)[0]
        assert len({k[3] for k in dec._slots}) == 2  # two parameter fingerprints
        assert again.token_ids == first.token_ids
    finally:
        weight.data = old


def test_the_model_keeps_its_attention_implementation(
    micro_model: Any, tiny_tokenizer: Any
) -> None:
    """Our attention is routed in for our calls only: the trainer shares the model."""
    before = micro_model.config._attn_implementation
    _, static = _backends(micro_model, tiny_tokenizer)
    static.generate([[5, 6, 7]], SamplingParams(max_new_tokens=3))
    assert micro_model.config._attn_implementation == before


def test_grouped_decode_attention_equals_sdpa_with_repeated_heads() -> None:
    """One query token, 8 query heads over 2 key/value heads, some keys masked."""
    g = torch.Generator().manual_seed(0)
    b, h, kv, length, d = 3, 8, 2, 11, 16
    q = torch.randn(b, h, 1, d, generator=g)
    k = torch.randn(b, kv, length, d, generator=g)
    v = torch.randn(b, kv, length, d, generator=g)
    mask = torch.rand(b, 1, 1, length, generator=g) > 0.3
    mask[..., 0] = True
    out, _ = _decode_attention(None, q, k, v, mask, scaling=d**-0.5)
    rep_k, rep_v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
    want = torch.nn.functional.scaled_dot_product_attention(q, rep_k, rep_v, attn_mask=mask)
    assert out.shape == (b, 1, h, d)
    assert torch.allclose(out, want.transpose(1, 2), atol=1e-5)


def test_the_sdpa_step_samples_what_the_grouped_step_samples(
    micro_model: Any, tiny_tokenizer: Any
) -> None:
    """`attention="sdpa"` (the benchmark's comparison: transformers' SDPA path with our mask)
    and the default grouped step compute the same attention: same samples, same log-probs."""
    params = SamplingParams(max_new_tokens=12, temperature=1.0, seed=3)
    _, grouped = _backends(micro_model, tiny_tokenizer)
    _, sdpa = _backends(micro_model, tiny_tokenizer, attention="sdpa")
    want, got = grouped.generate(PROMPTS, params), sdpa.generate(PROMPTS, params)
    assert [g.token_ids for g in got] == [g.token_ids for g in want]
    for a, b in zip(got, want, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
    with pytest.raises(ValueError, match="use grouped or sdpa"):
        StaticDecoder(micro_model, 1, 0, attention="flash")


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")
def test_a_compiled_step_samples_what_the_eager_step_samples(
    micro_model: Any, tiny_tokenizer: Any
) -> None:
    """`compile_step` (rollout.compile_decode) runs the step through torch.compile (inductor,
    C++ on the CPU): same tokens and log-probabilities as the eager step, over two calls of
    different shapes (dynamic shapes: no compile per shape), and the model left uncompiled."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    greedy = SamplingParams(max_new_tokens=10, temperature=0.0)
    sampled = SamplingParams(max_new_tokens=10, temperature=1.0, seed=5)
    _, eager = _backends(micro_model, tiny_tokenizer)
    compiled = TransformersBackend(micro_model, tiny_tokenizer, compile_decode=True)
    assert compiled.static is not None and compiled.static._compiled is not None
    graphs = []
    for prompts, params in ((PROMPTS, greedy), (PROMPTS[:2], sampled)):
        want, got = eager.generate(prompts, params), compiled.generate(prompts, params)
        assert [g.token_ids for g in got] == [g.token_ids for g in want]
        for a, b in zip(got, want, strict=True):
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] > before and graphs[1] == graphs[0]  # compiled once, for both shapes
    assert type(micro_model).__name__ == "Qwen3ForCausalLM"  # not an OptimizedModule
    with pytest.raises(ValueError, match=r"rollout\.decode: static"):
        TransformersBackend(micro_model, tiny_tokenizer, decode="generate", compile_decode=True)


def test_a_cpu_call_ends_at_the_step_its_last_row_ends(micro_model: Any) -> None:
    """On the CPU the end-of-rows check costs nothing, so it runs every step: the call stops
    where `model.generate` stops (and draws no samples after), not at the next multiple of
    the GPU's check interval."""
    prompt = [5, 6, 7]
    params = SamplingParams(max_new_tokens=12, temperature=1.0)
    free = StaticDecoder(micro_model, eos_id=-1, pad_id=0)  # never ends early
    torch.manual_seed(0)
    ids, _ = free.generate(free.plan([prompt]), params, lambda s: s)
    seq = ids[0].tolist()
    # the end: a token first sampled at step 3..6 (neither 8 nor 12, where the GPU checks)
    stop = next(i for i in range(2, 6) if seq[i] not in seq[:i])
    dec = StaticDecoder(micro_model, eos_id=seq[stop], pad_id=0)
    torch.manual_seed(0)
    ids, logp = dec.generate(dec.plan([prompt]), params, lambda s: s)
    assert ids.shape == logp.shape == (1, stop + 1)
    assert ids[0].tolist() == seq[: stop + 1]


def test_run_steps_times_the_step_and_forgets_what_the_cache_held(
    micro_model: Any, tiny_tokenizer: Any
) -> None:
    """`run_steps` (the benchmark's step profile) runs steps over the newest cache and marks
    its contents forgotten: the next turn of the conversation computes its prefix again and
    still gets the model's log-probabilities."""
    _, static = _backends(micro_model, tiny_tokenizer)
    dec = static.static
    assert dec is not None
    with pytest.raises(RuntimeError, match="generate once first"):
        dec.run_steps(2)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=1)
    first = static.generate([PROMPTS[2]], params)[0]
    batch, length = dec.run_steps(3)
    assert (batch, length) == (1, len(PROMPTS[2]) + 6)
    assert dec.run_steps(2, graph=False) == (batch, length)
    with pytest.raises(ValueError, match=r"steps must be in \[1, 10\]"):
        dec.run_steps(length)
    before = dec.counts["computed_tokens"]
    turn = PROMPTS[2] + first.token_ids + [9, 10]
    second = static.generate([turn], params)[0]
    assert dec.counts["computed_tokens"] - before == len(turn)  # nothing reused
    want = _teacher_forced(micro_model, turn, second.token_ids)
    assert torch.allclose(torch.tensor(second.logprobs), want, atol=1e-4)


def test_unsupported_models_and_modes_say_why(micro_model: Any) -> None:
    cfg = micro_model.config
    before = getattr(cfg, "layer_types", None)
    cfg.layer_types = ["sliding_attention"] * cfg.num_hidden_layers
    try:
        assert "full attention only" in (static_decode_supported(micro_model) or "")
        assert resolve_decode("auto", micro_model) == "generate"
        with pytest.raises(ValueError, match="use decode: generate"):
            resolve_decode("static", micro_model)
    finally:
        cfg.layer_types = before
    assert resolve_decode("auto", micro_model) == "static"
    with pytest.raises(ValueError, match="use auto, generate or static"):
        resolve_decode("fast", micro_model)
    with pytest.raises(ValueError, match="CUDA graphs need the model on a CUDA device"):
        StaticDecoder(micro_model, 1, 0, use_graphs=True)


def test_a_cache_over_budget_splits_the_batch_and_a_single_row_says_how_to_fix(
    micro_model: Any, tiny_tokenizer: Any
) -> None:
    """`max_cache_bytes` (on a GPU: 80 % of the free memory) bounds the static cache: a batch
    whose cache would not fit is decoded in halves, with the same greedy tokens; one sequence
    that does not fit is a MemoryError naming the settings to change."""
    gen, static = _backends(micro_model, tiny_tokenizer, bucket=False)
    dec = static.static
    assert dec is not None
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)
    width = max(len(p) for p in PROMPTS)
    one_row = dec.cache_bytes(1, width + 8)
    cfg = micro_model.config
    assert (
        one_row
        == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * (width + 8) * 4
    )  # fp32
    dec.max_cache_bytes = 2 * one_row  # two rows at a time
    got = static.generate(PROMPTS, greedy)
    assert [g.token_ids for g in got] == [g.token_ids for g in gen.generate(PROMPTS, greedy)]
    assert all(k[0] <= 2 for k in dec._slots)
    dec.max_cache_bytes = one_row // 2
    with pytest.raises(MemoryError, match=r"rollout\.max_context_tokens"):
        static.generate([PROMPTS[0]], greedy)


def _micro_trainer(tmp_path: Any, *overrides: str, tasks: int | None = None) -> tuple[Any, Any]:
    """An RL trainer over the micro model (torch engine) on the first `tasks` training tasks
    (default all), and its transformers backend."""
    from envace.config import load_config
    from envace.policy.chat import ChatRenderer
    from envace.rollout.grading import TaskGrader
    from envace.run import (
        RunPaths,
        init_model,
        load_splits,
        model_policy,
        prepare_tasks,
    )
    from envace.train.learners import make_engine
    from envace.train.rl import RLTrainer, RoleLearner
    from tests.helpers.micro import MICRO

    cfg = load_config(None, [*MICRO, "rollout.batch_tasks=1", "rollout.n=2", *overrides])
    paths = RunPaths(tmp_path, str(tmp_path))
    prepare_tasks(cfg, paths)
    splits = load_splits(paths.tasks)
    model, tok = init_model(cfg, splits, tmp_path / "init")
    policy = model_policy(model, tok, cfg)
    learner = RoleLearner(
        make_engine(cfg, model, cfg.train.iterations),
        frozenset({"caller"}),
        ChatRenderer(tok).pad_id,
    )
    train = splits.train[:tasks]
    return RLTrainer(cfg, train, policy, [learner], TaskGrader()), policy.backend


def test_rl_rollouts_release_the_decode_caches(tmp_path: Any) -> None:
    """After `RLTrainer.collect` the static decoder holds no cache: the update gets the memory."""
    trainer, backend = _micro_trainer(tmp_path)
    calls: list[int] = []
    generate = backend.static.generate

    def counting(*args: Any, **kwargs: Any) -> Any:
        out = generate(*args, **kwargs)
        calls.append(len(backend.static._slots))
        return out

    backend.static.generate = counting
    rows, _ = trainer.collect(0)
    assert rows and calls and min(calls) >= 1  # slots were held while rolling out
    assert backend.static._slots == {}


def test_kept_decode_caches_serve_the_next_rollout_with_the_updated_weights(
    tmp_path: Any,
) -> None:
    """`rollout.keep_decode_cache`: the caches (and, on CUDA, graphs) survive the rollout and
    the update, and the next rollout samples from the updated weights: the prefixes held from
    the previous weights are not reused (the update's rollout log-prob gap stays ~0). One task,
    so the second rollout's prompts start as the first's did."""
    trainer, backend = _micro_trainer(tmp_path, "rollout.keep_decode_cache=true", tasks=1)
    rows, _ = trainer.collect(0)
    kept = dict(backend.static._slots)
    assert rows and kept  # not released
    first = trainer.update(rows)
    with torch.no_grad():  # a visible step (the micro update's advantages are ~0), in place
        gen = torch.Generator().manual_seed(0)
        for p in backend.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    rows, _ = trainer.collect(1)
    assert any(backend.static._slots.get(k) is v for k, v in kept.items())  # a slot reused
    second = trainer.update(rows)
    for stats in (first, second):
        gap = [v for k, v in stats.items() if k.endswith("rollout_logprob_diff")]
        assert gap and max(gap) < 1e-5
