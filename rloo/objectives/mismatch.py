"""The rollout / training mismatch: how far the sampler's log-probs are from the training forward's, and the
importance-sampling corrections (TIS, masking) that weigh the loss by pi_train / pi_rollout.

Shapes: N = prompts * k completions, T = completion length; `mask` [N, T] is 1 on real completion tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from rloo.objectives.statistics import _upcast, masked_mean

IS_CORRECTIONS = ("none", "tis_token", "tis_sequence", "mask_token", "mask_sequence", "geometric")


def log_ratios(train_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """`[N, T]`: the real tokens (bool), and log rho_t = log pi_train - log pi_rollout on them (detached), 0 off."""
    real = mask.bool()
    return real, torch.where(real, _upcast(train_logprobs.detach()) - _upcast(rollout_logprobs.detach()), 0.0)


def logprob_mismatch(train_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far the rollout-time log-probs are from the training forward's, over real tokens only.

    train_logprobs / rollout_logprobs / mask [N, T] -> scalars:
      abs_mean / abs_max            mean and max of |delta_t|, delta_t = log pi_train - log pi_rollout
      token_mult_prob_error         mean_t exp(|delta_t|)   (NeMo-RL's rule of thumb: look into it above 1.05)
      seq_log_ratio_mean/min/max    sum_t delta_t per sequence
    """
    real, delta = log_ratios(train_logprobs, rollout_logprobs, mask)
    seq = delta.sum(1)
    zero = torch.zeros((), dtype=delta.dtype, device=delta.device)
    return {
        "abs_mean": masked_mean(delta.abs(), mask),
        "abs_max": delta.abs().max() if real.any() else zero,
        "token_mult_prob_error": masked_mean(torch.exp(delta.abs()), mask),
        "seq_log_ratio_mean": seq.mean(),
        "seq_log_ratio_min": seq.min(),
        "seq_log_ratio_max": seq.max(),
    }


def importance_weights(
    train_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    correction: str,
    cap: float = 2.0,
    low: float = 0.5,
    high: float = 2.0,
) -> tuple[Tensor | None, Tensor | None]:
    """Corrections for sampling from pi_rollout while training pi_train: rho = pi_train / pi_rollout (detached).

    train_logprobs / rollout_logprobs / mask [N, T] -> (token_weights [N, T] or None, sequence_weights [N] or None):
      none           no weights
      tis_token      w_t = min(rho_t, cap)                     truncated IS per token (TIS)
      tis_sequence   w_i = min(prod_t rho_t, cap)              truncated IS per sequence
      mask_token     w_t = 1 if rho_t in [low, high] else 0    drop tokens (IcePop)
      mask_sequence  w_i = 1 if prod_t rho_t in [low, high]    drop sequences (MIS)
      geometric      w_i = 1 if (prod_t rho_t)^(1/T) in [low, high]   geometric-mean filter
    """
    if correction not in IS_CORRECTIONS:
        raise ValueError(f"is_correction must be one of {', '.join(IS_CORRECTIONS)}, got {correction!r}")
    if correction == "none":
        return None, None
    real, log_rho = log_ratios(train_logprobs, rollout_logprobs, mask)
    ones = real.to(log_rho.dtype)
    if correction == "tis_token":
        return torch.clamp(torch.exp(log_rho), max=cap) * ones, None  # min(rho_t, C)
    if correction == "mask_token":
        rho = torch.exp(log_rho)
        return ((rho >= low) & (rho <= high)).to(log_rho.dtype) * ones, None
    seq_log_rho = log_rho.sum(1)  # log prod_t rho_t
    if correction == "tis_sequence":
        return None, torch.exp(torch.clamp(seq_log_rho, max=math.log(cap)))  # min(prod rho, C), no overflow
    if correction == "geometric":
        seq_log_rho = seq_log_rho / real.sum(1).clamp(min=1)  # log of the geometric mean
    inside = (seq_log_rho >= math.log(low)) & (seq_log_rho <= math.log(high))
    return None, inside.to(log_rho.dtype)


def importance_ratio_stats(
    train_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    correction: str,
    cap: float = 2.0,
    low: float = 0.5,
    high: float = 2.0,
) -> dict[str, Tensor]:
    """The raw ratios `importance_weights` forms, before any truncation or mask, and the fraction it cut.

    train_logprobs / rollout_logprobs / mask [N, T] -> scalars (none for correction=none):
      ratio_mean / ratio_min / ratio_max   rho_t over real tokens (token corrections), or prod_t rho_t per sequence
                                           (sequence corrections; geometric: its per-token geometric mean)
      cut_frac                             tis_*: the fraction above cap (truncated); mask_* and geometric: outside
                                           [low, high] (masked); of tokens or of sequences as the correction counts
    """
    if correction == "none":
        return {}
    real, log_rho = log_ratios(train_logprobs, rollout_logprobs, mask)
    if correction.endswith("_token"):
        log_ratio = log_rho[real]  # [real tokens]
    else:
        log_ratio = log_rho.sum(1)  # [N] log prod_t rho_t
        if correction == "geometric":
            log_ratio = log_ratio / real.sum(1).clamp(min=1)
    ratio = torch.exp(log_ratio.double().clamp(-80.0, 80.0))  # finite in float32 too
    if not len(ratio):
        return {}
    if correction.startswith("tis"):
        cut = log_ratio > math.log(cap)
    else:
        cut = (log_ratio < math.log(low)) | (log_ratio > math.log(high))
    return {
        "ratio_mean": ratio.mean(),
        "ratio_min": ratio.min(),
        "ratio_max": ratio.max(),
        "cut_frac": cut.double().mean(),
    }
