"""The losses: the one clipped objective, the loss aggregations, the policy-gradient loss that every REINFORCE-family
estimator is a choice of (`LossForm`), DPO's pair loss, and PPO's clipped value loss.

Shapes: N = prompts * k completions, T = completion length; `mask` [N, T] is 1 on real completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.objectives.advantages import _groups
from rloo.objectives.statistics import _upcast, masked_mean, masked_sum, masked_var


# ---- the clip --------------------------------------------------------------------------------------------------
def clipped_terms(advantages: Tensor, ratio: Tensor, clip_low: float, clip_high: float) -> tuple[Tensor, Tensor]:
    """max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) elementwise and where the clipped term is active (its
    gradient nulled). Ties go to the unclipped term (strict >), so r == 1 gives the REINFORCE gradient exactly.
    No dual clip: veRL's default token loss also caps -A r at -A * clip_ratio_c (3) where A < 0; the papers of the
    GRPO family and TRL do not, and neither does this."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    active = clipped > unclipped
    return torch.where(active, clipped, unclipped), active


# ---- aggregation -----------------------------------------------------------------------------------------------
def aggregate(objective: Tensor, mask: Tensor, mode: str, constant: float | None = None) -> Tensor:
    """The scalar loss from per-token terms L_{i,t} [N, T] over real tokens (veRL's loss_agg_mode names):

    token_mean            sum_{i,t} L / sum_{i,t} 1                 every token weighs the same (DAPO)
    seq_mean_token_mean   mean_i ( sum_t L_{i,t} / |y_i| )          every sequence weighs the same (GRPO, GSPO)
    seq_mean_token_sum    mean_i sum_t L_{i,t}                      the sequence's log-prob summed (RLOO, the paper)
    token_sum_norm        sum_{i,t} L / (N * constant)              a constant, not the length (Dr. GRPO: the
                                                                    generation budget)

    An empty completion (no real token) counts as a 0 in the seq_mean_* means, as in TRL's GRPOTrainer; veRL's
    seq-mean modes leave it out of the count instead.
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
    raise ValueError(
        f"loss_aggregation {mode!r} is not token_mean, seq_mean_token_mean, seq_mean_token_sum or token_sum_norm"
    )


def aggregate_sequences(terms: Tensor, mask: Tensor, mode: str, constant: float | None = None) -> Tensor:
    """The scalar loss from one term per completion [N] (a sequence-level ratio): the seq_mean_* modes weigh every
    completion alike, mean_i L_i (within a completion the ratio already summed or averaged its tokens); token_mean
    and token_sum_norm weigh it by its length, as if its term stood on each of its tokens."""
    if mode in ("seq_mean_token_mean", "seq_mean_token_sum"):
        return terms.mean()
    return aggregate(terms[:, None].expand(-1, mask.shape[1]), mask, mode, constant)


def aggregation_share(mode: str, part_mask: Tensor, whole_mask: Tensor) -> float:
    """The weight of a micro-batch's aggregated loss in its mini-batch's: its share of the tokens for token_mean
    (so that the micro-batches' weighted token means add up to the mini-batch's), of the rows otherwise."""
    if mode == "token_mean":
        return float(part_mask.sum()) / max(float(whole_mask.sum()), 1.0)
    return part_mask.shape[0] / whole_mask.shape[0]


# ---- the policy-gradient loss -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LossForm:
    """How the policy-gradient loss is formed from advantages and log-probs (the keys of conf/algo/shared/estimator.yaml
    that shape it):

    loss            ppo_clip: max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) | reinforce: -A log pi (on-policy)
    ratio_level     token: r_t = pi(y_t) / pi_old(y_t) per token (GRPO, DAPO, PPO) | sequence: one r_i per completion
    sequence_ratio  sum: r_i = exp(sum_t log r_t) (RLOO) | mean: exp(mean_t log r_t) (GSPO)
    aggregation     over the terms (`aggregate`, `aggregate_sequences`); constant: token_sum_norm's denominator
    """

    loss: str = "ppo_clip"
    ratio_level: str = "sequence"
    sequence_ratio: str = "sum"
    clip_low: float = 0.2
    clip_high: float = 0.2
    aggregation: str = "seq_mean_token_sum"
    constant: float | None = None


def policy_gradient_loss(
    advantages: Tensor,
    logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    form: LossForm,
    token_weights: Tensor | None = None,
    sequence_weights: Tensor | None = None,
    token_penalty: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy loss of `form` and its statistics (detached scalars; `clipfrac`, `ratio`... with ppo_clip).

    advantages [N] (one per completion) or [N, T] (per token, token level only); logprobs (with gradient),
    old_logprobs, mask [N, T]. token_weights [N, T] and sequence_weights [N] are detached importance corrections:
    a token's share of the gradient, a whole sequence's weight. token_penalty [N, T] (with gradient; GRPO's
    beta * KL_t) is added to the per-token terms and aggregated with them.
    """
    if form.ratio_level == "sequence":
        terms, stats = _sequence_terms(advantages, logprobs, old_logprobs, mask, form, token_weights)
        if sequence_weights is not None:
            terms = terms * _upcast(sequence_weights.detach())
        loss = aggregate_sequences(terms, mask, form.aggregation, form.constant)
        if token_penalty is not None:
            loss = loss + aggregate(token_penalty, mask, form.aggregation, form.constant)
        return loss, stats
    terms, stats = _token_terms(advantages, logprobs, old_logprobs, mask, form)
    if token_weights is not None:
        terms = terms * _upcast(token_weights.detach())
    if sequence_weights is not None:
        terms = terms * _upcast(sequence_weights.detach())[:, None]
    if token_penalty is not None:
        terms = terms + token_penalty
    return aggregate(terms, mask, form.aggregation, form.constant), stats


