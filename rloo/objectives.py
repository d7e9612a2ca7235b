"""Pure tensor math for RLOO: masked statistics, KL estimators, leave-one-out
advantages and policy-gradient losses.

Shapes: N = num_prompts * k completions, T = completion length.
Completions are laid out prompt-major: rows p*k ... p*k+k-1 belong to prompt p.
"""

import math
from dataclasses import dataclass

import torch
from torch import Tensor

KL_ESTIMATORS = ("k1", "k2", "k3")


def _upcast(x: Tensor) -> Tensor:
    """Half / bf16 -> float32; float32 / float64 unchanged."""
    # bf16 has 8 mantissa bits: summing ~100 log-probs in it loses whole nats
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(values * mask) over `dim` (all entries if None).

    values: [...], mask: bool or float, broadcastable to values. Low-precision
    inputs are summed in float32.
    """
    values = _upcast(values)
    mask = mask.to(values.dtype)
    # where() as well as the product: padding may hold inf/nan and 0 * inf = nan
    masked = torch.where(mask != 0, values * mask, torch.zeros_like(values))
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(values * mask) / sum(mask) over `dim`; 0 where the mask is empty.

    values: [...], mask: bool or float, broadcastable to values.
    """
    total = masked_sum(values, mask, dim)
    count = torch.broadcast_to(mask, values.shape).to(total.dtype)
    count = count.sum() if dim is None else count.sum(dim)
    # a safe denominator (not where() on the quotient) keeps gradients finite too
    return total / torch.where(count > 0, count, torch.ones_like(count))


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance over all masked entries -> scalar.

    With unbiased=True applies Bessel's correction n/(n-1); skipped when n <= 1
    (the biased value, 0, is returned instead of dividing by zero).
    """
    mean = masked_mean(values, mask)
    var = masked_mean((_upcast(values) - mean) ** 2, mask)  # E[(v - mu)^2]
    if unbiased:
        n = torch.broadcast_to(mask, values.shape).to(var.dtype).sum()
        var = torch.where(n > 1, var * n / torch.clamp(n - 1, min=1), var)
    return var


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(values - mean) / sqrt(var + 1e-8) over masked entries; 0 at masked-out positions.

    values: [...], mask broadcastable -> same shape as values.
    shift_mean=False adds the mean back (only rescales).
    """
    values = _upcast(values)
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)  # z = (v - mu) / sigma
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))


def token_logprobs(logits: Tensor, token_ids: Tensor) -> Tensor:
    """log softmax(logits)[token] per position, computed in float32.

    logits: [N, T, V], token_ids: [N, T] -> [N, T]. logsumexp and a gather avoid a second [N, T, V] tensor.
    """
    logits = logits.float()  # bf16 logits lose ~2 decimal digits in log-softmax
    picked = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    return picked - logits.logsumexp(-1)  # log p(y_t) = z_y - log sum_v exp(z_v)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) per position, [N, T, V] -> [N, T], in float32."""
    logits = logits.float()
    log_z = logits.logsumexp(-1)
    probs = torch.softmax(logits, -1)
    return log_z - (probs * logits).sum(-1)  # H = log Z - sum_v p_v z_v


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


def reinforce_loss(
    advantages: Tensor,
    logprobs: Tensor,
    mask: Tensor,
    token_weights: Tensor | None = None,
    sequence_weights: Tensor | None = None,
) -> Tensor:
    """On-policy REINFORCE: mean_i(-A_i * sum_t logprob_{i,t}) -> scalar.

    advantages [N] (treated as constants), logprobs [N, T], mask [N, T]; optional detached importance
    weights: token_weights [N, T] inside the sum, sequence_weights [N] outside it.
    """
    if token_weights is not None:
        logprobs = _upcast(logprobs) * _upcast(token_weights.detach())
    seq_logprob = masked_sum(logprobs, mask, dim=1)  # log pi(y_i | x_i), summed in fp32
    objective = -_upcast(advantages.detach()) * seq_logprob  # L = -mean(A * log pi)
    if sequence_weights is not None:
        objective = objective * _upcast(sequence_weights.detach())
    return objective.mean()


@dataclass
class PolicyLossStats:
    """Diagnostics of a clipped policy loss; all detached scalar tensors."""

    clipfrac: Tensor  # fraction where the clipped term is active (gradient nulled)
    approxkl: Tensor  # mean of 0.5 * (log ratio)^2
    ratio_mean: Tensor
    ratio_min: Tensor
    ratio_max: Tensor


def _clipped_objective(adv: Tensor, ratio: Tensor, clip_range: float) -> tuple[Tensor, Tensor]:
    """Elementwise max(-A r, -A clip(r, 1-eps, 1+eps)) and the 'clipped term active' mask."""
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    # strict >: on ties the unclipped branch carries the gradient, so ratio == 1
    # reproduces the REINFORCE gradient exactly
    is_clipped = clipped > unclipped
    return torch.where(is_clipped, clipped, unclipped), is_clipped


