"""PPO for RLHF (Schulman et al. 2017; "The N+ implementation details of RLHF with PPO", Huang et al. 2024):
the baseline RLOO is measured against. The rollout is RLOO's; what PPO adds is a value model and GAE.

    rollout   : one completion per prompt (k=1), reference and old log-probs, scores      (rloo/generation/rollout.py)
    values    : V_t of a value model initialised from the reward model
    reward    : r_t = -beta * KL_t on every token, + score on the last real token
    advantage : GAE(gamma, lambda) over tokens, whitened over the batch; value targets G_t = A_t + V_t
    loss      : token-level PPO-clip + vf_coef * clipped value loss
    update    : num_ppo_epochs x num_mini_batches optimiser steps on shuffled rows

One batch of the train loop is one rollout; Lightning counts each of its optimiser steps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from rloo.algorithms.base import OnlineRLModule
from rloo.algorithms.configs import PPOConfig
from rloo.algorithms.metrics import METRIC_NAMES, StepStats, common_metrics, log_metrics
from rloo.generation.forward import token_values
from rloo.generation.rollout import PhaseTimer, Rollout, chunked, clock
from rloo.objectives import (
    LossForm,
    clipped_value_loss,
    explained_variance,
    gae_advantages,
    kl_per_token,
    masked_mean,
    masked_whiten,
    per_token_rewards,
    policy_gradient_loss,
)


@dataclass
class PPOTargets:
    """What PPO derives from a rollout, per token `[N, T]` (0 on padding)."""

    kl: Tensor  # KL_t
    values: Tensor  # V_t of the value model at rollout time
    rewards: Tensor  # r_t = -beta KL_t (+ score on the last real token)
    advantages: Tensor  # GAE A_t (whitened when normalize_advantages)
    returns: Tensor  # value targets G_t = A_t + V_t

    def sequence_advantages(self, completion_mask: Tensor) -> Tensor:
        """`[N]`: the mean advantage over each completion's real tokens (for the sample table)."""
        return masked_mean(self.advantages, completion_mask, dim=1)


