"""RLOO (Ahmadian et al. 2024, after Kool et al. 2019): the whole training step, read top to bottom.

    1. rollout    : k completions per prompt, their reference log-probs and reward-model scores   (rloo/rollout.py)
    2. reward     : R_i = score_i - beta * sum_t KL_t(y_i)                                   (KL inside R, as the paper)
    3. advantage  : A_i = R_i - mean_{j != i} R_j, within each prompt's k completions         (leave-one-out)
    4. loss       : REINFORCE  -A_i * sum_t log pi(y_i,t),  or its sequence-level PPO-clip form
    5. step       : num_ppo_epochs x num_mini_batches optimiser steps; micro-batches accumulate gradients

R needs log pi of the policy that sampled (for the KL). A rollout used for one update gets it from the
update's own forward pass, one forward fewer (`update_on_policy`); a reused rollout gets it from a forward before the
first step (`update_on_reused_rollout`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.algorithms.base import OnlineRLModule, PolicyGradientConfig
from rloo.algorithms.metrics import METRIC_NAMES, StepStats, common_metrics, log_metrics
from rloo.keys import FIXED, key
from rloo.objectives import (
    group_reward_std,
    kl_per_token,
    leave_one_out_advantages,
    masked_leave_one_out_advantages,
    normalize_advantages,
    reinforce_loss,
    sequence_ppo_clip_loss,
    sequence_rewards,
    token_clip_fraction,
)
from rloo.rollout import PhaseTimer, Rollout, clock

LOSSES = ("ppo_clip", "reinforce")
SEQUENCE_RATIOS = ("sum", "mean")


@dataclass(frozen=True)
class RLOOConfig(PolicyGradientConfig):
    """The RLOO keys of conf/algo/rloo.yaml on top of the shared ones (documented there); also raft's and
    vanilla_pg's, which change only the advantage."""

    loss: str = key(FIXED, choices=LOSSES)
    sequence_ratio: str = key(FIXED, choices=SEQUENCE_RATIOS)


@dataclass
class RLOOTargets:
    """What RLOO derives from a rollout: the KL, the sequence rewards and the leave-one-out advantages."""

    kl: Tensor  # [N] sum_t KL_t
    rewards: Tensor  # [N] R_i
    advantages: Tensor  # [N] A_i

    @classmethod
    def zeros(cls, n: int, device) -> "RLOOTargets":
        return cls(
            *(torch.zeros(n, device=device, dtype=torch.float32) for _ in range(3))
        )  # not the default dtype (bf16-true)

    def sequence_advantages(self, completion_mask: Tensor) -> Tensor:
        return self.advantages  # [N]: one per completion already

    def assign(self, index: Tensor, part: "RLOOTargets") -> None:
        self.kl[index], self.rewards[index], self.advantages[index] = part.kl, part.rewards, part.advantages


def unscored_sit_out(advantages: Tensor, scores: Tensor) -> Tensor:
    """reward_errors=mask: a completion without a finite score gets A = 0 (it teaches nothing)."""
    return torch.where(torch.isfinite(scores), advantages, torch.zeros_like(advantages))


