"""PPO-clip policy loss with dual clip and an optional KL term, over masked (B, T) token tensors.

Shapes: B rows (one generation each, caller or simulator), T response tokens (right-padded).
`mask` (B, T) is 1 on the response tokens a row trains on and 0 on padding; masked positions may
hold any value (even inf or NaN): they are zeroed before use, so they change neither the loss nor
its gradient. Every variant (aggregation, KL estimator) is chosen from a table by name.

See docs/algorithm.md for the objective and how it relates to the reference (verl) code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from envace.algo.clip import check_clip
from envace.algo.kl import KLKind, kl_penalty
from envace.errors import ConfigError

__all__ = [
    "AggMode",
    "LossConfig",
    "advantages_to_tensor",
    "aggregate",
    "masked_mean",
    "policy_loss",
    "ppo_clip_loss",
]

AggMode = Literal["seq-mean-token-mean", "token-mean"]

# exp() of a log-ratio beyond +-20 overflows float16/bfloat16 ranges; verl clamps the same way.
_LOG_RATIO_CLAMP = 20.0


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of x over the positions where mask is nonzero (all of x, or along `dim`).

    mask is bool or float 0/1 (a float mask weighs positions), broadcastable to x. An empty
    selection gives 0, with the graph kept so backward still runs.
    """
    weights = mask.to(x.dtype)
    selected = torch.where(mask.bool(), x, torch.zeros_like(x)) * weights
    total = selected.sum() if dim is None else selected.sum(dim)
    count = weights.expand_as(x).sum() if dim is None else weights.expand_as(x).sum(dim)
    # Divide by 1 where nothing is selected: the numerator is 0 there, and a 0/0 would put NaN
    # into the backward pass even through torch.where.
    return total / torch.where(count > 0, count, torch.ones_like(count))


def _seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token mean per row, then mean over the rows that have at least one token (B, T) -> ()."""
    row_means = masked_mean(x, mask, dim=-1)  # (B,)
    return masked_mean(row_means, mask.to(x.dtype).sum(-1) > 0)


def _token_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over every unmasked token of the batch: long rows weigh more (B, T) -> ()."""
    return masked_mean(x, mask)


_AGGREGATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "seq-mean-token-mean": _seq_mean_token_mean,
    "token-mean": _token_mean,
}


def aggregate(x: torch.Tensor, mask: torch.Tensor, mode: AggMode) -> torch.Tensor:
    """Reduce a per-token (B, T) loss to a scalar with the named aggregation."""
    if mode not in _AGGREGATORS:
        raise ValueError(f"loss_agg_mode {mode!r} is unknown; use one of {get_args(AggMode)}")
    return _AGGREGATORS[mode](x, mask)


