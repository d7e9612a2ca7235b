"""What every algorithm logs after a step: the names of its statistics, their micro-batch averages (`StepStats`),
the metrics common to all (lengths, counters, timings, memory) and the one call that logs them, averaged over ranks,
against the rollout."""

from __future__ import annotations

import time

import torch
from torch import Tensor

from rloo.generation.rollout import Rollout
from rloo.utils.errors import RewardFunctionError
from rloo.utils.memory import peak_rss_mb

# metric names of the statistics RLOO and PPO report: TRL's where the quantity is TRL's (docs/configuration.md maps
# every one)
METRIC_NAMES = {
    "entropy": "policy/entropy_avg",
    "entropy_seq": "objective/entropy",
    "loss": "loss/policy_avg",
    "clipfrac": "policy/clipfrac_avg",
    "token_clipfrac": "policy/token_clipfrac_avg",
    "approxkl": "policy/approxkl_avg",
    "first_epoch_clipfrac": "policy/clipfrac_first_epoch",
    "ratio": "val/ratio",
    "ratio_var": "val/ratio_var",
    "ratio_min": "policy/ratio_min",
    "ratio_max": "policy/ratio_max",
    "is_weight": "is/weight_mean",
    "is_raw_ratio_mean": "is/raw_ratio_mean",  # pi_learner / pi_behaviour, before truncation or masks
    "is_raw_ratio_min": "is/raw_ratio_min",
    "is_raw_ratio_max": "is/raw_ratio_max",
    "is_raw_cut_frac": "is/cut_frac",  # truncated (tis_*) or masked (mask_*, geometric)
    "kl_loss": "loss/kl_avg",
    "baseline": "objective/baseline",
    "mismatch_abs_mean": "mismatch/logprob_abs_mean",
    "mismatch_abs_max": "mismatch/logprob_abs_max",
    "mismatch_token_mult_prob_error": "mismatch/token_mult_prob_error",
    "mismatch_seq_log_ratio_mean": "mismatch/seq_log_ratio_mean",
    "mismatch_seq_log_ratio_min": "mismatch/seq_log_ratio_min",
    "mismatch_seq_log_ratio_max": "mismatch/seq_log_ratio_max",
}


class StepStats:
    """Statistics of the micro-batches of one step, averaged over their rows; the keys of `EXTREMES` keep the
    min (or max) instead, and those of `VARIANCES` also give `<key>_var`, the unbiased variance of their micro-batch
    values (TRL's val/ratio_var; 0 with one micro-batch). Values stay tensors until `means()`, so a step syncs with
    the device once."""

    EXTREMES = {"ratio_min": torch.minimum, "ratio_max": torch.maximum}
    VARIANCES = ("ratio",)

    def __init__(self):
        self.sums: dict[str, Tensor] = {}
        self.rows: dict[str, int] = {}
        self.values: dict[str, list[Tensor]] = {}

    def add(self, stats: dict[str, Tensor], rows: int) -> None:
        for key, value in stats.items():
            value = value.detach().float()
            if key in self.VARIANCES:
                self.values.setdefault(key, []).append(value)
            if key in self.EXTREMES:
                self.sums[key] = self.EXTREMES[key](self.sums[key], value) if key in self.sums else value
            else:
                self.sums[key] = self.sums.get(key, 0.0) + value * rows
                self.rows[key] = self.rows.get(key, 0) + rows

    def means(self) -> dict[str, float]:
        means = {
            key: (value if key in self.EXTREMES else value / self.rows[key]).item() for key, value in self.sums.items()
        }
        for key, values in self.values.items():
            means[f"{key}_var"] = torch.stack(values).var().item() if len(values) > 1 else 0.0
        return means


def common_metrics(module, rollout: Rollout) -> dict[str, float | Tensor]:
    """Lengths, counters, learning rate, timings, memory, reward terms and the gradient norm of the step just taken."""
    state, timings, tokens = module.state, module.last_timings, rollout.completion_mask.sum()
    metrics = {
        "completions/mean_length": rollout.lengths.float().mean(),
        "completions/eos_frac": rollout.ended_with_eos.float().mean(),
        "completions/clipped_ratio": 1.0 - rollout.ended_with_eos.float().mean(),  # cut at response_length
        "val/num_eos_tokens": rollout.ended_with_eos.float().sum(),  # this device's (averaged over devices)
        "lr": module.lr_schedulers().get_last_lr()[0],
        "train/rollout": float(state.rollouts),
        "guard/skipped_steps": float(state.skipped_updates),
        "guard/no_signal_rollouts": float(state.no_signal_rollouts),
        "episode": float(state.episodes),
        "eps": episodes_per_second(module),
        "train/epoch": epochs_done(module),
        "time/tokens_per_second": tokens / max(timings.get("step", 0.0), 1e-9),
        "memory/peak_rss_mb": peak_rss_mb(),  # this process so far (averaged over ranks when logged)
    }
    if torch.cuda.is_available():
        metrics["memory/peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    metrics.update({f"time/{phase}": seconds for phase, seconds in timings.items() if phase != "step"})
    metrics.update(module.reward_metrics(rollout))
    metrics.update(module.episode_metrics())
    metrics.update(module.async_metrics)  # a producer process's rollout: staleness, queue, each side's seconds
    if module.last_grad_norm is not None:
        metrics["policy/grad_norm"] = module.last_grad_norm
    return metrics


def log_metrics(module, metrics: dict, batch_size: int) -> None:
    """The step's metrics, averaged over ranks, to every logger at step = rollouts (as the evaluations), every
    log_every rollouts and at the last. Written inside the step, so a checkpoint taken as the step ends never
    precedes the row of its own rollout."""
    logged = module.last_notes.reward_logged  # the reward functions' log_metric means, under their names
    if clash := [name for name in logged if name in metrics]:
        raise RewardFunctionError(
            f"log_metric({clash[0]!r}, ...): rloo logs {clash[0]} itself: give the reward function's metric another "
            "name"
        )
    metrics = metrics | logged
    values = torch.stack(
        [torch.as_tensor(v, dtype=torch.float32, device=module.device).reshape(()) for v in metrics.values()]
    )
    if module.trainer.world_size > 1:
        values = module.trainer.strategy.reduce(values, reduce_op="mean")
    metrics = dict(zip(metrics, values))
    module.log("score", metrics["objective/scores"], prog_bar=True, logger=False, batch_size=batch_size)
    if "objective/kl" in metrics:  # algo=dpo samples from the reference: no KL of the policy's own samples
        module.log("kl", metrics["objective/kl"], prog_bar=True, logger=False, batch_size=batch_size)
    rollouts, config = module.state.rollouts, module.config
    module.last_metrics = metrics  # what a progress line shows (rloo.run.callbacks.ProgressLines reads a few)
    if rollouts % config.log_every == 0 or rollouts == config.total_rollouts:
        row = dict(zip(metrics, values.tolist()))  # one device sync
        for logger in module.loggers:
            logger.log_metrics(row, step=rollouts)
            logger.save()


def episodes_per_second(module) -> float:
    """TRL's eps: completions trained on per second of wall time since this process began training (evaluations
    and checkpoints included), all devices."""
    started, episodes_then = module.train_started
    return (module.state.episodes - episodes_then) / max(time.monotonic() - started, 1e-9)


def epochs_done(module) -> float:
    """Passes over the training prompts so far, fractional: completions trained on over k per prompt."""
    return module.state.episodes / max(num_train_prompts(module) * module.config.k, 1)


def num_train_prompts(module) -> int:
    datamodule = getattr(module.trainer, "datamodule", None)
    return getattr(datamodule, "num_train_prompts", 0) or 0
