"""What a completion earns before any baseline: the KL estimators against the reference, the sequence and per-token
rewards, and the score rules for completions that run out of room (the missing-EOS penalty, DAPO's overlong shaping).

Shapes: N = prompts * k completions, T = completion length; `mask` [N, T] is 1 on real completion tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rloo.objectives.statistics import _upcast, masked_sum

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_per_token(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k1") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi. [N, T] -> [N, T].

    log r = logprobs - ref_logprobs. Estimators (Schulman, "Approximating KL"):
      k1 = log r                      unbiased, can be negative
      k2 = (log r)^2 / 2              biased, >= 0
      k3 = exp(-log r) - 1 + log r    unbiased, >= 0
    Padding is not masked here; where both inputs are 0 every estimator is 0.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimator must be one of k1, k2, k3, got '{estimator}'")
    log_r = _upcast(logprobs) - _upcast(ref_logprobs)
    if estimator == "k1":
        return log_r
    if estimator == "k2":
        return 0.5 * log_r**2  # k2 = (log r)^2 / 2
    return torch.expm1(-log_r) + log_r  # k3 = (e^{-log r} - 1) + log r; expm1 keeps precision near 0


def sequence_rewards(scores: Tensor, kl: Tensor, mask: Tensor, kl_coef: float) -> Tensor:
    """R_i = score_i - kl_coef * sum_t KL_{i,t} over real tokens.

    scores [N], kl [N, T], mask [N, T] -> [N].
    """
    return _upcast(scores) - kl_coef * masked_sum(kl, mask, dim=1)  # R = s - beta * sum_t KL_t


def per_token_rewards(scores: Tensor, kl: Tensor, mask: Tensor, kl_coef: float) -> Tensor:
    """PPO's reward: -kl_coef * KL_t on every real token, plus the score on the last real token.

    scores [N], kl [N, T], mask [N, T] (real tokens a prefix of each row) -> [N, T], 0 on padding.
    """
    mask = mask.bool()
    rewards = torch.where(mask, -kl_coef * _upcast(kl), torch.zeros_like(_upcast(kl)))  # r_t = -beta KL_t
    last = (mask.sum(1) - 1).clamp(min=0)  # [N] last real token
    rows = torch.arange(rewards.shape[0], device=rewards.device)
    has_tokens = mask.any(1)
    rewards[rows, last] += torch.where(has_tokens, _upcast(scores), torch.zeros_like(_upcast(scores)))  # r_T += s
    return rewards


def apply_missing_eos_penalty(
    scores: Tensor, ended_with_eos: Tensor, penalty: float | None, replacement: float | None = None
) -> Tensor:
    """The score of a completion that never emitted EOS, penalised: `penalty` subtracted (TRL >= 0.11), or the score
    replaced by `replacement` (TRL 0.9-0.10's penalty_reward_value). A completion left unscored (nan) stays nan.

    scores [N], ended_with_eos [N] bool -> new [N] tensor; neither given (or penalty 0) -> copy.
    """
    truncated = ~ended_with_eos.bool()
    if replacement is not None:
        return torch.where(truncated & ~torch.isnan(scores), torch.full_like(scores, replacement), scores)
    if not penalty:
        return scores.clone()
    return scores - penalty * truncated.to(scores.dtype)


def overlong_penalty(lengths: Tensor, max_length: int, cache: float) -> Tensor:
    """DAPO's soft overlong punishment, added to the reward (Yu et al. 2025, eq. 13), [N] -> [N]:
    0 if |y| <= L_max - L_cache;  ((L_max - L_cache) - |y|) / L_cache up to L_max;  -1 beyond.
    L_cache (`cache`) may be a fraction of a token: the paper's is a fifth of L_max (4,096 of 20,480)."""
    lengths = lengths.to(torch.float32)
    start = float(max_length - cache)
    ramp = (start - lengths) / cache
    return torch.where(lengths <= start, torch.zeros_like(lengths), torch.where(lengths <= max_length, ramp, -1.0))