@dataclass(frozen=True)
class LossConfig:
    """Policy-loss settings; defaults are the reference run's.

    clip_low / clip_high: PPO clip range, the ratio is clipped to [1 - clip_low, 1 + clip_high].
    dual_clip: for negative advantages, the per-token loss is capped at dual_clip * |A| however
        large the ratio grows; must be > 1. None turns dual clip off.
    loss_agg_mode: "seq-mean-token-mean" (the reference's effective aggregation: each row's token
        mean, then the mean over rows) or "token-mean" (one mean over every token of the batch).
    kl_coef: weight of the KL-to-reference term; 0 turns it off (the reference default). When on,
        the reference uses 1e-4 and the trainer must pass ref_logprobs.
    kl_kind: KL estimator, see envace.algo.kl ("low_var_kl" when the reference turns KL on).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    loss_agg_mode: AggMode = "seq-mean-token-mean"
    kl_coef: float = 0.0
    kl_kind: KLKind = "low_var_kl"

    def __post_init__(self) -> None:
        check_clip(self.clip_low, self.clip_high, self.dual_clip)
        if self.loss_agg_mode not in _AGGREGATORS:
            raise ConfigError(
                f"loss_agg_mode={self.loss_agg_mode!r} is unknown; use one of {get_args(AggMode)}"
            )
        if not (math.isfinite(self.kl_coef) and self.kl_coef >= 0):
            raise ConfigError(f"kl_coef={self.kl_coef} must be >= 0 (0 turns the KL term off)")
        if self.kl_kind not in get_args(KLKind):
            raise ConfigError(f"kl_kind={self.kl_kind!r} is unknown; use one of {get_args(KLKind)}")


def advantages_to_tensor(
    advantages: Sequence[float | None],
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values (B,), scored (B,) bool) from per-row advantages; None (unscored) becomes 0.

    Multiply the token mask by `scored[:, None]` so unscored rows drop out of the loss.
    """
    values = torch.tensor([0.0 if a is None else a for a in advantages], dtype=dtype, device=device)
    scored = torch.tensor([a is not None for a in advantages], dtype=torch.bool, device=device)
    return values, scored


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = 3.0,
    agg: AggMode = "seq-mean-token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss (to minimise) with verl's dual clip, and its statistics.

    logprobs, old_logprobs, mask: (B, T); advantages: (B,) broadcast over tokens, or (B, T).
    Per token, with r = exp(logprobs - old_logprobs):
        l = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
        l = min(l, -A dual_clip)                     only where A < 0, when dual_clip is set
    Stats (token means over the mask): clip_frac (the clip bound is the active term),
    dual_clip_frac, approx_kl (mean old - new log-prob), ratio_mean, ratio_max, pg_loss, tokens.
    """
    check_clip(clip_low, clip_high, dual_clip)
    valid = _check_shapes(logprobs, old_logprobs, advantages, mask)
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    adv = _zero_masked(adv.expand_as(logprobs), valid)  # (B, T)
    log_ratio = _zero_masked(logprobs, valid) - _zero_masked(old_logprobs, valid)
    ratio = log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP).exp()  # (B, T)

    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    dual_active = torch.zeros_like(valid)
    if dual_clip is not None:
        cap = -adv * dual_clip
        negative = adv < 0
        dual_active = negative & (per_token > cap)
        per_token = torch.where(negative, torch.minimum(per_token, cap), per_token)

    loss = aggregate(per_token, mask, agg)
    stats = _ppo_stats(loss, ratio, log_ratio, clipped > unclipped, dual_active, valid)
    return loss, stats


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig | None = None,
    ref_logprobs: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss plus kl_coef * aggregated KL to the reference model, and stats.

    ref_logprobs (B, T) is required when config.kl_coef > 0. When given with kl_coef = 0 the KL
    is still measured and reported (stat `kl`), without entering the loss.
    """
    config = config or LossConfig()
    loss, stats = ppo_clip_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        clip_low=config.clip_low,
        clip_high=config.clip_high,
        dual_clip=config.dual_clip,
        agg=config.loss_agg_mode,
    )
    if config.kl_coef > 0 and ref_logprobs is None:
        raise ValueError(
            f"kl_coef={config.kl_coef} needs ref_logprobs (reference-model log-probs of the "
            "response tokens); compute them or set kl_coef to 0"
        )
    if ref_logprobs is not None:
        # Only build a graph for the KL when it enters the loss; otherwise it is just a metric.
        with torch.set_grad_enabled(torch.is_grad_enabled() and config.kl_coef > 0):
            kl_loss = _kl_term(logprobs, ref_logprobs, mask, config)
        stats["kl"] = kl_loss.detach().item()
        if config.kl_coef > 0:
            loss = loss + config.kl_coef * kl_loss
    stats["loss"] = loss.detach().item()
    return loss, stats


def _kl_term(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, config: LossConfig
) -> torch.Tensor:
    """Aggregated per-token KL to the reference, with the policy loss's aggregation."""
    if ref_logprobs.shape != logprobs.shape:
        raise ValueError(
            f"ref_logprobs has shape {tuple(ref_logprobs.shape)}, expected "
            f"{tuple(logprobs.shape)} (one value per response token)"
        )
    valid = mask.bool()
    kl = kl_penalty(
        _zero_masked(logprobs, valid), _zero_masked(ref_logprobs, valid), config.kl_kind
    )
    return aggregate(kl, mask, config.loss_agg_mode)


def _zero_masked(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """x with masked positions set to 0, so padding (even NaN) reaches neither loss nor grad."""
    return torch.where(valid, x, torch.zeros_like(x))


def _ppo_stats(
    loss: torch.Tensor,
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    clip_active: torch.Tensor,
    dual_active: torch.Tensor,
    valid: torch.Tensor,
) -> dict[str, float]:
    with torch.no_grad():
        tokens = int(valid.sum().item())
        ratio_max = ratio[valid].max().item() if tokens else 0.0
        return {
            "pg_loss": loss.item(),
            "clip_frac": masked_mean(clip_active.to(ratio.dtype), valid).item(),
            "dual_clip_frac": masked_mean(dual_active.to(ratio.dtype), valid).item(),
            "approx_kl": masked_mean(-log_ratio, valid).item(),
            "ratio_mean": masked_mean(ratio, valid).item(),
            "ratio_max": float(ratio_max),
            "tokens": float(tokens),
        }


def _check_shapes(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """Validate the (B, T) layout and return the boolean token mask."""
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("mask", mask)):
        if t.shape != shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if advantages.shape not in (shape[:1], shape):
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)}; expected ({shape[0]},) "
            f"(one per row) or {tuple(shape)} (one per token)"
        )
    return mask.bool()
