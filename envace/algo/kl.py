"""Per-token KL estimators between the policy and a frozen reference model.

Each estimator takes log-probabilities of the sampled tokens under the policy (`logprobs`) and
under the reference (`ref_logprobs`), both (B, T), and returns a (B, T) tensor; the loss reduces it
with the same masked aggregation as the policy loss. With delta = ref_logprobs - logprobs:

    kl          k1 = -delta                   unbiased, high variance, can be negative
    mse         k2 = delta^2 / 2              biased, low variance, >= 0
    low_var_kl  k3 = exp(delta) - delta - 1   unbiased, low variance, >= 0 (Schulman's k3)

low_var_kl is what the reference turns on (coefficient 1e-4); like verl, delta is clamped to
[-20, 20] before exp and the result to [-10, 10], so one badly-off token cannot explode the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import torch

__all__ = ["KLKind", "kl_penalty"]

KLKind = Literal["low_var_kl", "kl", "mse"]

_DELTA_CLAMP = 20.0
_K3_CLAMP = 10.0


def _k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return logprobs - ref_logprobs


def _k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    return 0.5 * (logprobs - ref_logprobs).square()


def _k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    delta = (ref_logprobs - logprobs).clamp(-_DELTA_CLAMP, _DELTA_CLAMP)
    return (delta.exp() - delta - 1.0).clamp(-_K3_CLAMP, _K3_CLAMP)


_ESTIMATORS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "kl": _k1,
    "mse": _k2,
    "low_var_kl": _k3,
}


def kl_penalty(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kind: KLKind = "low_var_kl"
) -> torch.Tensor:
    """Per-token KL(policy || reference) estimate, same shape as the inputs."""
    if kind not in _ESTIMATORS:
        raise ValueError(f"kl kind {kind!r} is unknown; use one of {get_args(KLKind)}")
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)} and ref_logprobs {tuple(ref_logprobs.shape)} "
            "must have the same shape (one value per response token)"
        )
    return _ESTIMATORS[kind](logprobs, ref_logprobs)
