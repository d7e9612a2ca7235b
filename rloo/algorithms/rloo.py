"""RLOO (Ahmadian et al. 2024): the whole training step, read top to bottom.

    rollout   : k completions per prompt, reference log-probs, reward-model scores      (rloo/rollout.py)
    reward    : R_i = score_i - beta * sum_t KL_t(y_i)                                   (KL inside R, as the paper)
    advantage : A_i = R_i - mean_{j != i} R_j, within each prompt's k completions         (leave-one-out)
    loss      : REINFORCE  -A_i * log pi(y_i|x),  or its sequence-level PPO-clip form
    update    : num_ppo_epochs x num_mini_batches optimiser steps, micro-batches accumulate gradients

One Lightning step is one rollout, whatever the number of optimiser steps inside it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from lightning import LightningModule
from torch import Tensor

from rloo.algorithms.optim import adamw_with_schedule
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
    token_logprobs,
)
from rloo.rollout import Rollout, SamplingConfig, collect_rollout, completion_logits


EXTREMES = {"ratio_min": min, "ratio_max": max}  # statistics aggregated over micro-batches by min / max


@dataclass
class RLOOConfig:
    """The keys of conf/train.yaml this module reads (documented there)."""
    k: int = 4
    kl_coef: float = 0.05
    kl_estimator: str = "k1"
    missing_eos_penalty: float | None = 1.0
    normalize_advantages: bool = False
    loss: str = "ppo_clip"
    clip_range: float = 0.2
    num_ppo_epochs: int = 1
    num_mini_batches: int = 1
    response_length: int = 16
    temperature: float = 0.7
    top_k: int = 0
    top_p: float = 1.0
    stop_token: str | None = "eos"
    rollout_batch_size: int = 64
    micro_batch_size: int = 64
    generation_batch_size: int = 64
    lr: float = 3e-4
    weight_decay: float = 0.0
    adam_eps: float = 1e-8
    warmup_ratio: float = 0.03
    lr_schedule: str = "linear"
    max_grad_norm: float | None = 1.0
    total_steps: int = 1          # rollouts; set by train.py from total_episodes

    @property
    def updates_per_rollout(self) -> int:
        return self.num_ppo_epochs * self.num_mini_batches

    @property
    def reuses_rollout(self) -> bool:
        return self.updates_per_rollout > 1

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.response_length, self.temperature, self.top_k, self.top_p,
                              greedy=False, stop_at_eos=self.stop_token == "eos")


class RLOOModule(LightningModule):
    """Holds the trained policy, the frozen reference and the frozen reward model; `training_step` is one RLOO step."""

    def __init__(self, policy, reference, reward_model, tokenizer, config: RLOOConfig):
        super().__init__()
        self.policy, self.reference, self.reward_model = policy, reference, reward_model
        self.tokenizer, self.config = tokenizer, config
        self.automatic_optimization = False  # several optimiser steps per rollout
        self.strict_loading = False          # checkpoints hold the policy only (see on_save_checkpoint)
        self.policy.eval()                   # no dropout: on-policy the ratio must be exactly 1
        self.episodes = 0                    # completions trained on, summed over devices
        self.last_rollout: Rollout | None = None

    # ---- the RLOO step -------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        cfg = self.config
        started = time.perf_counter()

        # 1. rollout: k completions per prompt, reference log-probs, scores; old log-probs only if reused
        rollout = collect_rollout(
            self.policy, self.reference, self.reward_model, batch["prompt_ids"], batch["prompt_mask"], cfg.k,
            cfg.sampling, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, cfg.generation_batch_size,
            keep_old_logprobs=self._needs_old_logprobs(),
        )
        rollout_seconds = time.perf_counter() - started

        # 2-3. rewards and advantages now if the old log-probs exist; else from the update's own forward pass
        if rollout.logprobs is not None:
            rollout.rewards, rollout.advantages, kl = self._rewards_and_advantages(rollout, rollout.logprobs)
        else:
            rollout.rewards = torch.zeros_like(rollout.scores)
            rollout.advantages = torch.zeros_like(rollout.scores)
            kl = torch.zeros_like(rollout.scores)

        # 4-5. loss and optimiser steps
        stats = self._update(rollout, kl)
        update_seconds = time.perf_counter() - started - rollout_seconds

        self.episodes += rollout.scores.shape[0] * self.trainer.world_size
        self.last_rollout = rollout
        self._log_step(rollout, kl, stats, rollout_seconds, update_seconds)

    def _needs_old_logprobs(self) -> bool:
        cfg = self.config
        # whitening needs every advantage before the first backward, so micro-batches cannot compute their own
        whiten_all = cfg.normalize_advantages and cfg.micro_batch_size < cfg.rollout_batch_size
        return cfg.reuses_rollout or whiten_all

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

    def _update(self, rollout: Rollout, kl: Tensor) -> dict[str, float]:
        """num_ppo_epochs x num_mini_batches optimiser steps over the rollout; returns mean loss statistics."""
        cfg = self.config
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        n = rollout.scores.shape[0]
        mini_size = n // cfg.num_mini_batches
        totals: dict[str, float] = {}
        for epoch in range(cfg.num_ppo_epochs):
            # on-policy, micro-batches must hold whole prompt groups, so keep the prompt-major order
            order = torch.randperm(n, device=self.device) if cfg.reuses_rollout else torch.arange(n, device=self.device)
            for m in range(cfg.num_mini_batches):
                minibatch = order[m * mini_size:(m + 1) * mini_size]
                micro_batches = minibatch.split(cfg.micro_batch_size)
                for i, micro in enumerate(micro_batches):
                    with optimizer.toggle_model(sync_grad=i == len(micro_batches) - 1):
                        loss, micro_stats = self._micro_batch_loss(rollout, micro, kl, first_epoch=epoch == 0)
                        self.manual_backward(loss * len(micro) / mini_size)
                    for key, value in micro_stats.items():
                        if key in EXTREMES:  # a min of mins, a max of maxes
                            totals[key] = EXTREMES[key](totals.get(key, value), value)
                        else:
                            totals[key] = totals.get(key, 0.0) + value * len(micro)
                self._optimizer_step(optimizer, last=epoch == cfg.num_ppo_epochs - 1 and m == cfg.num_mini_batches - 1)
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
        # entropy is measured on the first pass only; the other means are over every pass
        passes = {key: 1 if key == "entropy" else cfg.num_ppo_epochs for key in totals}
        return {key: value if key in EXTREMES else value / (n * passes[key]) for key, value in totals.items()}

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
        if cfg.loss == "reinforce":
            loss = reinforce_loss(advantages, logprobs, part.completion_mask)   # -mean_i A_i * sum_t log pi
        else:
            loss, clip = sequence_ppo_clip_loss(advantages, logprobs, old_logprobs, part.completion_mask, cfg.clip_range)
            stats.update(clipfrac=clip.clipfrac.item(), approxkl=clip.approxkl.item(), ratio=clip.ratio_mean.item(),
                         ratio_min=clip.ratio_min.item(), ratio_max=clip.ratio_max.item())
        stats["loss"] = loss.item()
        return loss, stats

    def _optimizer_step(self, optimizer, last: bool) -> None:
        # Lightning counts every LightningOptimizer.step() as a global step; one rollout must be one step,
        # so the earlier updates of a rollout go through the strategy (same precision/scaler path) uncounted.
        if last:
            optimizer.step()
        else:
            self.trainer.strategy.optimizer_step(optimizer.optimizer, closure=lambda: None, model=self)

    def on_before_optimizer_step(self, optimizer) -> None:
        # here gradients are already unscaled under fp16, so clipping sees their true norm
        if self.config.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.config.max_grad_norm)
            self._last_grad_norm = float(norm)

    # ---- metrics -------------------------------------------------------------------------------------
    def _log_step(self, rollout: Rollout, kl: Tensor, stats: dict, rollout_seconds: float, update_seconds: float) -> None:
        cfg = self.config
        scores = apply_missing_eos_penalty(rollout.scores, rollout.ended_with_eos, cfg.missing_eos_penalty)
        tokens = rollout.completion_mask.sum().item()
        metrics = {
            "objective/scores": scores.mean(),
            "objective/kl": kl.mean(),
            "objective/non_score_reward": (-cfg.kl_coef * kl).mean(),
            "objective/rlhf_reward": rollout.rewards.mean(),
            "objective/advantage_std": rollout.advantages.std(),
            "completions/mean_length": rollout.lengths.float().mean(),
            "completions/eos_frac": rollout.ended_with_eos.float().mean(),
            "frac_reward_zero_std": (group_reward_std(scores, cfg.k) < 1e-6).float().mean(),
            "time/rollout": rollout_seconds,
            "time/update": update_seconds,
            "time/tokens_per_second": tokens / max(rollout_seconds + update_seconds, 1e-9),
            "lr": self.lr_schedulers().get_last_lr()[0],
            "episode": float(self.episodes),
            "epoch": self.episodes / max(self._num_train_prompts() * cfg.k, 1),
        }
        names = {"entropy": "objective/entropy", "loss": "loss/policy_avg", "clipfrac": "policy/clipfrac_avg",
                 "approxkl": "policy/approxkl_avg", "ratio": "val/ratio", "ratio_min": "val/ratio_min",
                 "ratio_max": "val/ratio_max"}
        metrics.update({names[key]: value for key, value in stats.items()})
        if getattr(self, "_last_grad_norm", None) is not None:
            metrics["policy/grad_norm"] = self._last_grad_norm
        metrics = {key: torch.as_tensor(value, dtype=torch.float32, device=self.device) for key, value in metrics.items()}
        self.log_dict(metrics, on_step=True, on_epoch=False, sync_dist=self.trainer.world_size > 1, batch_size=rollout.scores.shape[0])
        self.log("score", metrics["objective/scores"], prog_bar=True, logger=False)
        self.log("kl", metrics["objective/kl"], prog_bar=True, logger=False)

    def _num_train_prompts(self) -> int:
        datamodule = getattr(self.trainer, "datamodule", None)
        return getattr(datamodule, "num_train_prompts", 0) or 0

    # ---- optimiser, checkpoints ------------------------------------------------------------------------
    def configure_optimizers(self):
        cfg = self.config
        return adamw_with_schedule(self.policy.parameters(), cfg.lr, cfg.total_steps * cfg.updates_per_rollout,
                                   cfg.warmup_ratio, cfg.lr_schedule, cfg.weight_decay, cfg.adam_eps)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # the reference and reward model never change: keep only the policy (and the episode counter)
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k.startswith("policy.")}
        checkpoint["rloo_episodes"] = self.episodes

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.episodes = checkpoint.get("rloo_episodes", 0)

    def train(self, mode: bool = True):
        # Lightning switches modules to train mode each epoch; the three models stay in eval (no dropout)
        super().train(mode)
        for model in (self.policy, self.reference, self.reward_model):
            model.eval()
        return self