class PPOModule(OnlineRLModule):
    """The policy, the frozen reference and reward model, and a trained value model; `training_step` is one PPO step."""

    trained_prefixes = ("policy.", "value_model.")

    def __init__(self, policy, reference, reward_model, value_model, tokenizer, config: PPOConfig):
        super().__init__(policy, reference, reward_model, tokenizer, config)
        self.value_model = value_model
        self.value_model.eval()  # no dropout, as the policy

    def trained_parameters(self):
        return itertools.chain(super().trained_parameters(), self.value_model.parameters())

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        cfg, timer, started = self.config, PhaseTimer(), clock()

        # 1. rollout; the training-style log-probs of the policy that sampled (the old ones), and the values V_t
        rollout = self.collect(batch, timer)
        n, mask = len(rollout), rollout.completion_mask
        if not self.scores_are_finite(rollout):  # guard: nothing to learn from a nan or inf score
            return self.skip_rollout(rollout, timer, started)
        with timer("old_logprobs"):
            rollout_policy_logprobs, entropy = self.rollout_policy_forward(rollout)
        old_logprobs = rollout.generation_logprobs if cfg.old_logprobs == "generation" else rollout_policy_logprobs
        with timer("values"), torch.no_grad():
            values = (
                chunked(
                    partial(token_values, self.value_model, completion_len=mask.shape[1]),
                    cfg.generation_batch_size,
                    rollout.input_ids,
                    rollout.attention_mask,
                )
                * mask
            )
        rollout_done = clock()

        # 2. per-token rewards: r_t = -beta KL_t, plus the (penalised) score at the last real token
        kl = kl_per_token(old_logprobs, rollout.ref_logprobs, cfg.kl_estimator) * mask  # [N, T]
        scores = self.penalised_scores(rollout)
        rewards = per_token_rewards(scores, kl, mask, cfg.kl_coef)

        # 3. GAE advantages and value targets; advantages whitened over the real tokens of the batch
        advantages, returns = gae_advantages(rewards, values, mask, cfg.gamma, cfg.lam)
        if cfg.normalize_advantages:
            advantages = masked_whiten(advantages, mask)
        targets = PPOTargets(kl, values, rewards, advantages, returns)

        # 4-5. token-level clipped policy loss + clipped value loss, num_ppo_epochs passes on shuffled rows
        stats = StepStats()
        for micro in self.update_micro_batches(n, shuffle=True):  # an optimiser step after each mini-batch
            index = micro.index
            loss, part_stats = self.micro_batch_loss(
                rollout.select(index), targets, index, old_logprobs[index], rollout_policy_logprobs[index]
            )
            self.accumulate_gradients(loss, micro)
            stats.add(part_stats, len(index))

        self.finish_step(rollout, targets, timer, started, rollout_done)
        # measured at the policy that sampled, whatever the epochs and mini-batches did after
        diagnostics = self.rollout_diagnostics(rollout, rollout_policy_logprobs, entropy)
        diagnostics["first_epoch_clipfrac"] = policy_gradient_loss(
            advantages, rollout_policy_logprobs, old_logprobs, mask, self.loss_form
        )[1]["clipfrac"]
        self.log_step(rollout, scores, targets, stats.means() | diagnostics)

    @property
    def loss_form(self) -> LossForm:
        """PPO's policy loss: a ratio per token, clipped symmetrically, averaged over the batch's real tokens."""
        clip = self.config.clip_range
        return LossForm("ppo_clip", "token", "sum", clip, clip, "token_mean")

    def micro_batch_loss(
        self, part: Rollout, targets: PPOTargets, index: Tensor, old_logprobs: Tensor, rollout_policy_logprobs: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """L = L_pi + vf_coef * L_V on the rows `index`."""
        cfg, mask, length = self.config, part.completion_mask, part.completion_ids.shape[1]
        logprobs, _ = self.policy_forward(part)  # [n, T]
        token_w, sequence_w, is_stats = self.correction_weights(part, rollout_policy_logprobs)
        policy_loss, clip = policy_gradient_loss(
            targets.advantages[index], logprobs, old_logprobs, mask, self.loss_form, token_w, sequence_w
        )
        values = token_values(self.value_model, part.input_ids, part.attention_mask, length)  # [n, T]
        value_loss, value_clipfrac = clipped_value_loss(
            values, targets.values[index], targets.returns[index], mask, cfg.value_clip_range
        )
        loss = policy_loss + cfg.vf_coef * value_loss  # L = L_pi + c_v L_V
        return loss, {
            "loss": policy_loss,
            "value_loss": value_loss,
            "value_clipfrac": value_clipfrac,
            **clip,
            **is_stats,
        }

    def log_step(self, rollout: Rollout, scores: Tensor, targets: PPOTargets, stats: dict) -> None:
        cfg, mask = self.config, rollout.completion_mask
        kl_sum = targets.kl.sum(1)  # [N] sum_t KL_t
        metrics = common_metrics(self, rollout) | {
            "objective/scores": scores.mean(),
            "objective/kl": kl_sum.mean(),
            "objective/non_score_reward": (-cfg.kl_coef * kl_sum).mean(),
            "objective/rlhf_reward": (scores - cfg.kl_coef * kl_sum).mean(),
            "value/mse": masked_mean((targets.values - targets.returns) ** 2, mask),  # rollout-time value error
            "value/explained_variance": explained_variance(targets.values, targets.returns, mask),
        }
        names = METRIC_NAMES | {"value_loss": "loss/value_avg", "value_clipfrac": "val/clipfrac_avg"}
        metrics.update({names[key]: value for key, value in stats.items()})
        log_metrics(self, metrics, batch_size=len(rollout))
