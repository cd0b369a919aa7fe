"""Collation, chunked log-probabilities and prefix packing, against plain full-logit maths."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from envace.train.batch import (
    TrainRow,
    collate,
    make_micro_batches,
    pack_prefix_rows,
    token_logprobs,
)


def _reference_logprobs(model: Any, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]  # (T, V)
    lp = logits.log_softmax(-1)[:-1].gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)
    return torch.nn.functional.pad(lp, (1, 0))  # (T,)


def test_chunked_logprobs_equal_full_logits(micro_model: Any) -> None:
    rows = [TrainRow([5, 6, 7], [8, 9]), TrainRow([10, 11], [12, 13, 14, 15])]
    mb = collate(rows, pad_id=0)
    with torch.no_grad():
        got = token_logprobs(micro_model, mb, chunk_tokens=2)  # several chunks
    for b, r in enumerate(rows):
        ids = r.prompt_ids + r.response_ids
        want = _reference_logprobs(micro_model, ids)
        mask = mb.response_mask[b, : len(ids)]
        assert torch.allclose(got[b, : len(ids)], want * mask, atol=1e-5)
        assert float(got[b, len(ids) :].abs().sum()) == 0.0
    assert mb.num_tokens == 6


def test_chunked_logprobs_gradients_flow(micro_model: Any) -> None:
    mb = collate([TrainRow([5, 6], [7, 8, 9])], pad_id=0)
    micro_model.zero_grad()
    token_logprobs(micro_model, mb, chunk_tokens=1).sum().backward()
    grads = [p.grad for p in micro_model.parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)
    micro_model.zero_grad()


def test_prefix_packing_trains_the_same_tokens(micro_model: Any) -> None:
    a = TrainRow([1, 2, 3], [4, 5])
    b = TrainRow([1, 2, 3, 4, 5, 6, 7], [8, 9])  # extends a's prompt + response
    c = TrainRow([20, 21], [22])  # unrelated: stays separate
    packed = pack_prefix_rows([a, b, c])
    assert len(packed) == 2 and packed[0].extra_spans == [(3, 5)]
    assert packed[0].num_trained == 4
    mb = collate(packed[:1], pad_id=0)
    with torch.no_grad():
        lp = token_logprobs(micro_model, mb)
    sep = [collate([r], 0) for r in (a, b)]
    with torch.no_grad():
        want = sum(float(token_logprobs(micro_model, m).sum()) for m in sep)
    assert abs(float(lp.sum()) - want) < 1e-4


def test_packing_keeps_each_spans_advantage_and_old_logprobs() -> None:
    """RL packing: a, b (extends a), c (a context reset: its prompt differs at position 1) and a
    simulator row d that extends b but is another role. a + b pack; c and d start new rows."""
    a = TrainRow([1, 2, 3], [4, 5], 0.5, [-0.1, -0.2])
    b = TrainRow([1, 2, 3, 4, 5, 6, 7], [8, 9], -1.0, [-0.3, -0.4])
    c = TrainRow([1, 9, 3], [4], 2.0, [-0.5])
    d = TrainRow([1, 2, 3, 4, 5, 6, 7, 8, 9], [10], 3.0, [-0.6], role="simulator")
    ab, c2, d2 = pack_prefix_rows([a, b, c, d])
    assert ab.spans == [(3, 5), (7, 9)] and ab.span_advantages == [0.5, -1.0]
    assert ab.old_logprobs == [-0.1, -0.2, -0.3, -0.4]  # position order: a's span, then b's
    assert c2 is c and d2 is d
    # One row of logprobs known only in part: the packed row's are unknown, not misaligned.
    partial = pack_prefix_rows([TrainRow([1, 2, 3], [4, 5], 0.5, []), b])[0]
    assert partial.old_logprobs is None and partial.span_advantages == [0.5, -1.0]


def test_the_generation_layout_puts_each_span_on_its_own_row() -> None:
    """Rows ab (packed: spans [3, 5) and [7, 9), width 9) and c (span [3, 4)) collate to
    (2, 9); the layout has 3 generations of at most 2 tokens, at flat positions b * 9 + t."""
    ab = pack_prefix_rows(
        [TrainRow([1, 2, 3], [4, 5], 0.5), TrainRow([1, 2, 3, 4, 5, 6, 7], [8, 9], -1.0)]
    )[0]
    mb = collate([ab, TrainRow([1, 9, 3], [4], None)], pad_id=0)
    g = mb.generations
    assert mb.num_generations == 3 and len(mb.rows) == 2
    assert g.index.tolist() == [[3, 4], [7, 8], [12, 0]]
    assert g.mask.tolist() == [[1, 1], [1, 1], [1, 0]]
    assert g.advantages.tolist() == [0.5, -1.0, 0.0]  # unscored: 0
    x = torch.arange(18.0).reshape(2, 9)
    assert (g.gather(x) * g.mask).tolist() == [[3, 4], [7, 8], [12, 0]]
    assert float(mb.response_mask.sum()) == float(g.mask.sum()) == 5


def test_micro_batches_are_length_sorted_and_bounded() -> None:
    rows = [TrainRow([1] * n, [2]) for n in (9, 1, 5, 3, 7)]
    mbs = make_micro_batches(rows, micro_batch_rows=2, pad_id=0)
    assert [len(m.rows) for m in mbs] == [2, 2, 1]
    assert [m.input_ids.shape[1] for m in mbs] == [4, 8, 10]
    capped = make_micro_batches(rows, micro_batch_rows=5, pad_id=0, max_tokens=16)
    assert all(m.input_ids.numel() <= 16 or len(m.rows) == 1 for m in capped)


# torch's compiler trips its own deprecation and .grad warnings while tracing; not ours to fix
@pytest.mark.filterwarnings("ignore:.*torch.jit.script_method.*:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf:UserWarning")
def test_compiled_head_chunk_gives_the_same_logprobs_and_gradients(micro_model: Any) -> None:
    """`compile_layers`' compiled LM-head chunk (inductor, here on CPU) against the eager chunk:
    same log-probs and same weight gradients, over chunks of unequal sizes."""
    from envace.train.batch import compiled_chunk_logprobs

    mb = collate([TrainRow([5, 6, 7], [8, 9, 10, 11]), TrainRow([12], [13, 14])], pad_id=0)
    weights = torch.tensor([[0.0, 1.0, -2.0, 0.5, 1.5, 0.0, 0.0], [0.0, 0.3, -1.0, 0, 0, 0, 0]])
    results = []
    for fn in (None, compiled_chunk_logprobs()):
        micro_model.zero_grad()
        kw = {} if fn is None else {"chunk_fn": fn}
        lp = token_logprobs(micro_model, mb, chunk_tokens=4, **kw)  # chunks of 4 and 1 tokens
        (lp * weights[:, : lp.shape[1]]).sum().backward()
        grads = {n: p.grad.clone() for n, p in micro_model.named_parameters() if p.grad is not None}
        results.append((lp.detach(), grads))
    (eager, g_eager), (compiled, g_compiled) = results
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    assert g_eager.keys() == g_compiled.keys() and g_eager
    for name, grad in g_eager.items():
        torch.testing.assert_close(g_compiled[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    micro_model.zero_grad()


def test_a_warm_start_token_budget_changes_the_padding_not_the_update(micro_model: Any) -> None:
    """`warm_start.micro_batch_tokens`: each step's random batch is split into length-sorted
    micro-batches under the budget (more forward passes, less padding) and accumulated into
    the same step: same losses and weights as one micro-batch per step."""
    import copy

    from envace.train.engine import TorchEngine
    from envace.train.sft import run_sft

    g = torch.Generator().manual_seed(0)
    rows = [
        TrainRow(
            torch.randint(3, 500, (int(n),), generator=g).tolist(),
            torch.randint(3, 500, (4 + int(n) % 5,), generator=g).tolist(),
        )
        for n in torch.randint(3, 40, (12,), generator=g)
    ]
    results = []
    for budget in (None, 48):
        model = copy.deepcopy(micro_model)
        engine = TorchEngine(model, 1e-2)
        forward = engine.logprobs
        calls = {"n": 0}

        def counting(mb: Any, forward: Any = forward, calls: Any = calls) -> Any:
            calls["n"] += 1
            return forward(mb)

        engine.logprobs = counting  # type: ignore[method-assign]
        stats = run_sft(
            engine,
            rows,
            epochs=2,
            batch_rows=6,
            pad_id=0,
            seed=1,
            progress=False,
            micro_batch_tokens=budget,
        )
        results.append((stats.losses, model.state_dict(), calls["n"]))
    (plain_losses, plain, plain_calls), (split_losses, split, split_calls) = results
    assert plain_calls == 4 and split_calls > 2 * plain_calls  # 4 steps of 6 rows
    assert split_losses == pytest.approx(plain_losses, abs=1e-5)
    for k, v in plain.items():
        torch.testing.assert_close(split[k], v, rtol=0, atol=1e-4)  # Adam: rounding in tiny grads
