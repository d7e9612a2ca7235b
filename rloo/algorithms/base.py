"""What every online RL algorithm here shares: the settings of the rollout and the optimiser, the update loop
(epochs x mini-batches x micro-batches, one Lightning step per rollout), gradient clipping, checkpoints, timing.

The algorithms (rloo.py, ppo.py) supply the loss of a micro-batch and their metrics; the rollout itself is
rloo/rollout.py's, the same for all of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from lightning import LightningModule
from torch import Tensor

from rloo.algorithms.optim import adamw_with_schedule
from rloo.objectives import importance_weights, logprob_mismatch
from rloo.rollout import PhaseTimer, Rollout, SamplingConfig, collect_rollout

# statistics aggregated over micro-batches by min / max rather than by mean
EXTREMES = {"ratio_min": min, "ratio_max": max, "mismatch_abs_max": max,
            "mismatch_seq_log_ratio_min": min, "mismatch_seq_log_ratio_max": max}
FIRST_PASS_PREFIXES = ("entropy", "mismatch_", "first_epoch_")  # measured on the first pass over the rollout only

# metric names of the statistics both algorithms report
COMMON_NAMES = {"entropy": "objective/entropy", "loss": "loss/policy_avg", "clipfrac": "policy/clipfrac_avg",
                "token_clipfrac": "policy/token_clipfrac_avg", "approxkl": "policy/approxkl_avg",
                "first_epoch_clipfrac": "policy/clipfrac_first_epoch",
                "ratio": "val/ratio", "ratio_min": "val/ratio_min", "ratio_max": "val/ratio_max",
                "is_weight": "is/weight_mean",
                "mismatch_abs_mean": "mismatch/logprob_abs_mean", "mismatch_abs_max": "mismatch/logprob_abs_max",
                "mismatch_token_mult_prob_error": "mismatch/token_mult_prob_error",
                "mismatch_seq_log_ratio_mean": "mismatch/seq_log_ratio_mean",
                "mismatch_seq_log_ratio_min": "mismatch/seq_log_ratio_min",
                "mismatch_seq_log_ratio_max": "mismatch/seq_log_ratio_max"}


@dataclass
class OnlineRLConfig:
    """The keys of conf/train.yaml every algorithm reads (documented there)."""
    k: int = 4
    kl_coef: float = 0.05
    kl_estimator: str = "k1"
    missing_eos_penalty: float | None = 1.0
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
    lean_decode: bool = True
    old_logprobs: str = "recompute"
    sequence_ratio: str = "sum"
    is_correction: str = "none"
    is_cap: float = 2.0
    is_low: float = 0.5
    is_high: float = 2.0
    log_histograms: bool = False
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
                              greedy=False, stop_at_eos=self.stop_token == "eos", lean_decode=self.lean_decode)

    @property
    def old_logprobs_from_generation(self) -> bool:
        return self.old_logprobs == "generation"


MicroBatchLoss = Callable[[Rollout, Tensor, bool], tuple[Tensor, dict[str, float]]]


class OnlineRLModule(LightningModule):
    """Holds the trained policy, the frozen reference and the frozen reward model (and whatever else an
    algorithm trains, see `trained_prefixes`). Subclasses write `training_step`."""

    trained_prefixes: tuple[str, ...] = ("policy.",)  # state_dict entries a checkpoint keeps

    def __init__(self, policy, reference, reward_model, tokenizer, config: OnlineRLConfig):
        super().__init__()
        self.policy, self.reference, self.reward_model = policy, reference, reward_model
        self.tokenizer, self.config = tokenizer, config
        self.automatic_optimization = False  # several optimiser steps per rollout
        self.strict_loading = False          # checkpoints hold the trained models only (see on_save_checkpoint)
        self.policy.eval()                   # no dropout: on-policy the ratio must be exactly 1
        self.episodes = 0                    # completions trained on, summed over devices
        self.last_rollout: Rollout | None = None
        self.last_timings: dict[str, float] = {}  # seconds of the last step, by phase (rollout phases, update)
        self.last_mismatch: dict[str, list[Tensor]] = {}  # per-token delta logp, sequence log-ratio (log_histograms)

    # ---- shared pieces of a step ---------------------------------------------------------------------------
    def collect(self, batch: dict[str, Tensor], keep_old_logprobs: bool) -> tuple[Rollout, PhaseTimer]:
        """The one rollout every algorithm uses: k completions per prompt, reference log-probs, scores."""
        cfg, timer = self.config, PhaseTimer()
        rollout = collect_rollout(
            self.policy, self.reference, self.reward_model, batch["prompt_ids"], batch["prompt_mask"], cfg.k,
            cfg.sampling, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id, cfg.generation_batch_size,
            keep_old_logprobs=keep_old_logprobs, timer=timer)
        return rollout, timer

    def mismatch_and_weights(self, part: Rollout, logprobs: Tensor, first_epoch: bool
                             ) -> tuple[Tensor | None, Tensor | None, dict[str, float]]:
        """Rollout / training mismatch of a micro-batch and the importance weights that correct for it.

        logprobs: this micro-batch's training forward `[n, T]`. The mismatch compares the training-style
        log-probs at the rollout policy (the recomputed old log-probs, else this forward) with the sampler's.
        Measured on the first pass only, where the training forward still sees the rollout policy.
        Returns (token_weights, sequence_weights, stats).
        """
        cfg, stats = self.config, {}
        if part.generation_logprobs is None:
            return None, None, stats
        recomputed = part.logprobs is not None and not cfg.old_logprobs_from_generation
        train_side = part.logprobs if recomputed else logprobs.detach()
        if first_epoch:
            mismatch = logprob_mismatch(logprobs, part.generation_logprobs, part.completion_mask)
            stats.update({f"mismatch_{key}": value.item() for key, value in mismatch.items()})
            if cfg.log_histograms:  # kept for the W&B histograms (rloo.callbacks.MismatchHistograms)
                diff = (logprobs.detach() - part.generation_logprobs) * part.completion_mask
                self.last_mismatch.setdefault("delta_logp", []).append(diff[part.completion_mask.bool()].float().cpu())
                self.last_mismatch.setdefault("seq_log_ratio", []).append(diff.sum(1).float().cpu())
        token_weights, sequence_weights = importance_weights(train_side, part.generation_logprobs, part.completion_mask,
                                                             cfg.is_correction, cfg.is_cap, cfg.is_low, cfg.is_high)
        if token_weights is not None:
            stats["is_weight"] = (token_weights.sum() / part.completion_mask.sum().clamp(min=1)).item()
        elif sequence_weights is not None:
            stats["is_weight"] = sequence_weights.mean().item()
        return token_weights, sequence_weights, stats

    def run_updates(self, rollout: Rollout, micro_batch_loss: MicroBatchLoss, shuffle: bool) -> dict[str, float]:
        """num_ppo_epochs x num_mini_batches optimiser steps over the rollout; returns mean loss statistics.

        `micro_batch_loss(rollout, index, first_epoch)` -> (loss, stats); the loss is a mean over its rows.
        Without `shuffle` rows keep their prompt-major order, so micro-batches hold whole prompt groups.
        """
        cfg = self.config
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        self.last_mismatch = {}
        n = rollout.scores.shape[0]
        mini_size = n // cfg.num_mini_batches
        totals: dict[str, float] = {}
        for epoch in range(cfg.num_ppo_epochs):
            order = torch.randperm(n, device=self.device) if shuffle else torch.arange(n, device=self.device)
            for m in range(cfg.num_mini_batches):
                micro_batches = order[m * mini_size:(m + 1) * mini_size].split(cfg.micro_batch_size)
                for i, micro in enumerate(micro_batches):
                    with optimizer.toggle_model(sync_grad=i == len(micro_batches) - 1):
                        loss, micro_stats = micro_batch_loss(rollout, micro, epoch == 0)
                        self.manual_backward(loss * len(micro) / mini_size)  # mean over the mini-batch
                    for key, value in micro_stats.items():
                        if key in EXTREMES:  # a min of mins, a max of maxes
                            totals[key] = EXTREMES[key](totals.get(key, value), value)
                        else:
                            totals[key] = totals.get(key, 0.0) + value * len(micro)
                self._optimizer_step(optimizer, last=epoch == cfg.num_ppo_epochs - 1 and m == cfg.num_mini_batches - 1)
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
        passes = {key: 1 if key.startswith(FIRST_PASS_PREFIXES) else cfg.num_ppo_epochs for key in totals}
        return {key: value if key in EXTREMES else value / (n * passes[key]) for key, value in totals.items()}

    def record_timings(self, timer: PhaseTimer, started: float, rollout_done: float) -> None:
        now = time.perf_counter()
        self.last_timings = dict(timer.seconds, rollout=rollout_done - started, update=now - rollout_done,
                                 step=now - started)

    def _optimizer_step(self, optimizer, last: bool) -> None:
        # Lightning counts every LightningOptimizer.step() as a global step; one rollout must be one step,
        # so the earlier updates of a rollout go through the strategy (same precision/scaler path) uncounted.
        if last:
            optimizer.step()
        else:
            self.trainer.strategy.optimizer_step(optimizer.optimizer, closure=lambda: None, model=self)

    def trained_parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.policy.parameters()

    def on_before_optimizer_step(self, optimizer) -> None:
        # here gradients are already unscaled under fp16, so clipping sees their true norm
        if self.config.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(list(self.trained_parameters()), self.config.max_grad_norm)
            self._last_grad_norm = float(norm)

    # ---- metrics -----------------------------------------------------------------------------------------
    def common_metrics(self, rollout: Rollout) -> dict[str, float | Tensor]:
        timings, tokens = self.last_timings, rollout.completion_mask.sum().item()
        metrics = {
            "completions/mean_length": rollout.lengths.float().mean(),
            "completions/eos_frac": rollout.ended_with_eos.float().mean(),
            "lr": self.lr_schedulers().get_last_lr()[0],
            "episode": float(self.episodes),
            "epoch": self.episodes / max(self._num_train_prompts() * self.config.k, 1),
            "time/tokens_per_second": tokens / max(timings.get("step", 0.0), 1e-9),
        }
        metrics.update({f"time/{phase}": seconds for phase, seconds in timings.items() if phase != "step"})
        if getattr(self, "_last_grad_norm", None) is not None:
            metrics["policy/grad_norm"] = self._last_grad_norm
        return metrics

    def log_metrics(self, metrics: dict, batch_size: int) -> None:
        metrics = {key: torch.as_tensor(value, dtype=torch.float32, device=self.device) for key, value in metrics.items()}
        self.log_dict(metrics, on_step=True, on_epoch=False, sync_dist=self.trainer.world_size > 1, batch_size=batch_size)
        self.log("score", metrics["objective/scores"], prog_bar=True, logger=False)
        self.log("kl", metrics["objective/kl"], prog_bar=True, logger=False)

    def _num_train_prompts(self) -> int:
        datamodule = getattr(self.trainer, "datamodule", None)
        return getattr(datamodule, "num_train_prompts", 0) or 0

    # ---- optimiser, checkpoints ----------------------------------------------------------------------------
    def configure_optimizers(self):
        cfg = self.config
        return adamw_with_schedule(self.trained_parameters(), cfg.lr, cfg.total_steps * cfg.updates_per_rollout,
                                   cfg.warmup_ratio, cfg.lr_schedule, cfg.weight_decay, cfg.adam_eps)

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # the reference and reward model never change: keep only what is trained (and the episode counter)
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k.startswith(self.trained_prefixes)}
        checkpoint["rloo_episodes"] = self.episodes

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.episodes = checkpoint.get("rloo_episodes", 0)

    def train(self, mode: bool = True):
        # Lightning switches modules to train mode each epoch; every model stays in eval (no dropout)
        super().train(mode)
        for model in self.children():
            model.eval()
        return self
