"""PPO for RLHF (Schulman et al. 2017; "The N+ implementation details of RLHF with PPO", Huang et al. 2024):
the baseline RLOO is measured against. The rollout is RLOO's; what PPO adds is a value model and GAE.

    rollout   : one completion per prompt (k=1), reference and old log-probs, scores      (rloo/rollout.py)
    values    : V_t of a value model initialised from the reward model
    reward    : r_t = -beta * KL_t on every token, + score on the last real token
    advantage : GAE(gamma, lambda) over tokens, whitened over the batch; value targets G_t = A_t + V_t
    loss      : token-level PPO-clip + vf_coef * clipped value loss
    update    : num_ppo_epochs x num_mini_batches optimiser steps on shuffled rows

One Lightning step is one rollout, whatever the number of optimiser steps inside it.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from rloo.algorithms.base import COMMON_NAMES, OnlineRLConfig, OnlineRLModule
from rloo.objectives import (
    apply_missing_eos_penalty,
    clipped_value_loss,
    entropy_from_logits,
    explained_variance,
    gae_advantages,
    kl_per_token,
    masked_mean,
    masked_whiten,
    per_token_rewards,
    token_logprobs,
    token_ppo_clip_loss,
)
from rloo.rollout import Rollout, chunked, completion_logits, token_values


@dataclass
class PPOConfig(OnlineRLConfig):
    """The PPO keys of conf/algo/ppo.yaml on top of the shared ones (documented there)."""
    k: int = 1
    num_ppo_epochs: int = 4
    normalize_advantages: bool = True
    vf_coef: float = 0.1
    cliprange_value: float = 0.2
    gamma: float = 1.0
    lam: float = 0.95


class PPOModule(OnlineRLModule):
    """The policy, the frozen reference and reward model, and a trained value model; `training_step` is one PPO step."""

    trained_prefixes = ("policy.", "value_model.")

    def __init__(self, policy, reference, reward_model, value_model, tokenizer, config: PPOConfig):
        super().__init__(policy, reference, reward_model, tokenizer, config)
        self.value_model = value_model
        self.value_model.eval()  # no dropout, as the policy

    def trained_parameters(self):
        return itertools.chain(self.policy.parameters(), self.value_model.parameters())

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        cfg = self.config
        started = time.perf_counter()

        # 1. rollout (old log-probs always: PPO reuses it num_ppo_epochs times), then the values V_t
        rollout, timer = self.collect(batch, keep_old_logprobs=not cfg.old_logprobs_from_generation)
        if cfg.old_logprobs_from_generation:
            rollout.logprobs = rollout.generation_logprobs
        mask = rollout.completion_mask
        with timer("values"), torch.no_grad():
            values = chunked(partial(token_values, self.value_model, completion_len=mask.shape[1]),
                             cfg.generation_batch_size, rollout.input_ids, rollout.attention_mask)
        rollout.values = values * mask
        rollout_done = time.perf_counter()

        # 2. per-token rewards: r_t = -beta KL_t, plus the (penalised) score at the last real token
        kl = kl_per_token(rollout.logprobs, rollout.ref_logprobs, cfg.kl_estimator) * mask   # [N, T]
        scores = apply_missing_eos_penalty(rollout.scores, rollout.ended_with_eos, cfg.missing_eos_penalty)
        rollout.rewards = per_token_rewards(scores, kl, mask, cfg.kl_coef)

        # 3. GAE advantages and value targets; advantages whitened over the real tokens of the batch
        advantages, rollout.returns = gae_advantages(rollout.rewards, rollout.values, mask, cfg.gamma, cfg.lam)
        rollout.advantages = masked_whiten(advantages, mask) if cfg.normalize_advantages else advantages

        # 4-5. token-level clipped policy loss + clipped value loss, num_ppo_epochs passes on shuffled rows
        stats = self.run_updates(rollout, self._micro_batch_loss, shuffle=True)
        self.record_timings(timer, started, rollout_done)

        self.episodes += rollout.scores.shape[0] * self.trainer.world_size
        self.last_rollout = rollout
        self._log_step(rollout, scores, kl, stats)

    def _micro_batch_loss(self, rollout: Rollout, index: Tensor, first_epoch: bool) -> tuple[Tensor, dict]:
        cfg = self.config
        part = rollout.select(index)
        mask, length = part.completion_mask, part.completion_ids.shape[1]
        logits = completion_logits(self.policy, part.input_ids, part.attention_mask, length) / cfg.temperature
        logprobs = token_logprobs(logits, part.completion_ids) * mask                   # [n, T]
        token_w, sequence_w, mismatch = self.mismatch_and_weights(part, logprobs, first_epoch)
        policy_loss, clip = token_ppo_clip_loss(part.advantages, logprobs, part.logprobs, mask, cfg.clip_range,
                                                token_w, sequence_w)
        values = token_values(self.value_model, part.input_ids, part.attention_mask, length)   # [n, T]
        value_loss, value_clipfrac = clipped_value_loss(values, part.values, part.returns, mask, cfg.cliprange_value)
        loss = policy_loss + cfg.vf_coef * value_loss                                   # L = L_pi + c_v L_V
        stats = {"loss": policy_loss.item(), "value_loss": value_loss.item(), "clipfrac": clip.clipfrac.item(),
                 "value_clipfrac": value_clipfrac.item(), "approxkl": clip.approxkl.item(),
                 "ratio": clip.ratio_mean.item(), "ratio_min": clip.ratio_min.item(), "ratio_max": clip.ratio_max.item(),
                 **mismatch}
        if first_epoch:
            stats["first_epoch_clipfrac"] = stats["clipfrac"]
            with torch.no_grad():
                stats["entropy"] = masked_mean(entropy_from_logits(logits), mask).item()
        return loss, stats

    def _log_step(self, rollout: Rollout, scores: Tensor, kl: Tensor, stats: dict) -> None:
        cfg, mask = self.config, rollout.completion_mask
        kl_sum = kl.sum(1)  # [N] sum_t KL_t
        metrics = self.common_metrics(rollout) | {
            "objective/scores": scores.mean(),
            "objective/kl": kl_sum.mean(),
            "objective/non_score_reward": (-cfg.kl_coef * kl_sum).mean(),
            "objective/rlhf_reward": (scores - cfg.kl_coef * kl_sum).mean(),
            "val/value_mse": masked_mean((rollout.values - rollout.returns) ** 2, mask),  # rollout-time value error
            "val/explained_variance": explained_variance(rollout.values, rollout.returns, mask),
        }
        names = COMMON_NAMES | {"value_loss": "loss/value_avg", "value_clipfrac": "val/clipfrac_avg"}
        metrics.update({names[key]: value for key, value in stats.items()})
        self.log_metrics(metrics, batch_size=rollout.scores.shape[0])
