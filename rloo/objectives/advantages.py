"""Advantages: each completion's reward less a baseline (leave-one-out, the group forms of the GRPO family, a moving
average, none, the best of k), REINFORCE++'s per-token returns, and PPO's GAE. Which one a run uses is the
policy-gradient step's `advantage` key (conf/algo/shared/estimator.yaml).

Shapes: N = prompts * k completions, laid out prompt-major (rows p*k .. p*k+k-1 share prompt p), T = completion length.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from rloo.objectives.statistics import _upcast, masked_sum

GROUP_FORMS = ("leave_one_out", "group_mean", "group_std")


def _groups(rewards: Tensor, k: int, min_k: int) -> Tensor:
    """[N] -> [N/k, k] view, row p = the k completions of prompt p (prompt-major)."""
    if not isinstance(k, int) or k < min_k:
        raise ValueError(f"k (completions per prompt) must be an int >= {min_k}, got k={k!r}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if rewards.numel() % k != 0:
        raise ValueError(f"number of rewards N={rewards.numel()} is not divisible by k={k}")
    # reshape matches repeat_interleave: consecutive rows share a prompt
    return _upcast(rewards).reshape(-1, k)


def leave_one_out_advantages(rewards: Tensor, k: int) -> Tensor:
    """RLOO advantages: each completion's baseline is the mean of its k-1 siblings.

    rewards [N], N = num_prompts * k, prompt-major -> [N].
    b_i = (sum_j R_j - R_i) / (k - 1),  A_i = R_i - b_i  (= k/(k-1) * (R_i - mean)).
    """
    r = _groups(rewards, k, min_k=2)  # [P, k]
    baseline = (r.sum(dim=1, keepdim=True) - r) / (k - 1)  # b_i = (sum_j R_j - R_i)/(k-1)
    return (r - baseline).reshape(-1)  # A_i = R_i - b_i


def masked_leave_one_out_advantages(rewards: Tensor, k: int, valid: Tensor) -> Tensor:
    """Leave-one-out advantages over the valid completions of each group only; an invalid one gets A = 0.

    rewards [N] (any value where invalid), valid [N] bool -> [N]. With m valid in a group, a valid i has
    b_i = (sum_{j valid} R_j - R_i) / (m - 1); a group with fewer than 2 valid completions gets A = 0 throughout.
    """
    r, v = _groups(torch.where(valid, rewards, torch.zeros_like(rewards)), k, min_k=2), valid.reshape(-1, k)
    m = v.sum(dim=1, keepdim=True)  # valid completions per group
    baseline = (r.sum(dim=1, keepdim=True) - r) / (m - 1).clamp(min=1)  # b_i over the other valid ones
    return torch.where(v & (m >= 2), r - baseline, torch.zeros_like(r)).reshape(-1)


def group_advantages(rewards: Tensor, k: int, form: str, std_eps: float = 1e-4) -> Tensor:
    """One advantage per completion from its group of k, [N] -> [N]:

    leave_one_out          A_i = R_i - mean_{j != i} R_j                      (RLOO; Kool et al. 2019)
    group_mean             A_i = R_i - mean_j R_j                             (Dr. GRPO, Liu et al. 2025)
    group_std              A_i = (R_i - mean_j R_j) / (std_j R_j + eps)       (GRPO, Shao et al. 2024; unbiased std)

    REINFORCE++-baseline's group mean is the start of a per-token advantage: `batch_whitened_tokens`.
    """
    if form == "leave_one_out":
        return leave_one_out_advantages(rewards, k)
    groups = _groups(rewards, k, min_k=2)  # [P, k]
    centred = groups - groups.mean(dim=1, keepdim=True)  # R_i - mean of the group
    if form == "group_mean":
        return centred.reshape(-1)
    if form == "group_std":
        return (centred / (groups.std(dim=1, keepdim=True) + std_eps)).reshape(-1)
    raise ValueError(f"a group advantage is one of {', '.join(GROUP_FORMS)}, got {form!r}")


def sequence_advantages(
    rewards: Tensor,
    k: int,
    form: str,
    valid: Tensor | None = None,
    std_eps: float = 1e-4,
    baseline: float | None = None,
    ranking: Tensor | None = None,
) -> Tensor:
    """One advantage per completion for the policy-gradient step's `advantage` choice, [N] -> [N]:

    leave_one_out, group_mean, group_std   from its group of k (`group_advantages`)
    moving_average   A_i = R_i - b, b from earlier rollouts       (REINFORCE with a baseline; `baseline`)
    none             A_i = R_i                                    (vanilla policy gradient)
    best_of_k        A_i = k on the best of its group by `ranking`, else 0   (RAFT, Dong et al. 2023)

    `valid` [N] bool (reward_errors=mask, some completion unscored): an invalid completion gets A = 0 and leaves its
    group's baseline (leave-one-out over the valid ones; the group forms over the group with its rewards as 0).
    """
    if form == "leave_one_out":
        return (
            leave_one_out_advantages(rewards, k)
            if valid is None
            else masked_leave_one_out_advantages(rewards, k, valid)
        )
    if form in GROUP_FORMS:
        filled = rewards if valid is None else torch.where(valid, rewards, torch.zeros_like(rewards))
        advantages = group_advantages(filled, k, form, std_eps)
    elif form == "moving_average":
        advantages = moving_average_advantages(rewards, baseline)
    elif form == "none":
        advantages = _upcast(rewards)
    elif form == "best_of_k":
        advantages = best_of_k_advantages(rewards if ranking is None else ranking, k)
    else:
        raise ValueError(f"advantage {form!r} is not a per-completion form")
    return advantages if valid is None else torch.where(valid, advantages, torch.zeros_like(advantages))


def moving_average_advantages(rewards: Tensor, baseline: float | None) -> Tensor:
    """REINFORCE with a moving-average baseline: A_i = R_i - b, where b summarises earlier rollouts only (so it is
    independent of these samples); before any rollout (None) b = 0. [N] -> [N]."""
    return _upcast(rewards) - (0.0 if baseline is None else baseline)


def updated_moving_average(baseline: float | None, rollout_mean: float, decay: float) -> float:
    """b <- decay * b + (1 - decay) * mean R of the rollout just trained on; the first rollout's mean starts it."""
    return rollout_mean if baseline is None else decay * baseline + (1.0 - decay) * rollout_mean