def _sequence_terms(
    advantages: Tensor, logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, form: LossForm, token_weights
) -> tuple[Tensor, dict[str, Tensor]]:
    """One term per completion [N]: -A_i log pi(y_i) (reinforce) or the clip of r_i = exp(log r_i) (ppo_clip).
    token_weights scale each token's share of the gradient, not the ratio's value: d r_i = r_i sum_t w_t d log pi_t."""
    length = mask.sum(1).clamp(min=1)  # |y_i|

    def over_tokens(values: Tensor) -> Tensor:  # sum_t, or mean_t with sequence_ratio=mean
        total = masked_sum(values, mask, dim=1)
        return total / length.to(total.dtype) if form.sequence_ratio == "mean" else total

    adv = _upcast(advantages.detach())
    if form.loss == "reinforce":  # -A_i * sum_t w_t log pi(y_i,t)
        weighted = _upcast(logprobs) * _upcast(token_weights.detach()) if token_weights is not None else logprobs
        return -adv * over_tokens(weighted), {}
    # difference before summing: equal inputs give exactly 0, hence a ratio of exactly 1
    log_ratio = over_tokens(_upcast(logprobs) - _upcast(old_logprobs.detach()))  # log r_i
    ratio = torch.exp(log_ratio)  # r_i = pi(y_i) / pi_old(y_i)
    if token_weights is not None:  # the same value; the gradient r_i * sum_t w_t d log pi_t
        live = _upcast(logprobs) - _upcast(logprobs).detach()  # 0 in value, d log pi in gradient
        ratio = ratio.detach() * torch.exp(over_tokens(_upcast(token_weights.detach()) * live))
    terms, clipped = clipped_terms(adv, ratio, form.clip_low, form.clip_high)
    with torch.no_grad():
        token_ratio = torch.exp(_upcast(logprobs.detach()) - _upcast(old_logprobs.detach()))
        _, token_clipped = clipped_terms(
            adv[:, None].expand_as(token_ratio), token_ratio, form.clip_low, form.clip_high
        )
        stats = {
            "clipfrac": clipped.float().mean(),
            "approxkl": (0.5 * log_ratio**2).mean(),  # E[(log r)^2 / 2]
            "ratio": ratio.mean(),
            "ratio_min": ratio.min(),
            "ratio_max": ratio.max(),
            # what a token-level clip would null, for comparison
            "token_clipfrac": masked_mean(token_clipped.to(token_ratio.dtype), mask),
        }
    return terms, stats


