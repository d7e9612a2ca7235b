"""RLOO (Ahmadian et al. 2024): the whole training step, read top to bottom.

    rollout   : k completions per prompt, reference log-probs, reward-model scores      (rloo/rollout.py)
    reward    : R_i = score_i - beta * sum_t KL_t(y_i)                                   (KL inside R, as the paper)
    advantage : A_i = R_i - mean_{j != i} R_j, within each prompt's k completions         (leave-one-out)
    loss      : REINFORCE  -A_i * log pi(y_i|x),  or its sequence-level PPO-clip form
    mismatch  : rollout-time vs training log-probs logged every step; optional importance corrections
    update    : num_ppo_epochs x num_mini_batches optimiser steps, micro-batches accumulate gradients

One Lightning step is one rollout, whatever the number of optimiser steps inside it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.algorithms.base import COMMON_NAMES, OnlineRLConfig, OnlineRLModule
from rloo.objectives import (
    apply_missing_eos_penalty,
    entropy_from_logits,
    group_reward_std,
    kl_per_token,
    leave_one_out_advantages,
    masked_mean,
    normalize_advantages,
    reinforce_loss,
    sequence_ppo_clip_loss,
    sequence_rewards,
    token_clip_fraction,
    token_logprobs,
)
from rloo.rollout import Rollout, completion_logits


@dataclass
class RLOOConfig(OnlineRLConfig):
    """The RLOO keys of conf/train.yaml on top of the shared ones (documented there)."""
    normalize_advantages: bool = False
    loss: str = "ppo_clip"


class RLOOModule(OnlineRLModule):
    """Holds the trained policy, the frozen reference and the frozen reward model; `training_step` is one RLOO step."""

    # ---- the RLOO step -------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        started = time.perf_counter()

        # 1. rollout: k completions per prompt, reference log-probs, scores; old log-probs only if reused
        rollout, timer = self.collect(batch, keep_old_logprobs=self._needs_old_logprobs())
        if self.config.old_logprobs_from_generation:
            rollout.logprobs = rollout.generation_logprobs  # the peer's 2024 behaviour, kept to reproduce its failure
        rollout_done = time.perf_counter()

        # 2-3. rewards and advantages now if the old log-probs exist; else from the update's own forward pass
        if rollout.logprobs is not None:
            rollout.rewards, rollout.advantages, kl = self._rewards_and_advantages(rollout, rollout.logprobs)
        else:
            rollout.rewards = torch.zeros_like(rollout.scores)
            rollout.advantages = torch.zeros_like(rollout.scores)
            kl = torch.zeros_like(rollout.scores)

        # 4-5. loss and optimiser steps; on-policy, micro-batches keep whole prompt groups (no shuffle)
        def loss_of(rollout: Rollout, index: Tensor, first_epoch: bool):
            return self._micro_batch_loss(rollout, index, kl, first_epoch)

        stats = self.run_updates(rollout, loss_of, shuffle=self.config.reuses_rollout)
        self.record_timings(timer, started, rollout_done)

        self.episodes += rollout.scores.shape[0] * self.trainer.world_size
        self.last_rollout = rollout
        self._log_step(rollout, kl, stats)

    def _needs_old_logprobs(self) -> bool:
        cfg = self.config
        # whitening needs every advantage before the first backward, so micro-batches cannot compute their own
        whiten_all = cfg.normalize_advantages and cfg.micro_batch_size < cfg.rollout_batch_size
        return (cfg.reuses_rollout or whiten_all) and not cfg.old_logprobs_from_generation

    def _rewards_and_advantages(self, rollout: Rollout, logprobs: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """R = score - beta * sum_t KL_t and the leave-one-out A, for whole prompt groups. Returns R, A, sum_t KL."""
        cfg, mask = self.config, rollout.completion_mask
        kl_tokens = kl_per_token(logprobs, rollout.ref_logprobs, cfg.kl_estimator) * mask  # KL_t, 0 on padding
        scores = apply_missing_eos_penalty(rollout.scores, rollout.ended_with_eos, cfg.missing_eos_penalty)
        rewards = sequence_rewards(scores, kl_tokens, mask, cfg.kl_coef)   # R_i = s_i - beta * sum_t KL_t
        advantages = leave_one_out_advantages(rewards, cfg.k)             # A_i = R_i - (sum_j R_j - R_i)/(k-1)
        if cfg.normalize_advantages:
            advantages = normalize_advantages(advantages)
        return rewards, advantages, kl_tokens.sum(1)

    def _micro_batch_loss(self, rollout: Rollout, index: Tensor, kl: Tensor, first_epoch: bool) -> tuple[Tensor, dict]:
        cfg = self.config
        part = rollout.select(index)
        logits = completion_logits(self.policy, part.input_ids, part.attention_mask, part.completion_ids.shape[1])
        logits = logits / cfg.temperature                                  # the sampling distribution
        logprobs = token_logprobs(logits, part.completion_ids) * part.completion_mask   # [n, T]
        stats = {}
        if part.logprobs is None:
            # on-policy: this forward is the rollout's policy forward, so R and A come from it (detached)
            rewards, advantages, part_kl = self._rewards_and_advantages(part, logprobs.detach())
            rollout.rewards[index], rollout.advantages[index], kl[index] = rewards, advantages, part_kl
            old_logprobs = logprobs.detach()
        else:
            advantages, old_logprobs = part.advantages, part.logprobs
        if first_epoch:
            with torch.no_grad():
                stats["entropy"] = masked_mean(entropy_from_logits(logits), part.completion_mask).item()
        # rollout / training mismatch diagnostics, and the importance weights of is_correction (none: no weights)
        token_w, sequence_w, mismatch = self.mismatch_and_weights(part, logprobs, first_epoch)
        stats.update(mismatch)
        if cfg.loss == "reinforce":
            # -mean_i A_i * sum_t log pi
            loss = reinforce_loss(advantages, logprobs, part.completion_mask, token_w, sequence_w)
        else:
            loss, clip = sequence_ppo_clip_loss(advantages, logprobs, old_logprobs, part.completion_mask, cfg.clip_range,
                                                cfg.sequence_ratio == "mean", token_w, sequence_w)
            stats.update(clipfrac=clip.clipfrac.item(), approxkl=clip.approxkl.item(), ratio=clip.ratio_mean.item(),
                         ratio_min=clip.ratio_min.item(), ratio_max=clip.ratio_max.item(),
                         token_clipfrac=token_clip_fraction(advantages, logprobs, old_logprobs, part.completion_mask,
                                                            cfg.clip_range).item())
            if first_epoch:  # before the policy has moved much: what the mismatch alone nulls
                stats["first_epoch_clipfrac"] = stats["clipfrac"]
        stats["loss"] = loss.item()
        return loss, stats

    # ---- metrics -------------------------------------------------------------------------------------
    def _log_step(self, rollout: Rollout, kl: Tensor, stats: dict) -> None:
        cfg = self.config
        scores = apply_missing_eos_penalty(rollout.scores, rollout.ended_with_eos, cfg.missing_eos_penalty)
        metrics = self.common_metrics(rollout) | {
            "objective/scores": scores.mean(),
            "objective/kl": kl.mean(),
            "objective/non_score_reward": (-cfg.kl_coef * kl).mean(),
            "objective/rlhf_reward": rollout.rewards.mean(),
            "objective/advantage_std": rollout.advantages.std(),
            "frac_reward_zero_std": (group_reward_std(scores, cfg.k) < 1e-6).float().mean(),
        }
        metrics.update({COMMON_NAMES[key]: value for key, value in stats.items()})
        self.log_metrics(metrics, batch_size=rollout.scores.shape[0])