def best_of_k_advantages(scores: Tensor, k: int) -> Tensor:
    """RAFT (Dong et al. 2023) as weights of the REINFORCE loss: k on the best completion of each prompt by score
    (the first of equal ones; a non-finite score never wins over a finite one), 0 on the others. The mean over all
    N rows of -A_i * sum_t log pi(y_i,t) is then the mean negative log-likelihood of the N/k best completions:
    fine-tuning on the best of k. [N] -> [N]."""
    groups = _groups(scores, k, min_k=2)  # [P, k]
    best = torch.nan_to_num(groups, nan=-torch.inf).argmax(dim=1)  # [P]
    weights = torch.zeros_like(groups)
    weights[torch.arange(groups.shape[0], device=groups.device), best] = float(k)
    return weights.reshape(-1)


def normalize_advantages(advantages: Tensor, eps: float = 1e-8) -> Tensor:
    """(A - mean) / (std + eps) over the whole batch. [N] -> [N]."""
    a = _upcast(advantages)
    if a.numel() < 2:  # unbiased std of one element is nan
        return a - a.mean()
    return (a - a.mean()) / (a.std() + eps)  # z = (A - mu) / (sigma + eps)


def group_reward_std(rewards: Tensor, k: int) -> Tensor:
    """Unbiased std of the rewards within each prompt's group. [N] -> [N/k].

    A zero std means every completion got the same reward: no learning signal.
    """
    return _groups(rewards, k, min_k=2).std(dim=1)


def informative_groups(scores: Tensor, k: int) -> Tensor:
    """DAPO's dynamic-sampling filter: True for each prompt whose k scores are not all equal (accuracy strictly
    between 0 and 1); a group with a non-finite score counts as informative (the guard sees it). [N] -> [N/k]."""
    groups = _groups(scores, k, min_k=2)
    return ~(groups == groups[:, :1]).all(dim=1)


def returns_to_go(token_rewards: Tensor, mask: Tensor) -> Tensor:
    """G_t = sum_{s >= t} r_s over real tokens (gamma = 1), 0 on padding. [N, T] -> [N, T]."""
    rewards = torch.where(mask.bool(), _upcast(token_rewards), torch.zeros_like(_upcast(token_rewards)))
    return torch.where(mask.bool(), rewards.flip(1).cumsum(1).flip(1), torch.zeros_like(rewards))


def batch_whitened_tokens(
    values: Tensor, mask: Tensor, all_reduce_sum: Callable[[Tensor], Tensor] | None = None
) -> Tensor:
    """(v - mean) / sqrt(var) over every real token of the batch, 0 on padding, [N, T] -> [N, T]: REINFORCE++'s and
    REINFORCE++-baseline's normalisation as their authors' code runs it (OpenRLHF's experience maker): the variance
    divides by the token count n (no Bessel correction; veRL's `masked_whiten` divides by n - 1) and is clamped at
    1e-8 before the inverse square root. Under data parallelism `all_reduce_sum` sums a tensor over the ranks, so the
    mean and variance are the global batch's (TRL and veRL whiten over the global batch too):
        n = sum_ranks sum_t m_t,  mean = sum_ranks sum_t m_t v_t / n,  var = sum_ranks sum_t m_t (v_t - mean)^2 / n
    """
    values, real = _upcast(values), mask.bool()
    reduce = all_reduce_sum or (lambda tensor: tensor)
    count_and_sum = reduce(torch.stack([real.sum().to(values.dtype), masked_sum(values, mask)]))
    mean = count_and_sum[1] / count_and_sum[0].clamp(min=1)
    var = reduce(masked_sum((values - mean) ** 2, mask)) / count_and_sum[0].clamp(min=1)
    return torch.where(real, (values - mean) * var.clamp(min=1e-8).rsqrt(), torch.zeros_like(values))


def gae_advantages(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float = 1.0, lam: float = 0.95
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over each completion.

    rewards / values / mask [N, T] -> (advantages [N, T], returns [N, T]), both 0 on padding.
      delta_t = r_t + gamma * V_{t+1} - V_t           (V past the last real token is 0: the episode ends)
      A_t     = delta_t + gamma * lam * A_{t+1}
      G_t     = A_t + V_t                             (the value target)
    """
    mask = mask.to(torch.float32)
    rewards, values = _upcast(rewards) * mask, _upcast(values) * mask
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])
    next_advantage = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # TD error
        advantages[:, t] = (delta + gamma * lam * next_advantage) * mask[:, t]
        next_value, next_advantage = values[:, t], advantages[:, t]  # both 0 on padding
    return advantages, (advantages + values) * mask
