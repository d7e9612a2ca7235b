"""Pure tensor math of the GRPO family on RLOO's rollout: group advantages, loss aggregation, the asymmetric clip at
token or sequence level, the k3 KL as a loss term, DAPO's overlong shaping and its dynamic-sampling filter.

Shapes: N = prompts * k completions (prompt-major: rows p*k .. p*k+k-1 share prompt p), T = completion length. A
per-token objective is [N, T]; `mask` [N, T] is 1 on real completion tokens. Which named algorithm uses which form
is in rloo/algorithms/grpo.py; the formulas as published are in the docstrings here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rloo.objectives import _groups, _upcast, leave_one_out_advantages, masked_mean, masked_sum

ADVANTAGES = ("leave_one_out", "group_mean", "group_std", "group_mean_batch_std", "return_to_go_batch_std")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "token_sum_norm")
RATIO_LEVELS = ("token", "sequence")
KL_PLACEMENTS = ("reward", "loss")
OVERLONG = ("none", "shape", "mask")


# ---- advantages -------------------------------------------------------------------------------------------------
def group_advantages(rewards: Tensor, k: int, form: str, std_eps: float = 1e-4) -> Tensor:
    """One advantage per completion from its group of k, [N] -> [N]:

    leave_one_out          A_i = R_i - mean_{j != i} R_j                      (RLOO; Kool et al. 2019)
    group_mean             A_i = R_i - mean_j R_j                             (Dr. GRPO, Liu et al. 2025)
    group_std              A_i = (R_i - mean_j R_j) / (std_j R_j + eps)       (GRPO, Shao et al. 2024; unbiased std)
    group_mean_batch_std   A_i = z-score over the batch of (R_i - mean_j R_j) (REINFORCE++-baseline, Hu 2025)
    """
    if form == "leave_one_out":
        return leave_one_out_advantages(rewards, k)
    groups = _groups(rewards, k, min_k=2)  # [P, k]
    centred = groups - groups.mean(dim=1, keepdim=True)  # R_i - mean of the group
    if form == "group_mean":
        return centred.reshape(-1)
    if form == "group_std":
        return (centred / (groups.std(dim=1, keepdim=True) + std_eps)).reshape(-1)
    if form == "group_mean_batch_std":
        flat = centred.reshape(-1)
        return (flat - flat.mean()) / (flat.std() + 1e-8)
    raise ValueError(f"advantage must be one of {', '.join(ADVANTAGES[:-1])} for a group form, got {form!r}")


def returns_to_go(token_rewards: Tensor, mask: Tensor) -> Tensor:
    """G_t = sum_{s >= t} r_s over real tokens (gamma = 1), 0 on padding. [N, T] -> [N, T]."""
    rewards = torch.where(mask.bool(), _upcast(token_rewards), torch.zeros_like(_upcast(token_rewards)))
    return torch.where(mask.bool(), rewards.flip(1).cumsum(1).flip(1), torch.zeros_like(rewards))


def batch_whitened_tokens(values: Tensor, mask: Tensor) -> Tensor:
    """(v - mean) / (std + 1e-8) over every real token of the batch (REINFORCE++'s global normalisation), 0 on
    padding; unbiased std. [N, T] -> [N, T]."""
    values, real = _upcast(values), mask.bool()
    n = real.sum().clamp(min=2)
    mean = masked_mean(values, mask)
    var = masked_sum((values - mean) ** 2, mask) / (n - 1)
    return torch.where(real, (values - mean) / (var.sqrt() + 1e-8), torch.zeros_like(values))


# ---- loss aggregation -------------------------------------------------------------------------------------------
def aggregate(objective: Tensor, mask: Tensor, mode: str, constant: float | None = None) -> Tensor:
    """The scalar loss from per-token terms L_{i,t} [N, T] over real tokens (veRL's loss_agg_mode names):

    token_mean            sum_{i,t} L / sum_{i,t} 1                 every token weighs the same (DAPO)
    seq_mean_token_mean   mean_i ( sum_t L_{i,t} / |y_i| )          every sequence weighs the same (GRPO, GSPO)
    seq_mean_token_sum    mean_i sum_t L_{i,t}                      the sequence's log-prob summed (RLOO, the paper)
    token_sum_norm        sum_{i,t} L / (N * constant)              a constant, not the length (Dr. GRPO: the
                                                                    generation budget)
    """
    if mode == "token_mean":
        return masked_mean(objective, mask)
    if mode == "seq_mean_token_mean":
        return masked_mean(objective, mask, dim=1).mean()
    if mode == "seq_mean_token_sum":
        return masked_sum(objective, mask, dim=1).mean()
    if mode == "token_sum_norm":
        if constant is None or constant <= 0:
            raise ValueError(f"token_sum_norm divides by a positive constant, got {constant!r}")
        return masked_sum(objective, mask) / (objective.shape[0] * constant)
    raise ValueError(f"loss_aggregation must be one of {', '.join(AGGREGATIONS)}, got {mode!r}")


def aggregation_share(mode: str, part_mask: Tensor, whole_mask: Tensor) -> float:
    """The weight of a micro-batch's aggregated loss in its mini-batch's: its share of the tokens for token_mean
    (so that the micro-batches' weighted token means add up to the mini-batch's), of the rows otherwise."""
    if mode == "token_mean":
        return float(part_mask.sum()) / max(float(whole_mask.sum()), 1.0)
    return part_mask.shape[0] / whole_mask.shape[0]


# ---- clipped objectives -----------------------------------------------------------------------------------------
def clipped_terms(advantages: Tensor, ratio: Tensor, clip_low: float, clip_high: float) -> tuple[Tensor, Tensor]:
    """max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) elementwise and where the clipped term is active (its
    gradient nulled). Ties go to the unclipped term, so r == 1 gives the REINFORCE gradient exactly."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    active = clipped > unclipped
    return torch.where(active, clipped, unclipped), active


def token_clipped_objective(
    advantages: Tensor, logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-token PPO-clip terms with one ratio per token, rho_t = exp(log pi_t - log pi_old,t) (GRPO, DAPO).

    advantages [N] (one per completion, broadcast) or [N, T]; the rest [N, T] -> (terms [N, T], clipped [N, T] bool,
    ratio [N, T]); padding holds ratio 1."""
    log_ratio = torch.where(mask.bool(), _upcast(logprobs) - _upcast(old_logprobs.detach()), 0.0)
    ratio = torch.exp(log_ratio)
    adv = _upcast(advantages.detach())
    adv = adv[:, None].expand_as(ratio) if adv.dim() == 1 else adv
    terms, active = clipped_terms(adv, ratio, clip_low, clip_high)
    return terms, active & mask.bool(), ratio


def sequence_clipped_objective(
    advantages: Tensor, logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """GSPO (Zheng et al. 2025): one length-normalised ratio per completion, s_i = exp(mean_t log rho_{i,t}), clipped
    at sequence level; its term max(-A_i s_i, -A_i clip(s_i)) is put on every real token of the completion, so that
    seq_mean_token_mean gives mean_i of it.

    advantages [N]; the rest [N, T] -> (terms [N, T], clipped [N] bool, s [N])."""
    log_ratio = masked_mean(_upcast(logprobs) - _upcast(old_logprobs.detach()), mask, dim=1)  # mean_t log rho
    ratio = torch.exp(log_ratio)
    terms, active = clipped_terms(_upcast(advantages.detach()), ratio, clip_low, clip_high)
    return terms[:, None].expand(-1, mask.shape[1]), active, ratio


def k3_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    """GRPO's KL term per token, with gradient: k3 = pi_ref/pi - log(pi_ref/pi) - 1 >= 0. [N, T] -> [N, T]."""
    log_ref_ratio = _upcast(ref_logprobs.detach()) - _upcast(logprobs)  # log(pi_ref / pi)
    return torch.expm1(log_ref_ratio) - log_ref_ratio


# ---- DAPO's sampling changes ------------------------------------------------------------------------------------
def overlong_penalty(lengths: Tensor, max_length: int, cache: int) -> Tensor:
    """DAPO's soft overlong punishment, added to the reward (Yu et al. 2025, eq. 13), [N] -> [N]:
    0 if |y| <= L_max - L_cache;  ((L_max - L_cache) - |y|) / L_cache up to L_max;  -1 beyond."""
    lengths = lengths.to(torch.float32)
    start = float(max_length - cache)
    ramp = (start - lengths) / cache
    return torch.where(lengths <= start, torch.zeros_like(lengths), torch.where(lengths <= max_length, ramp, -1.0))


def informative_groups(scores: Tensor, k: int) -> Tensor:
    """DAPO's dynamic-sampling filter: True for each prompt whose k scores are not all equal (accuracy strictly
    between 0 and 1); a group with a non-finite score counts as informative (the guard sees it). [N] -> [N/k]."""
    groups = _groups(scores, k, min_k=2)
    return ~(groups == groups[:, :1]).all(dim=1)