def sequence_ppo_clip_loss(
    advantages: Tensor,
    logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    clip_range: float,
    length_normalized: bool = False,
    token_weights: Tensor | None = None,
    sequence_weights: Tensor | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """Sequence-level PPO-clip, one importance ratio per completion.

    advantages [N], logprobs / old_logprobs / mask [N, T] -> (scalar loss, stats).
    log_ratio_i = sum_t (logprob - old_logprob)      (length_normalized: mean_t, GSPO's exp(mean_t log r_t))
    ratio_i = exp(log_ratio_i);  L = mean_i w_i * max(-A_i ratio_i, -A_i clip(ratio_i, 1-eps, 1+eps)).
    token_weights [N, T] (detached) scale each token's share of the gradient, not the ratio's value:
    d ratio_i = ratio_i * sum_t w_t d logprob_t. sequence_weights [N] (detached) scale whole sequences.
    """
    # difference before summing: equal inputs give exactly 0, hence ratio exactly 1
    token_log_ratio = _upcast(logprobs) - _upcast(old_logprobs.detach())
    log_ratio = masked_sum(token_log_ratio, mask, dim=1)
    if length_normalized:
        log_ratio = log_ratio / mask.sum(1).clamp(min=1).to(log_ratio.dtype)  # mean_t log r_t
    ratio = torch.exp(log_ratio)  # r_i = pi(y_i) / pi_old(y_i)
    if token_weights is not None:
        # same value as ratio; gradient ratio * sum_t w_t d logprob_t (w enters only through the gradient)
        live = _upcast(logprobs) - _upcast(logprobs).detach()  # 0 in value, d logprob in gradient
        weighted = masked_sum(_upcast(token_weights.detach()) * live, mask, dim=1)
        if length_normalized:
            weighted = weighted / mask.sum(1).clamp(min=1).to(weighted.dtype)
        ratio = ratio.detach() * torch.exp(weighted)
    objective, is_clipped = _clipped_objective(_upcast(advantages.detach()), ratio, clip_range)
    if sequence_weights is not None:
        objective = objective * _upcast(sequence_weights.detach())
    with torch.no_grad():
        stats = PolicyLossStats(
            clipfrac=is_clipped.float().mean(),
            approxkl=(0.5 * log_ratio**2).mean(),  # E[(log r)^2 / 2]
            ratio_mean=ratio.mean(),
            ratio_min=ratio.min(),
            ratio_max=ratio.max(),
        )
    return objective.mean(), stats


def token_clip_fraction(
    advantages: Tensor, logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, clip_range: float
) -> Tensor:
    """The fraction of real tokens whose gradient a token-level PPO clip would null, for comparison with the
    sequence-level clip. advantages [N] (one per sequence, broadcast) or [N, T] -> scalar."""
    ratio = torch.exp(_upcast(logprobs.detach()) - _upcast(old_logprobs.detach()))
    adv = _upcast(advantages.detach())
    adv = adv[:, None].expand_as(ratio) if adv.dim() == 1 else adv
    _, is_clipped = _clipped_objective(adv, ratio, clip_range)
    return masked_mean(is_clipped.to(ratio.dtype), mask)


def token_ppo_clip_loss(
    advantages_per_token: Tensor,
    logprobs: Tensor,
    old_logprobs: Tensor,
    mask: Tensor,
    clip_range: float,
    token_weights: Tensor | None = None,
    sequence_weights: Tensor | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """Token-level PPO-clip (as in PPO), one ratio per token.

    advantages_per_token / logprobs / old_logprobs / mask [N, T] -> (scalar loss, stats).
    r_t = exp(logprob_t - old_logprob_t); L = masked_mean(w_t * max(-A r, -A clip(r))).
    token_weights [N, T] and sequence_weights [N] (detached, e.g. importance corrections) scale the objective.
    Stats are over real tokens only (ratio_min/max are +inf/-inf if the mask is empty).
    """
    real = mask.bool()
    log_ratio = _upcast(logprobs) - _upcast(old_logprobs.detach())
    # zero padding before exp: exp(huge) = inf there would turn 0-gradients into nan
    log_ratio = torch.where(real, log_ratio, torch.zeros_like(log_ratio))
    ratio = torch.exp(log_ratio)  # r_t = pi(y_t) / pi_old(y_t)
    objective, is_clipped = _clipped_objective(_upcast(advantages_per_token.detach()), ratio, clip_range)
    if token_weights is not None:
        objective = objective * _upcast(token_weights.detach())
    if sequence_weights is not None:
        objective = objective * _upcast(sequence_weights.detach())[:, None]
    loss = masked_mean(objective, mask)
    with torch.no_grad():
        inf = torch.tensor(float("inf"), dtype=ratio.dtype)
        stats = PolicyLossStats(
            clipfrac=masked_mean(is_clipped.to(ratio.dtype), mask),
            approxkl=masked_mean(0.5 * log_ratio**2, mask),  # E[(log r)^2 / 2]
            ratio_mean=masked_mean(ratio, mask),
            ratio_min=torch.where(real, ratio, inf).min(),
            ratio_max=torch.where(real, ratio, -inf).max(),
        )
    return loss, stats


# ---- PPO (the baseline RLOO is compared with): per-token rewards, GAE, clipped value loss ---------------------


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


# ---- rollout / training mismatch: diagnostics and importance-sampling corrections -------------------------------

IS_CORRECTIONS = ("none", "tis_token", "tis_sequence", "mask_token", "mask_sequence", "geometric")


def logprob_mismatch(train_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """How far the rollout-time log-probs are from the training forward's, over real tokens only.

    train_logprobs / rollout_logprobs / mask [N, T] -> scalars:
      abs_mean / abs_max            mean and max of |delta_t|, delta_t = log pi_train - log pi_rollout
      token_mult_prob_error         mean_t exp(|delta_t|)   (NeMo-RL's rule of thumb: look into it above 1.05)
      seq_log_ratio_mean/min/max    sum_t delta_t per sequence
    """
    real = mask.bool()
    delta = torch.where(real, _upcast(train_logprobs.detach()) - _upcast(rollout_logprobs.detach()), 0.0)
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
    real = mask.bool()
    log_rho = torch.where(real, _upcast(train_logprobs.detach()) - _upcast(rollout_logprobs.detach()), 0.0)
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
