"""PPO-clip loss, dual clip, aggregation and KL estimators on tiny hand-computed tensors."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from envace.algo import LossConfig
from envace.algo.kl import kl_penalty
from envace.algo.losses import (
    advantages_to_tensor,
    aggregate,
    masked_mean,
    policy_loss,
    ppo_clip_loss,
)
from envace.errors import ConfigError


def log_ratio_rows(*ratios: list[float]) -> torch.Tensor:
    """logprobs whose ratio to old_logprobs = 0 is the given numbers, one list per row."""
    return torch.log(torch.tensor(ratios, dtype=torch.float64))


def one_token(ratio: float, advantage: float, **clip: Any) -> float:
    lp = log_ratio_rows([ratio])
    adv = torch.tensor([advantage], dtype=torch.float64)
    loss, _ = ppo_clip_loss(lp, torch.zeros_like(lp), adv, torch.ones_like(lp), **clip)
    return float(loss)


def test_ratio_one_gives_minus_mean_advantage_exactly() -> None:
    # r = 1 everywhere: per-token loss = -A; rows A = .5 and -1.5, all tokens valid -> -(-.5) = .5
    lp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
    loss, stats = ppo_clip_loss(lp, lp.clone(), torch.tensor([0.5, -1.5]), torch.ones(2, 2))
    assert loss.item() == 0.5
    assert stats["clip_frac"] == 0.0 and stats["dual_clip_frac"] == 0.0
    assert stats["ratio_mean"] == 1.0 and stats["approx_kl"] == 0.0


@pytest.mark.parametrize(
    ("ratio", "advantage", "expected"),
    [
        (1.5, 1.0, -1.2),  # A > 0: max(-1.5, -1.2) -> clipped at 1 + .2
        (0.5, -1.0, 0.8),  # A < 0: max(.5, .8) -> clipped at 1 - .2 (dual cap 3 not reached)
        (0.5, 1.0, -0.5),  # A > 0, ratio fell: the unclipped term is the pessimistic one
        (1.5, -1.0, 1.5),  # A < 0, ratio grew: unclipped 1.5, below the dual cap 3
        (5.0, -1.0, 3.0),  # dual clip: max(5, 1.2) = 5, capped at c |A| = 3
        (5.0, -2.0, 6.0),  # dual clip scales with |A|: cap 3 * 2
        (5.0, 2.0, -2.4),  # no dual clip for A > 0: -2 * 1.2
    ],
)
def test_clip_cases(ratio: float, advantage: float, expected: float) -> None:
    assert one_token(ratio, advantage) == pytest.approx(expected)


def test_dual_clip_off_and_asymmetric_clip() -> None:
    assert one_token(5.0, -1.0, dual_clip=None) == pytest.approx(5.0)
    # clip_high .28 (asymmetric, "clip-higher"): ratio 1.5, A 1 -> -1.28
    assert one_token(1.5, 1.0, clip_high=0.28) == pytest.approx(-1.28)
    # clip_low .1: ratio .5, A -1 -> .9
    assert one_token(0.5, -1.0, clip_low=0.1) == pytest.approx(0.9)


def test_stats_on_a_mixed_batch() -> None:
    # row 0, A = +1: ratios 1.5 (clipped, -1.2), 1.0 (-1.0)         -> row mean -1.1
    # row 1, A = -1: ratios .5 (clipped, .8), 5 (dual-clipped, 3)   -> row mean 1.9
    # loss = (-1.1 + 1.9) / 2 = .4 ; clip active on 2 of 4 tokens, dual clip on 1 of 4
    lp = log_ratio_rows([1.5, 1.0], [0.5, 5.0])
    loss, stats = ppo_clip_loss(
        lp, torch.zeros_like(lp), torch.tensor([1.0, -1.0]), torch.ones(2, 2)
    )
    assert loss.item() == pytest.approx(0.4)
    assert stats["clip_frac"] == 0.5
    assert stats["dual_clip_frac"] == 0.25
    assert stats["ratio_mean"] == pytest.approx(2.0)
    assert stats["ratio_max"] == pytest.approx(5.0)
    # approx_kl = mean(old - new) = -mean(log r) = -(ln 1.5 + 0 + ln .5 + ln 5) / 4
    assert stats["approx_kl"] == pytest.approx(-(math.log(1.5 * 0.5 * 5.0)) / 4)
    assert stats["tokens"] == 4.0 and stats["pg_loss"] == pytest.approx(0.4)


def test_masked_tokens_change_nothing() -> None:
    # Row 1 has one real token; its padding holds garbage, even inf and NaN.
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([0.3, -0.7])
    old = torch.tensor([[-1.0, -1.2, -0.8], [-0.9, 0.0, 0.0]])
    clean = torch.tensor([[-0.9, -1.3, -0.7], [-1.0, 0.0, 0.0]], requires_grad=True)
    dirty = torch.tensor([[-0.9, -1.3, -0.7], [-1.0, 50.0, math.nan]], requires_grad=True)
    old_dirty = old.clone()
    old_dirty[1, 1:] = torch.tensor([-math.inf, 7.0])
    loss_clean, stats_clean = ppo_clip_loss(clean, old, adv, mask)
    loss_dirty, stats_dirty = ppo_clip_loss(dirty, old_dirty, adv, mask.bool())
    assert loss_dirty.item() == loss_clean.item()
    assert stats_dirty == stats_clean
    loss_clean.backward()
    loss_dirty.backward()
    assert dirty.grad is not None and clean.grad is not None
    assert torch.equal(dirty.grad, clean.grad)
    assert torch.all(dirty.grad[1, 1:] == 0)


def test_per_token_advantages_are_accepted() -> None:
    # ratio 1: loss = -mean over rows of token means of A = -((1 + 3) / 2 + (-2)) / 2 = 0
    lp = torch.zeros(2, 2)
    adv = torch.tensor([[1.0, 3.0], [-2.0, 100.0]])
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, _ = ppo_clip_loss(lp, lp, adv, mask)
    assert loss.item() == 0.0


def test_aggregations_differ_on_uneven_lengths() -> None:
    # row 0: tokens 1, 2, 3 (all valid); row 1: token 10 then padding
    x = torch.tensor([[1.0, 2.0, 3.0], [10.0, -5.0, -5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    # seq-mean-token-mean: row means 2 and 10 -> 6 ; token-mean: (1 + 2 + 3 + 10) / 4 = 4
    assert aggregate(x, mask, "seq-mean-token-mean").item() == 6.0
    assert aggregate(x, mask, "token-mean").item() == 4.0
    # The same shows in the loss: ratio 1, A = -x per token -> loss = aggregate(x)
    lp = torch.zeros(2, 3)
    assert ppo_clip_loss(lp, lp, -x, mask, agg="token-mean")[0].item() == 4.0
    assert ppo_clip_loss(lp, lp, -x, mask)[0].item() == 6.0


def test_fully_masked_rows_do_not_count_as_rows() -> None:
    # row 1 has no token (e.g. an unscored row masked by the trainer): the mean is over row 0 only
    x = torch.tensor([[1.0, 3.0], [100.0, 100.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    assert aggregate(x, mask, "seq-mean-token-mean").item() == 2.0
    assert masked_mean(x, torch.zeros(2, 2)).item() == 0.0


def test_masked_mean_along_a_dim_and_with_weights() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 0, 1], [0, 0, 0]])
    # row 0: (1 + 3) / 2 = 2 ; row 1: nothing selected -> 0
    assert masked_mean(x, mask, dim=-1).tolist() == [2.0, 0.0]
    # float weights: (1 * 1 + 3 * .5) / 1.5
    weights = torch.tensor([[1.0, 0.0, 0.5], [0.0, 0.0, 0.0]])
    assert masked_mean(x, weights).item() == pytest.approx(2.5 / 1.5)


def test_gradient_by_hand() -> None:
    # Two rows, ratio 1 (unclipped): dL/dlogprob = -A * r / (row tokens * rows).
    # row 0 has 2 tokens, A = 2: -2 / (2 * 2) = -.5 ; row 1 has 1 token, A = -1: 1 / (1 * 2) = .5
    lp = torch.zeros(2, 2, requires_grad=True)
    mask = torch.tensor([[1, 1], [1, 0]])
    loss, _ = ppo_clip_loss(lp, torch.zeros(2, 2), torch.tensor([2.0, -1.0]), mask)
    loss.backward()
    assert lp.grad is not None
    assert lp.grad.tolist() == [[-0.5, -0.5], [0.5, 0.0]]


def test_clipped_tokens_get_no_gradient() -> None:
    # ratio 1.5 with A > 0 and ratio 5 with A < 0 (dual cap) are both constant in logprobs
    lp = log_ratio_rows([1.5], [5.0]).requires_grad_(True)
    loss, _ = ppo_clip_loss(lp, torch.zeros_like(lp), torch.tensor([1.0, -1.0]), torch.ones(2, 1))
    loss.backward()
    assert lp.grad is not None and lp.grad.tolist() == [[0.0], [0.0]]


def test_autograd_gradcheck() -> None:
    # Ratios kept away from the clip kinks (0.8, 1.2, 3) where the loss is not differentiable.
    torch.manual_seed(0)
    ratios = torch.tensor([[0.9, 1.1, 2.0], [0.95, 1.05, 0.7]], dtype=torch.float64)
    lp = ratios.log().requires_grad_(True)
    ref = torch.randn(2, 3, dtype=torch.float64) * 0.1
    adv = torch.tensor([0.7, -1.3], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    config = LossConfig(kl_coef=0.5)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return policy_loss(x, torch.zeros_like(x), adv, mask, config, ref_logprobs=ref)[0]

    assert torch.autograd.gradcheck(fn, (lp,))


def test_kl_estimators_by_hand() -> None:
    lp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -2.0]], dtype=torch.float64)
    # delta = ref - lp = -.5, 0
    # low_var_kl: exp(-.5) + .5 - 1 = .10653..., 0 ; kl: .5, 0 ; mse: .125, 0
    k3 = kl_penalty(lp, ref, "low_var_kl")
    assert k3[0, 0].item() == pytest.approx(math.exp(-0.5) + 0.5 - 1)
    assert k3[0, 1].item() == 0.0
    assert kl_penalty(lp, ref, "kl").tolist() == [[0.5, 0.0]]
    assert kl_penalty(lp, ref, "mse").tolist() == [[0.125, 0.0]]
    assert kl_penalty(lp, lp, "low_var_kl").abs().max().item() == 0.0


def test_low_var_kl_is_clamped() -> None:
    # delta = 30 -> clamped to 20 -> exp(20) - 21 is huge -> clamped to 10
    assert kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0])).item() == 10.0


def test_policy_loss_adds_the_kl_term() -> None:
    # ratio 1, A = 1: pg = -1. KL (low_var_kl) per token: exp(-.5) + .5 - 1 on both tokens.
    lp = torch.tensor([[-1.0, -1.0]])
    ref = lp - 0.5
    adv = torch.tensor([1.0])
    mask = torch.ones(1, 2)
    k3 = math.exp(-0.5) + 0.5 - 1
    loss, stats = policy_loss(lp, lp, adv, mask, LossConfig(kl_coef=1e-4), ref_logprobs=ref)
    assert loss.item() == pytest.approx(-1.0 + 1e-4 * k3)
    assert stats["kl"] == pytest.approx(k3) and stats["loss"] == pytest.approx(loss.item())
    # KL off (the default): the KL is still measured when ref_logprobs is given, not added
    loss_off, stats_off = policy_loss(lp, lp, adv, mask, ref_logprobs=ref)
    assert loss_off.item() == -1.0 and stats_off["kl"] == pytest.approx(k3)
    # ... and leaves the gradient untouched: with A = 1 at ratio 1, dL/dlp = -1/2 per token
    lp_grad = lp.clone().requires_grad_(True)
    policy_loss(lp_grad, lp, adv, mask, ref_logprobs=ref)[0].backward()
    assert lp_grad.grad is not None and lp_grad.grad.tolist() == [[-0.5, -0.5]]
    assert "kl" not in policy_loss(lp, lp, adv, mask)[1]


def test_policy_loss_needs_ref_logprobs_when_kl_is_on() -> None:
    lp = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_loss(lp, lp, torch.ones(1), torch.ones(1, 1), LossConfig(kl_coef=1e-4))


def test_loss_config_defaults_are_the_reference() -> None:
    config = LossConfig()
    assert (config.clip_low, config.clip_high, config.dual_clip) == (0.2, 0.2, 3.0)
    assert config.loss_agg_mode == "seq-mean-token-mean"
    assert (config.kl_coef, config.kl_kind) == (0.0, "low_var_kl")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clip_low": 1.0}, "clip_low=1.0"),
        ({"clip_high": -0.1}, "clip_high=-0.1"),
        ({"dual_clip": 1.0}, "dual_clip=1.0 must be > 1"),
        ({"loss_agg_mode": "sum"}, "loss_agg_mode='sum' is unknown"),
        ({"kl_coef": -1.0}, "kl_coef=-1.0"),
        ({"kl_kind": "k9"}, "kl_kind='k9' is unknown"),
    ],
)
def test_loss_config_rejects_bad_values(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LossConfig(**kwargs)  # type: ignore[arg-type]


def test_bad_shapes_and_names_are_reported() -> None:
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"advantages has shape \(3,\)"):
        ppo_clip_loss(lp, lp, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"mask has shape \(2, 2\)"):
        ppo_clip_loss(lp, lp, torch.zeros(2), torch.ones(2, 2))
    with pytest.raises(ValueError, match="logprobs must be"):
        ppo_clip_loss(torch.zeros(3), torch.zeros(3), torch.zeros(3), torch.ones(3))
    with pytest.raises(ValueError, match="loss_agg_mode 'sum' is unknown"):
        aggregate(lp, torch.ones(2, 3), "sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="kl kind 'k9' is unknown"):
        kl_penalty(lp, lp, "k9")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="same shape"):
        kl_penalty(lp, torch.zeros(2, 2))
    with pytest.raises(ValueError, match=r"ref_logprobs has shape \(2, 2\)"):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), ref_logprobs=torch.zeros(2, 2))


def test_unscored_rows_drop_out_through_the_mask() -> None:
    # advantages [.5, None]: row 1 is masked; loss at ratio 1 = -.5, from row 0 only
    values, scored = advantages_to_tensor([0.5, None])
    assert values.tolist() == [0.5, 0.0] and scored.tolist() == [True, False]
    lp = torch.zeros(2, 2)
    mask = torch.ones(2, 2) * scored[:, None]
    assert ppo_clip_loss(lp, lp, values, mask)[0].item() == -0.5


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-3, 3, allow_nan=False), min_size=1, max_size=6),
    st.lists(st.integers(1, 4), min_size=6, max_size=6),
)
def test_on_policy_loss_is_minus_mean_advantage(
    advantages: list[float], lengths: list[int]
) -> None:
    # At ratio 1 nothing clips, so seq-mean-token-mean gives exactly -mean(A) over rows.
    rows = len(advantages)
    mask = torch.zeros(rows, 4, dtype=torch.float64)
    for i in range(rows):
        mask[i, : lengths[i]] = 1
    lp = torch.randn(rows, 4, dtype=torch.float64)
    adv = torch.tensor(advantages, dtype=torch.float64)
    loss, stats = ppo_clip_loss(lp, lp.clone(), adv, mask)
    assert loss.item() == pytest.approx(-sum(advantages) / rows, abs=1e-12)
    assert stats["clip_frac"] == 0.0