class RLOOModule(OnlineRLModule):
    """Holds the trained policy, the frozen reference and the frozen reward model; `training_step` is one RLOO step."""

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        cfg, timer, started = self.config, PhaseTimer(), clock()

        # 1. rollout: k completions per prompt, reference log-probs, scores                        [N = prompts * k]
        rollout = self.collect(batch, timer)
        if not self.scores_are_finite(rollout) and not self.masks_bad_scores():  # guard: nothing to learn from nan
            return self.skip_rollout(rollout, timer, started)
        if not torch.isfinite(rollout.scores).any():  # reward_errors=mask, every completion unscored: counted bad
            self.state.rollout_was_bad = True  # (max_bad_steps in a row stop the run)

        # 2-5. rewards, advantages, loss and optimiser steps. R needs log pi(y_t) of the policy that sampled [N, T],
        # from a training-style forward: used once, the update's own forward provides it; reused, a forward first
        if self.takes_log_pi_from_the_update():
            rollout_done = clock()
            targets, rollout_policy_logprobs, entropy, stats = self.update_on_policy(rollout)
            old_logprobs = rollout_policy_logprobs
        else:
            with timer("old_logprobs"):
                rollout_policy_logprobs, entropy = self.rollout_policy_forward(rollout)
            # old_logprobs=generation is TRL's 2024 trainer's behaviour, kept to reproduce its failure: the sampler's
            old_logprobs = rollout.generation_logprobs if cfg.old_logprobs == "generation" else rollout_policy_logprobs
            rollout_done = clock()
            targets = self.rewards_and_advantages(rollout, old_logprobs)
            stats = self.update_on_reused_rollout(rollout, targets, old_logprobs, rollout_policy_logprobs)

        self.finish_step(rollout, targets, timer, started, rollout_done)
        # measured at the policy that sampled, whatever the epochs and mini-batches did after
        diagnostics = self.rollout_diagnostics(rollout, rollout_policy_logprobs, entropy)
        if cfg.loss == "ppo_clip":  # what the mismatch alone nulls: the clip before any optimiser step
            diagnostics["first_epoch_clipfrac"] = self.ppo_clip(
                rollout, targets.advantages, rollout_policy_logprobs, old_logprobs
            )[1]["clipfrac"]
        self.log_step(rollout, targets, stats.means() | diagnostics)

    def update_on_policy(self, rollout: Rollout) -> tuple["RLOOTargets", Tensor, Tensor, StepStats]:
        """Each rollout used for one optimiser step: micro-batches of whole prompt groups in order, each one's forward
        the rollout policy's, so log pi, R and A come from it (detached) and the loss from the same forward."""
        n = len(rollout)
        # float32 as rollout_policy_forward's, whatever the models compute in (bf16-true: bf16 ref log-probs)
        rollout_policy_logprobs = torch.zeros_like(rollout.ref_logprobs, dtype=torch.float32)  # [N, T]
        entropy = torch.zeros_like(rollout_policy_logprobs)  # [N, T]
        targets, stats = RLOOTargets.zeros(n, self.device), StepStats()
        for micro in self.update_micro_batches(n, shuffle=False, epochs=1):  # one mini-batch; 5. step after it
            index, part = micro.index, rollout.select(micro.index)
            logprobs, part_entropy = self.policy_forward(part)  # [n, T]
            rollout_policy_logprobs[index], entropy[index] = logprobs.detach().float(), part_entropy.float()
            targets.assign(index, self.rewards_and_advantages(part, logprobs.detach()))  # 2-3. R, A
            loss, loss_stats = self.policy_loss(
                part, targets.advantages[index], logprobs, logprobs.detach(), rollout_policy_logprobs[index]
            )  # 4. loss
            self.accumulate_gradients(loss, micro)
            stats.add({"loss": loss, **loss_stats}, len(index))
        return targets, rollout_policy_logprobs, entropy, stats

    def update_on_reused_rollout(
        self, rollout: Rollout, targets: "RLOOTargets", old_logprobs: Tensor, rollout_policy_logprobs: Tensor
    ) -> StepStats:
        """num_ppo_epochs passes over the rollout, num_mini_batches optimiser steps each, whole groups shuffled; the
        rewards and advantages were fixed before the first step."""
        stats = StepStats()
        for micro in self.update_micro_batches(len(rollout), shuffle=True):  # 5. a step after each mini-batch
            index, part = micro.index, rollout.select(micro.index)
            logprobs, _ = self.policy_forward(part, with_entropy=False)  # [n, T]
            loss, loss_stats = self.policy_loss(
                part, targets.advantages[index], logprobs, old_logprobs[index], rollout_policy_logprobs[index]
            )  # 4. loss
            self.accumulate_gradients(loss, micro)
            stats.add({"loss": loss, **loss_stats}, len(index))
        return stats

    # ---- the RLOO math, on tensors from rloo/objectives.py ------------------------------------------------
    def takes_log_pi_from_the_update(self) -> bool:
        """One forward pass serves the KL and the loss: one update per rollout, old log-probs recomputed, and no
        whitening over more rows than one micro-batch holds."""
        cfg = self.config
        whitens_across_micro_batches = cfg.normalize_advantages and cfg.micro_batch_size < cfg.rollout_batch_size
        return not cfg.reuses_rollout and cfg.old_logprobs == "recompute" and not whitens_across_micro_batches

    def rewards_and_advantages(self, rollout: Rollout, logprobs: Tensor) -> RLOOTargets:
        """R = score - beta * sum_t KL_t and the leave-one-out A, for whole prompt groups."""
        cfg, mask = self.config, rollout.completion_mask
        kl_tokens = kl_per_token(logprobs, rollout.ref_logprobs, cfg.kl_estimator) * mask  # KL_t, 0 on padding
        scores = self.penalised_scores(rollout)
        rewards = sequence_rewards(scores, kl_tokens, mask, cfg.kl_coef)  # R_i = s_i - beta * sum_t KL_t
        advantages = self.advantages(rewards, scores)
        if cfg.normalize_advantages:
            advantages = normalize_advantages(advantages)
        return RLOOTargets(kl_tokens.sum(1), rewards, advantages)

    def advantages(self, rewards: Tensor, scores: Tensor) -> Tensor:
        """A_i = R_i - (sum_j R_j - R_i)/(k-1) within each prompt's group: the leave-one-out baseline. (The other
        policy-gradient baselines of rloo/algorithms/ replace this method only.)"""
        if self.masks_bad_scores() and not torch.isfinite(scores).all():  # reward_errors=mask: unscored ones sit out
            return masked_leave_one_out_advantages(rewards, self.config.k, torch.isfinite(scores))
        return leave_one_out_advantages(rewards, self.config.k)

    def policy_loss(
        self, part: Rollout, advantages: Tensor, logprobs: Tensor, old_logprobs: Tensor, rollout_policy_logprobs: Tensor
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The loss of a micro-batch and its statistics, weighted by is_correction (pi_train / pi_rollout)."""
        token_w, sequence_w, is_stats = self.correction_weights(part, rollout_policy_logprobs)
        if self.config.loss == "reinforce":  # -mean_i A_i * sum_t log pi(y_i,t)
            return reinforce_loss(advantages, logprobs, part.completion_mask, token_w, sequence_w), is_stats
        # mean_i max(-A_i r_i, -A_i clip(r_i, 1-eps, 1+eps))
        loss, clip_stats = self.ppo_clip(part, advantages, logprobs, old_logprobs, token_w, sequence_w)
        return loss, clip_stats | is_stats

    def ppo_clip(
        self,
        part: Rollout,
        advantages: Tensor,
        logprobs: Tensor,
        old_logprobs: Tensor,
        token_w: Tensor | None = None,
        sequence_w: Tensor | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The sequence-level PPO-clip loss mean_i max(-A_i r_i, -A_i clip(r_i, 1-eps, 1+eps)) and its statistics."""
        cfg, mask = self.config, part.completion_mask
        loss, clip = sequence_ppo_clip_loss(
            advantages, logprobs, old_logprobs, mask, cfg.clip_range, cfg.sequence_ratio == "mean", token_w, sequence_w
        )
        return loss, {
            "clipfrac": clip.clipfrac,
            "approxkl": clip.approxkl,
            "ratio": clip.ratio_mean,
            "ratio_min": clip.ratio_min,
            "ratio_max": clip.ratio_max,
            "token_clipfrac": token_clip_fraction(advantages, logprobs, old_logprobs, mask, cfg.clip_range),
        }

    # ---- metrics -------------------------------------------------------------------------------------
    def log_step(self, rollout: Rollout, targets: RLOOTargets, stats: dict) -> None:
        cfg = self.config
        scores = self.penalised_scores(rollout)
        metrics = common_metrics(self, rollout) | {
            "objective/scores": scores.nanmean(),  # nan only where reward_errors=mask left a completion unscored
            "objective/kl": targets.kl.mean(),
            "objective/non_score_reward": (-cfg.kl_coef * targets.kl).mean(),
            "objective/rlhf_reward": targets.rewards.nanmean(),
            "objective/advantage_std": targets.advantages.std(),
        }
        if cfg.k > 1:  # one completion per prompt (algo=reinforce, vanilla_pg) has no group
            group_std = group_reward_std(scores, cfg.k)  # [prompts]
            metrics["reward_std"] = group_std.nanmean()
            metrics["frac_reward_zero_std"] = (group_std < 1e-6).float().mean()
        metrics.update({METRIC_NAMES[key]: value for key, value in stats.items()})
        log_metrics(self, metrics, batch_size=len(rollout))
