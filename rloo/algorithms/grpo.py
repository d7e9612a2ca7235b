"""The GRPO family on RLOO's rollout (algo=grpo | dr_grpo | dapo | reinforce_pp | gspo, or any mix of the choices
below): one step, read top to bottom.

    1. rollout    : k completions per prompt, reference log-probs, scores                      (rloo/rollout.py)
                    dynamic_sampling: groups whose k scores are all equal are dropped and fresh prompts sampled in
                    their place, up to dynamic_sampling_rounds extra rounds                              (DAPO)
    2. reward     : R_i = score_i + overlong_i (overlong=shape, DAPO) - beta * sum_t KL_t (kl_in=reward only)
    3. advantage  : from the group of k (advantage=leave_one_out | group_mean | group_std | group_mean_batch_std), or
                    per token (return_to_go_batch_std, REINFORCE++: r_t = -beta KL_t + score on the last token,
                    G_t = sum_{s>=t} r_s, z-scored over the batch's tokens)
    4. loss       : per-token terms max(-A rho, -A clip(rho, 1 - clip_range, 1 + clip_range_high)), rho per token
                    (ratio_level=token) or s_i = exp(mean_t log rho) per completion (sequence, GSPO); plus
                    beta * k3_t with kl_in=loss (GRPO); truncated completions masked out with overlong=mask;
                    aggregated by loss_aggregation (rloo.estimators.aggregate)
    5. step       : num_ppo_epochs x num_mini_batches optimiser steps, as every algorithm here

The named algorithms are configs over these choices (conf/algo/<name>.yaml cites each paper):

| algo=        | advantage              | loss_aggregation    | ratio    | clip low / high | KL                 |
|--------------|------------------------|---------------------|----------|-----------------|--------------------|
| grpo         | group_std              | seq_mean_token_mean | token    | 0.2 / 0.2       | loss, k3, 0.04     |
| dr_grpo      | group_mean             | token_sum_norm      | token    | 0.2 / 0.2       | loss, k3, 0.04     |
| dapo         | group_std              | token_mean          | token    | 0.2 / 0.28      | none (*)           |
| reinforce_pp | return_to_go_batch_std | token_mean          | token    | 0.2 / 0.2       | reward, k1, 0.05   |
| gspo         | group_std              | seq_mean_token_mean | sequence | 3e-4 / 4e-4     | none               |
| (rloo)       | leave_one_out          | seq_mean_token_sum  | sequence (summed) | 0.2    | reward, k1         |

(*) and dynamic sampling, overlong shaping, no missing-EOS penalty.

With one update per rollout (the default schedule) every ratio is exactly 1 and no clip acts; the clip variants
differ once a rollout is reused (num_mini_batches or num_ppo_epochs > 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.algorithms.base import OnlineRLModule, PolicyGradientConfig
from rloo.algorithms.metrics import METRIC_NAMES, StepStats, common_metrics, log_metrics
from rloo.estimators import (
    ADVANTAGES,
    AGGREGATIONS,
    KL_PLACEMENTS,
    OVERLONG,
    RATIO_LEVELS,
    aggregate,
    aggregation_share,
    batch_whitened_tokens,
    group_advantages,
    informative_groups,
    k3_kl,
    overlong_penalty,
    returns_to_go,
    sequence_clipped_objective,
    token_clipped_objective,
)
from rloo.keys import APPLIED, FIXED, key
from rloo.objectives import (
    group_reward_std,
    kl_per_token,
    masked_leave_one_out_advantages,
    masked_mean,
    normalize_advantages,
    per_token_rewards,
)
from rloo.rollout import PhaseTimer, Rollout, clock, concatenate


@dataclass(frozen=True)
class GroupConfig(PolicyGradientConfig):
    """The keys of conf/algo/shared/group.yaml (documented there) on top of the policy-gradient ones; clip_range is
    the lower clip (TRL's epsilon), clip_range_high the upper (epsilon_high)."""

    advantage: str = key(FIXED, choices=ADVANTAGES)
    std_eps: float = key(FIXED, low=0, low_open=True)
    loss_aggregation: str = key(FIXED, choices=AGGREGATIONS)
    aggregation_constant: float | None = key(FIXED, low=0, low_open=True)
    ratio_level: str = key(FIXED, choices=RATIO_LEVELS)
    clip_range_high: float | None = key(APPLIED, low=0, low_open=True)
    kl_in: str = key(FIXED, choices=KL_PLACEMENTS)
    dynamic_sampling: bool = key(FIXED)
    dynamic_sampling_rounds: int = key(APPLIED, low=0)
    overlong: str = key(FIXED, choices=OVERLONG)
    overlong_cache: int = key(FIXED, low=1)

    @property
    def clip_high(self) -> float:
        return self.clip_range if self.clip_range_high is None else self.clip_range_high

    @property
    def kl_in_loss(self) -> bool:
        return self.kl_in == "loss" and self.kl_coef > 0

    @property
    def kl_in_reward(self) -> bool:
        return self.kl_in == "reward" and self.kl_coef > 0

    @property
    def per_token_advantage(self) -> bool:
        return self.advantage == "return_to_go_batch_std"

    @property
    def batch_wide_advantage(self) -> bool:
        """The advantage of a row depends on rows outside its group (a whitening over the batch)."""
        return self.advantage.endswith("batch_std") or self.normalize_advantages


@dataclass
class GroupTargets:
    """What the step derives from a rollout: the KL, the rewards and the advantages (per token, [N, T])."""

    kl: Tensor  # [N] sum_t KL_t at the rollout policy
    rewards: Tensor  # [N] R_i (the score-side reward before any per-token split)
    advantages: Tensor  # [N, T]; a completion's advantage on each of its tokens for the group forms

    def sequence_advantages(self, completion_mask: Tensor) -> Tensor:
        return masked_mean(self.advantages, completion_mask, dim=1)  # [N]: the mean over each completion's tokens

    def assign(self, index: Tensor, part: "GroupTargets") -> None:
        self.kl[index], self.rewards[index], self.advantages[index] = part.kl, part.rewards, part.advantages


class GroupModule(OnlineRLModule):
    """Holds the policy, the frozen reference and reward model; `training_step` is one step of the GRPO family."""

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        cfg, timer, started = self.config, PhaseTimer(), clock()

        # 1. rollout (DAPO: groups without a learning signal replaced by fresh prompts' groups)        [N = P * k]
        rollout, sampling_stats = self.collect(batch, timer), {}
        if cfg.dynamic_sampling:
            rollout, sampling_stats = self.keep_informative_groups(rollout, timer)
        if not self.scores_are_finite(rollout) and not self.masks_bad_scores():
            return self.skip_rollout(rollout, timer, started)

        # 2-5. R, A, loss, optimiser steps. Group advantages without the policy's KL come from the scores alone;
        # otherwise A needs log pi of the sampling policy: the update's own forward where it is used once and every
        # micro-batch holds whole groups, else a forward first
        if self.update_gives_rollout_logprobs():
            rollout_done = clock()
            targets, rollout_policy_logprobs, entropy, stats = self.update(rollout, None, None, None)
        else:
            with timer("old_logprobs"):
                rollout_policy_logprobs, entropy = self.rollout_policy_forward(rollout)
            old = rollout.generation_logprobs if cfg.old_logprobs == "generation" else rollout_policy_logprobs
            rollout_done = clock()
            targets = self.rewards_and_advantages(rollout, old)
            _, _, _, stats = self.update(rollout, targets, old, rollout_policy_logprobs)

        self.finish_step(rollout, targets, timer, started, rollout_done)
        diagnostics = self.rollout_diagnostics(rollout, rollout_policy_logprobs, entropy)
        self.log_step(rollout, targets, stats.means() | diagnostics, sampling_stats)

    def update_gives_rollout_logprobs(self) -> bool:
        cfg = self.config
        return not cfg.reuses_rollout and cfg.old_logprobs == "recompute" and not cfg.batch_wide_advantage

    def update(
        self, rollout: Rollout, targets: GroupTargets | None, old: Tensor | None, rollout_policy_logprobs: Tensor | None
    ) -> tuple[GroupTargets, Tensor, Tensor, StepStats]:
        """Every micro-batch of the update (5.). Without `targets` (one update per rollout) each micro-batch's
        forward is the rollout policy's: R and A come from it (2-3), in order, whole groups at a time."""
        on_policy = targets is None
        n, mask = len(rollout), self.loss_mask(rollout)
        if on_policy:
            rollout_policy_logprobs = torch.zeros_like(rollout.ref_logprobs, dtype=torch.float32)  # [N, T]
            entropy = torch.zeros_like(rollout_policy_logprobs)
            zeros = torch.zeros(n, device=self.device, dtype=torch.float32)  # not the default dtype (bf16-true)
            targets = GroupTargets(zeros, zeros.clone(), torch.zeros_like(rollout_policy_logprobs))
        stats = StepStats()
        for micro in self.update_micro_batches(n, shuffle=not on_policy, epochs=1 if on_policy else None):
            index, part = micro.index, rollout.select(micro.index)
            logprobs, part_entropy = self.policy_forward(part, with_entropy=on_policy)  # [n, T]
            if on_policy:
                rollout_policy_logprobs[index], entropy[index] = logprobs.detach().float(), part_entropy.float()
                targets.assign(index, self.rewards_and_advantages(part, logprobs.detach()))  # 2-3. R, A
                old_part = logprobs.detach()
            else:
                old_part = old[index]
            loss, loss_stats = self.policy_loss(
                part, mask[index], targets.advantages[index], logprobs, old_part, rollout_policy_logprobs[index]
            )  # 4. loss
            share = aggregation_share(self.config.loss_aggregation, mask[index], mask[micro.mini_batch])
            self.accumulate_gradients(loss, micro, share)
            stats.add({"loss": loss, **loss_stats}, len(index))
        return targets, rollout_policy_logprobs if on_policy else None, entropy if on_policy else None, stats

    # ---- 1. DAPO's dynamic sampling -------------------------------------------------------------------------------
    def keep_informative_groups(self, rollout: Rollout, timer: PhaseTimer) -> tuple[Rollout, dict]:
        """Drop the groups whose k scores are all equal and sample fresh prompts' groups until the rollout is full
        again, at most dynamic_sampling_rounds more times; still short, it is filled with dropped groups (equal
        scores: no signal from the group itself). The extra prompts are drawn by the data module, from the seed and
        this rollout's number (a resumed run draws the same). Returns the full rollout and its metrics."""
        cfg, k = self.config, self.config.k
        prompts = len(rollout) // k
        kept, dropped, sampled_groups, rounds = [], [], 0, 0
        candidate = rollout
        while True:
            sampled_groups += len(candidate) // k
            informative = informative_groups(self.penalised_scores(candidate), k)  # [groups]
            rows = informative.repeat_interleave(k)
            kept += [candidate.select(rows)] if rows.any() else []
            dropped += [candidate.select(~rows)] if (~rows).any() else []
            have = sum(len(part) for part in kept) // k
            if have >= prompts or rounds >= cfg.dynamic_sampling_rounds:
                break
            rounds += 1
            extra = self.trainer.datamodule.extra_prompts(prompts, self.state.rollouts, rounds)
            candidate = self.collect({key: _to(value, self.device) for key, value in extra.items()}, timer)
        full = concatenate(kept + dropped, self.tokenizer.pad_token_id).select(slice(0, prompts * k))
        return full, {
            "dynamic_sampling/dropped_groups": float(sampled_groups - have),
            "dynamic_sampling/rounds": float(rounds),
            "dynamic_sampling/filled_with_dropped": float(max(prompts - have, 0)),
            "dynamic_sampling/sampled_completions": float(sampled_groups * k),
        }

    # ---- 2-3. rewards and advantages --------------------------------------------------------------------------
    def rewards_and_advantages(self, rollout: Rollout, logprobs: Tensor) -> GroupTargets:
        """R and A of whole prompt groups (the whole rollout for the batch-wide forms) from log pi of the policy
        that sampled."""
        cfg, mask = self.config, rollout.completion_mask
        kl_tokens = kl_per_token(logprobs, rollout.ref_logprobs, cfg.kl_estimator) * mask  # KL_t, 0 on padding
        scores = self.shaped_scores(rollout)
        beta = cfg.kl_coef if cfg.kl_in_reward else 0.0
        if cfg.per_token_advantage:  # REINFORCE++: r_t = -beta KL_t (+ score at the last token), G_t, batch z-score
            token_rewards = per_token_rewards(torch.nan_to_num(scores), kl_tokens, mask, beta)
            advantages = batch_whitened_tokens(returns_to_go(token_rewards, mask), mask)
            rewards = scores - beta * kl_tokens.sum(1)
        else:
            rewards = scores - beta * kl_tokens.sum(1)  # R_i
            advantages = self.group_advantages(rewards, scores)
            if cfg.normalize_advantages:
                advantages = normalize_advantages(advantages)
            advantages = advantages[:, None] * mask  # the completion's A on each of its tokens
        return GroupTargets(kl_tokens.sum(1), rewards, advantages)

    def shaped_scores(self, rollout: Rollout) -> Tensor:
        """The scores after the missing-EOS rule and DAPO's overlong shaping (overlong=shape), [N]."""
        cfg, scores = self.config, self.penalised_scores(rollout)
        if cfg.overlong == "shape":
            scores = scores + overlong_penalty(rollout.lengths, cfg.sampling.max_new_tokens, cfg.overlong_cache)
        return scores

    def group_advantages(self, rewards: Tensor, scores: Tensor) -> Tensor:
        cfg = self.config
        if self.masks_bad_scores() and not torch.isfinite(scores).all():  # reward_errors=mask: unscored sit out
            if cfg.advantage != "leave_one_out":
                valid = torch.isfinite(scores)
                filled = torch.where(valid, rewards, torch.zeros_like(rewards))
                advantages = group_advantages(filled, cfg.k, cfg.advantage, cfg.std_eps)
                return torch.where(valid, advantages, torch.zeros_like(advantages))
            return masked_leave_one_out_advantages(rewards, cfg.k, torch.isfinite(scores))
        return group_advantages(rewards, cfg.k, cfg.advantage, cfg.std_eps)

    # ---- 4. the loss ----------------------------------------------------------------------------------------
    def loss_mask(self, rollout: Rollout) -> Tensor:
        """The tokens the loss counts: the real ones, less truncated completions with overlong=mask (DAPO)."""
        mask = rollout.completion_mask
        if self.config.overlong == "mask":
            mask = mask * rollout.ended_with_eos[:, None].to(mask.dtype)
        return mask

    def policy_loss(
        self,
        part: Rollout,
        mask: Tensor,
        advantages: Tensor,
        logprobs: Tensor,
        old_logprobs: Tensor,
        rollout_policy_logprobs: Tensor,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        cfg = self.config
        token_w, sequence_w, is_stats = self.correction_weights(part, rollout_policy_logprobs)
        if cfg.ratio_level == "sequence":
            terms, clipped, ratio = sequence_clipped_objective(
                advantages[:, 0] if advantages.dim() == 2 else advantages,
                logprobs,
                old_logprobs,
                mask,
                cfg.clip_range,
                cfg.clip_high,
            )
            clipfrac = clipped.float().mean()
        else:
            terms, clipped, ratio = token_clipped_objective(
                advantages, logprobs, old_logprobs, mask, cfg.clip_range, cfg.clip_high
            )
            clipfrac = masked_mean(clipped.float(), mask)
        if token_w is not None:
            terms = terms * token_w
        if sequence_w is not None:
            terms = terms * sequence_w[:, None]
        mean_ratio = ratio.mean() if cfg.ratio_level == "sequence" else masked_mean(ratio, mask)
        stats = {"clipfrac": clipfrac, "ratio": mean_ratio}
        if cfg.kl_in_loss:  # GRPO: + beta * k3_t, aggregated with the policy terms
            kl_terms = k3_kl(logprobs, part.ref_logprobs)
            terms = terms + cfg.kl_coef * kl_terms
            stats["kl_loss"] = masked_mean(kl_terms.detach(), mask)
        constant = cfg.aggregation_constant or cfg.sampling.max_new_tokens
        return aggregate(terms, mask, cfg.loss_aggregation, constant), stats | is_stats

    # ---- metrics -------------------------------------------------------------------------------------
    def log_step(self, rollout: Rollout, targets: GroupTargets, stats: dict, sampling_stats: dict) -> None:
        cfg, mask = self.config, rollout.completion_mask
        scores = self.penalised_scores(rollout)
        group_std = group_reward_std(scores, cfg.k)  # [prompts]
        sequence_advantage = masked_mean(targets.advantages, mask, dim=1)
        metrics = common_metrics(self, rollout) | {
            "objective/scores": scores.nanmean(),
            "objective/kl": targets.kl.mean(),
            "objective/non_score_reward": (-cfg.kl_coef * targets.kl).mean() if cfg.kl_in_reward else 0.0,
            "objective/rlhf_reward": targets.rewards.nanmean(),
            "objective/advantage_std": sequence_advantage.std(),
            "reward_std": group_std.nanmean(),
            "frac_reward_zero_std": (group_std < 1e-6).float().mean(),
            "completions/clipped_ratio": (~rollout.ended_with_eos.bool()).float().mean(),
        }
        metrics.update({METRIC_NAMES.get(name, name): value for name, value in stats.items()})
        metrics.update(sampling_stats)
        log_metrics(self, metrics, batch_size=len(rollout))


def _to(value, device):
    return value.to(device) if isinstance(value, Tensor) else value