def _token_terms(
    advantages: Tensor, logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, form: LossForm
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token terms [N, T]: -A_t log pi_t (reinforce) or the clip of r_t = exp(log pi_t - log pi_old,t)."""
    adv = _upcast(advantages.detach())
    adv = adv[:, None].expand(-1, mask.shape[1]) if adv.dim() == 1 else adv
    if form.loss == "reinforce":
        return -adv * _upcast(logprobs), {}
    real = mask.bool()
    # padding at log r = 0 before exp: exp(huge) = inf there would turn 0-gradients into nan
    log_ratio = torch.where(real, _upcast(logprobs) - _upcast(old_logprobs.detach()), 0.0)
    ratio = torch.exp(log_ratio)
    terms, clipped = clipped_terms(adv, ratio, form.clip_low, form.clip_high)
    with torch.no_grad():
        inf = torch.tensor(float("inf"), dtype=ratio.dtype, device=ratio.device)
        stats = {
            "clipfrac": masked_mean((clipped & real).to(ratio.dtype), mask),
            "approxkl": masked_mean(0.5 * log_ratio**2, mask),
            "ratio": masked_mean(ratio, mask),
            "ratio_min": torch.where(real, ratio, inf).min(),
            "ratio_max": torch.where(real, ratio, -inf).max(),
        }
    return terms, stats


# ---- DPO ---------------------------------------------------------------------------------------------------------
def preference_pairs(scores: Tensor, k: int) -> tuple[Tensor, Tensor, Tensor]:
    """Each prompt's k completions as one preference pair: the best by score chosen, the worst rejected (the first
    of equal ones). Returns the row indices of the chosen and the rejected [N/k], and whether the pair is decided
    [N/k]: its scores differ and all k are finite (a tie teaches no preference, a missing score none we can trust)."""
    groups = _groups(scores, k, min_k=2)  # [P, k]
    finite = torch.isfinite(groups)
    best = torch.where(finite, groups, -torch.inf).argmax(dim=1)  # [P]
    worst = torch.where(finite, groups, torch.inf).argmin(dim=1)  # [P]
    offsets = torch.arange(groups.shape[0], device=groups.device) * k
    high, low = groups.gather(1, best[:, None])[:, 0], groups.gather(1, worst[:, None])[:, 0]
    decided = finite.all(dim=1) & (high > low)
    return offsets + best, offsets + worst, decided


def dpo_loss(
    chosen_logprobs: Tensor,
    rejected_logprobs: Tensor,
    ref_chosen_logprobs: Tensor,
    ref_rejected_logprobs: Tensor,
    beta: float,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DPO (Rafailov et al. 2023) on sequence log-probs [P]: the implicit rewards r = beta * (log pi - log pi_ref) of
    the chosen and the rejected, and the loss mean_p w_p * -log sigmoid(r_chosen - r_rejected) (w: 1 or 0 per pair,
    so an undecided pair adds nothing but still counts in the mean). Returns the loss and its statistics."""
    chosen = beta * (_upcast(chosen_logprobs) - _upcast(ref_chosen_logprobs))
    rejected = beta * (_upcast(rejected_logprobs) - _upcast(ref_rejected_logprobs))
    margin = chosen - rejected
    losses = -torch.nn.functional.logsigmoid(margin)
    weights = torch.ones_like(losses) if weights is None else weights.to(losses.dtype)
    decided = weights.sum().clamp(min=1)
    stats = {
        "chosen_reward": (chosen * weights).sum() / decided,
        "rejected_reward": (rejected * weights).sum() / decided,
        "margin": (margin * weights).sum() / decided,
        "accuracy": ((margin > 0).to(losses.dtype) * weights).sum() / decided,
    }
    return (losses * weights).mean(), stats


# ---- PPO's value model ------------------------------------------------------------------------------------------
def clipped_value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, value_clip_range: float
) -> tuple[Tensor, Tensor]:
    """PPO's clipped value loss: 0.5 * masked_mean(max((V - G)^2, (V_clip - G)^2)).

    values / old_values / returns / mask [N, T] -> (scalar loss, fraction of tokens where the clipped term wins).
    V_clip = V_old + clip(V - V_old, -eps_v, eps_v): the value may not move further than eps_v per rollout.
    """
    values, old_values, returns = _upcast(values), _upcast(old_values.detach()), _upcast(returns.detach())
    clipped = old_values + torch.clamp(values - old_values, -value_clip_range, value_clip_range)
    unclipped_error, clipped_error = (values - returns) ** 2, (clipped - returns) ** 2
    loss = 0.5 * masked_mean(torch.maximum(unclipped_error, clipped_error), mask)
    clipfrac = masked_mean((clipped_error > unclipped_error).to(values.dtype), mask).detach()
    return loss, clipfrac


def explained_variance(predicted: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """1 - Var(target - predicted) / Var(target) over real tokens: 1 is perfect, 0 no better than a constant."""
    var_target = masked_var(target, mask, unbiased=False)
    var_error = masked_var(_upcast(target) - _upcast(predicted), mask, unbiased=False)
    return torch.where(var_target > 0, 1 - var_error / var_target.clamp(min=1e-12), torch.zeros_like(var_target))
