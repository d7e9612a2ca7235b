"""What every online RL algorithm here shares: its settings, the rollout call, the policy forward, the
epoch / mini-batch / micro-batch schedule, the optimiser step, and the rollout / training mismatch diagnostics.

The algorithms (rloo.py, ppo.py) write their own `training_step` from these pieces, in order; the rollout itself
is rloo/rollout.py's, the same for all of them.

Steps. Lightning counts every optimiser step (`trainer.global_step`); one batch of the train loop is one
rollout, counted by `rollouts` and logged as `train/rollout`. With one update per rollout the two agree.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Iterator

import torch
from lightning import LightningModule
from torch import Tensor

from rloo.algorithms.optim import adamw_with_schedule
from rloo.errors import NonFiniteError
from rloo.lora import ADAPTER_MARK, has_adapters
from rloo.memory import peak_rss_mb
from rloo.objectives import importance_weights, logprob_mismatch, masked_mean
from rloo.resume import restore_rng_states, rng_states
from rloo.rewards import Reward
from rloo.rollout import PhaseTimer, Rollout, collect_rollout, completion_logprobs_and_entropy
from rloo.sampling import SamplingConfig
from rloo.sharding import shard_model

log = logging.getLogger("rloo")

# metric names of the statistics RLOO and PPO report
METRIC_NAMES = {"entropy": "objective/entropy", "loss": "loss/policy_avg", "clipfrac": "policy/clipfrac_avg",
                "token_clipfrac": "policy/token_clipfrac_avg", "approxkl": "policy/approxkl_avg",
                "first_epoch_clipfrac": "policy/clipfrac_first_epoch",
                "ratio": "policy/ratio", "ratio_min": "policy/ratio_min", "ratio_max": "policy/ratio_max",
                "is_weight": "is/weight_mean", "baseline": "objective/baseline",
                "mismatch_abs_mean": "mismatch/logprob_abs_mean", "mismatch_abs_max": "mismatch/logprob_abs_max",
                "mismatch_token_mult_prob_error": "mismatch/token_mult_prob_error",
                "mismatch_seq_log_ratio_mean": "mismatch/seq_log_ratio_mean",
                "mismatch_seq_log_ratio_min": "mismatch/seq_log_ratio_min",
                "mismatch_seq_log_ratio_max": "mismatch/seq_log_ratio_max"}


@dataclass(frozen=True)
class OnlineRLConfig:
    """The keys of conf/train.yaml every algorithm reads (documented there, with their defaults; typed and ranged
    in rloo.schema.CommonKeys); built from a checked config by rloo.config.algorithm_config."""
    k: int
    missing_eos_penalty: float | None
    num_ppo_epochs: int
    num_mini_batches: int
    sampling: SamplingConfig
    rollout_batch_size: int
    micro_batch_size: int
    generation_batch_size: int
    lr: float
    weight_decay: float
    adam_eps: float
    warmup_ratio: float
    lr_schedule: str
    max_grad_norm: float | None
    log_every: int
    max_bad_steps: int
    shared_prefix: bool
    total_rollouts: int            # from total_episodes, rollout_batch_size and the devices

    @property
    def updates_per_rollout(self) -> int:
        return self.num_ppo_epochs * self.num_mini_batches

    @property
    def reuses_rollout(self) -> bool:
        return self.updates_per_rollout > 1


@dataclass(frozen=True)
class PolicyGradientConfig(OnlineRLConfig):
    """Plus conf/algo/shared/policy_gradient.yaml: the algorithms that sample from the policy (RLOO's family, PPO)."""
    kl_coef: float
    kl_estimator: str
    normalize_advantages: bool
    clip_range: float
    old_logprobs: str
    is_correction: str
    is_cap: float
    is_low: float
    is_high: float
    log_histograms: bool


class StepStats:
    """Statistics of the micro-batches of one step, averaged over their rows; the keys of `EXTREMES` keep the
    min (or max) instead. Values stay tensors until `means()`, so a step syncs with the device once."""

    EXTREMES = {"ratio_min": torch.minimum, "ratio_max": torch.maximum}

    def __init__(self):
        self.sums: dict[str, Tensor] = {}
        self.rows: dict[str, int] = {}

    def add(self, stats: dict[str, Tensor], rows: int) -> None:
        for key, value in stats.items():
            value = value.detach().float()
            if key in self.EXTREMES:
                self.sums[key] = self.EXTREMES[key](self.sums[key], value) if key in self.sums else value
            else:
                self.sums[key] = self.sums.get(key, 0.0) + value * rows
                self.rows[key] = self.rows.get(key, 0) + rows

    def means(self) -> dict[str, float]:
        return {key: (value if key in self.EXTREMES else value / self.rows[key]).item() for key, value in self.sums.items()}


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
        self.rollouts = 0                    # rollouts trained on (Lightning's global_step counts optimiser steps)
        self.episodes = 0                    # completions trained on, summed over devices
        self.train_seconds = 0.0             # seconds spent in training steps (rollout and update; no evaluation)
        self.last_rollout: Rollout | None = None
        self.last_targets = None             # what the algorithm derived from it (RLOOTargets, PPOTargets)
        self.last_timings: dict[str, float] = {}  # seconds of the last step, by phase (rollout phases, update)
        self.last_mismatch: dict[str, Tensor] = {}  # per-token delta logp, sequence log-ratio (log_histograms)
        self._rng_before_rollout: dict | None = None  # random states as the current rollout began (rloo.resume)
        self._rng_to_restore: dict | None = None      # a checkpoint's, restored as training starts
        self._rollout_finished = True
        self.reward: Reward | None = None    # reward= other than the reward model alone (rloo.rewards); set by the builder
        self.skipped_updates = 0             # guard: optimiser steps taken without gradients (non-finite)
        self.bad_in_a_row = 0                # guard: rollouts in a row with a skipped update
        self._rollout_was_bad = False

    # ---- the pieces of a step, in the order a step uses them -------------------------------------------------
    def collect(self, batch: dict[str, Tensor], timer: PhaseTimer, sampler=None) -> Rollout:
        """The one rollout every algorithm uses: k completions per prompt, reference log-probs, scores. The policy
        samples them, or `sampler` (algo=dpo: the frozen reference, for offline pairs)."""
        cfg = self.config
        reward_model = self.reward_model if self.reward is None or self.reward.uses_model else None
        rollout = collect_rollout(sampler or self.policy, self.reference, reward_model, batch["prompt_ids"],
                                  batch["prompt_mask"], cfg.k, cfg.sampling, self.tokenizer.eos_token_id,
                                  self.tokenizer.pad_token_id, cfg.generation_batch_size, timer=timer,
                                  share_prompts=cfg.shared_prefix)
        if self.reward is not None:  # the functions of reward= see text: prompts and completions, decoded
            with timer("reward_functions"):
                prompts = self.tokenizer.batch_decode(rollout.prompt_ids, skip_special_tokens=True)
                completions = self.tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
                rollout.scores = self.reward(prompts, completions, rollout.scores).to(rollout.scores.device)
        return rollout

    def masks_bad_scores(self) -> bool:
        """reward_errors=mask: completions without a finite score leave the baseline instead of stopping the run."""
        return self.reward is not None and self.reward.on_error == "mask"

    def reward_metrics(self, rollout: Rollout) -> dict[str, float]:
        if self.reward is None:
            return {}
        metrics = {f"reward/{name.rsplit(':', 1)[-1]}": mean for name, mean in self.reward.last_term_means.items()}
        if self.masks_bad_scores():
            metrics["reward/masked"] = float((~torch.isfinite(rollout.scores)).sum())
        return metrics

    def policy_forward(self, rollout: Rollout, with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
        """log pi(y_t | .) `[n, T]` (with gradient) and the per-token entropy `[n, T]` of the policy as it is now
        (None without `with_entropy`)."""
        cfg = self.config
        return completion_logprobs_and_entropy(self.policy, rollout.input_ids, rollout.attention_mask,
                                               rollout.completion_ids, rollout.completion_mask, cfg.sampling.temperature,
                                               with_entropy=with_entropy, group_size=cfg.k if cfg.shared_prefix else 1)

    @torch.no_grad()
    def rollout_policy_forward(self, rollout: Rollout) -> tuple[Tensor, Tensor]:
        """`policy_forward` of the whole rollout before any optimiser step, in chunks of generation_batch_size:
        the training-style log-probs of the policy that sampled it `[N, T]` (float32), and its entropy."""
        size, parts = self.config.generation_batch_size, []
        for start in range(0, len(rollout), size):
            parts.append(self.policy_forward(rollout.select(slice(start, start + size))))
        return torch.cat([p[0] for p in parts]).float(), torch.cat([p[1] for p in parts]).float()

    def mini_batches(self, n: int, shuffle: bool) -> Iterator[list[Tensor]]:
        """One pass over n rollout rows: num_mini_batches mini-batches, each a list of micro-batch row indices.
        Without `shuffle` rows keep their prompt-major order, so micro-batches hold whole prompt groups. With it,
        whole groups are shuffled where micro-batches hold whole groups (the prompt then runs once per group in
        the update too, shared_prefix), else single rows."""
        cfg = self.config
        k = cfg.k
        whole_groups = cfg.shared_prefix and k > 1 and cfg.micro_batch_size % k == 0 and (n // cfg.num_mini_batches) % k == 0
        if shuffle and whole_groups:
            groups = torch.randperm(n // k, device=self.device)
            order = (groups[:, None] * k + torch.arange(k, device=self.device)).flatten()
        else:
            order = torch.randperm(n, device=self.device) if shuffle else torch.arange(n, device=self.device)
        for mini in order.split(n // cfg.num_mini_batches):
            yield list(mini.split(cfg.micro_batch_size))

    def correction_weights(self, part: Rollout, rollout_policy_logprobs: Tensor) -> tuple[Tensor | None, Tensor | None, dict]:
        """The weights of is_correction for a micro-batch: pi_train / pi_rollout at the rollout policy."""
        cfg = self.config
        token_w, sequence_w = importance_weights(rollout_policy_logprobs, part.generation_logprobs, part.completion_mask,
                                                 cfg.is_correction, cfg.is_cap, cfg.is_low, cfg.is_high)
        if token_w is not None:
            return token_w, None, {"is_weight": token_w.sum() / part.completion_mask.sum().clamp(min=1)}
        if sequence_w is not None:
            return None, sequence_w, {"is_weight": sequence_w.mean()}
        return None, None, {}

    def accumulate_gradients(self, loss: Tensor, rows: int, last_of_mini_batch: bool) -> None:
        """Accumulate the gradient of a micro-batch's mean loss as its share of the mini-batch mean. Gradients are
        reduced across ranks after the last micro-batch of a mini-batch only (DDP: no_sync; FSDP2: its own switch)."""
        optimizer = self.optimizers()
        if hasattr(self.policy, "set_requires_gradient_sync"):  # FSDP2 (shard_model)
            self.policy.set_requires_gradient_sync(last_of_mini_batch)
        engine = self.deepspeed_engine()
        if engine is not None:  # DeepSpeed reduces and may step only at a boundary it is told of, before the backward
            engine.set_gradient_accumulation_boundary(last_of_mini_batch)
        with optimizer.toggle_model(sync_grad=last_of_mini_batch):
            self.manual_backward(loss * rows / (self.config.rollout_batch_size // self.config.num_mini_batches))

    def step_optimizer(self) -> None:
        """One optimiser step (Lightning counts it in global_step), the schedule, and fresh gradients."""
        optimizer = self.optimizers()
        optimizer.step()
        engine = self.deepspeed_engine()
        if engine is not None:  # the norm DeepSpeed clipped by in that step (None before its first)
            norm = engine.get_global_grad_norm()
            self._last_grad_norm = torch.as_tensor(float("nan") if norm is None else float(norm))
        self.lr_schedulers().step()
        optimizer.zero_grad(set_to_none=True)

    def deepspeed_engine(self):
        """The DeepSpeed engine under a DeepSpeed strategy, else None. It holds the gradients (not `p.grad`), clips
        them in its step (gradient_clipping, rloo.assemble.deepspeed_settings) and reduces them at boundaries."""
        return getattr(self.trainer.strategy, "deepspeed_engine", None) if self._trainer is not None else None

    def rollout_diagnostics(self, rollout: Rollout, rollout_policy_logprobs: Tensor, entropy: Tensor) -> dict[str, Tensor]:
        """The training forward at the rollout policy against the sampler (mismatch/*), and the policy's entropy.

        Both must be measured before the policy moves: from the update's forward when each rollout is used once,
        else from the forward that precedes the first optimiser step.
        """
        mask = rollout.completion_mask
        stats = {f"mismatch_{key}": value for key, value in
                 logprob_mismatch(rollout_policy_logprobs, rollout.generation_logprobs, mask).items()}
        stats["entropy"] = masked_mean(entropy, mask)
        if self.config.log_histograms:  # for the W&B histograms (rloo.callbacks.MismatchHistograms)
            delta = (rollout_policy_logprobs - rollout.generation_logprobs) * mask
            self.last_mismatch = {"delta_logp": delta[mask.bool()].float().cpu(), "seq_log_ratio": delta.sum(1).float().cpu()}
        return stats

    def finish_step(self, rollout: Rollout, targets, timer: PhaseTimer, started: float, rollout_done: float) -> None:
        now = time.perf_counter()
        self.last_timings = dict(timer.seconds, rollout=rollout_done - started, update=now - rollout_done,
                                 step=now - started)
        self.rollouts += 1
        self.episodes += len(rollout) * self.trainer.world_size
        self.train_seconds += now - started
        self._rollout_finished = True
        self.check_guard()
        self.last_rollout, self.last_targets = rollout, targets

    def trained_parameters(self) -> Iterator[torch.nn.Parameter]:
        return (p for p in self.policy.parameters() if p.requires_grad)  # with LoRA, the adapters only

    def on_before_optimizer_step(self, optimizer) -> None:
        if self.deepspeed_engine() is not None:  # DeepSpeed clips inside its step; p.grad holds nothing here
            return
        # here gradients are already unscaled under fp16, so clipping sees their true norm
        params = [p for p in self.trained_parameters() if p.grad is not None]
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # the norm before clipping
        if hasattr(norm, "full_tensor"):  # FSDP2: the norm over every rank's shards, as a DTensor
            norm = norm.full_tensor()
        if params and not torch.isfinite(norm) and not self.loss_scaled():
            # guard: a non-finite loss or gradient. Without gradients AdamW leaves every weight and moment as it is;
            # Lightning still counts the step, so the schedule and the checkpoints' step counts stay regular
            for p in params:
                p.grad = None
            self.skipped_updates += 1
            self._rollout_was_bad = True
        self._last_grad_norm = norm

    def loss_scaled(self) -> bool:
        """fp16 with a GradScaler: a non-finite gradient is the scaler's to handle (it skips that step and lowers the
        scale, as it must while it finds its scale); the guard would take the gradients its step needs to see."""
        return self._trainer is not None and getattr(self.trainer.precision_plugin, "scaler", None) is not None

    # ---- guards ----------------------------------------------------------------------------------------------
    def scores_are_finite(self, rollout: Rollout) -> bool:
        return bool(torch.isfinite(rollout.scores).all())

    def skip_rollout(self, rollout: Rollout, timer: PhaseTimer, started: float) -> None:
        """Guard: the reward model scored some completion nan or inf. No update learns from this rollout; its
        optimiser steps are taken without gradients (weights unchanged), and it is counted."""
        for _ in range(self.config.updates_per_rollout):
            self.optimizers().zero_grad(set_to_none=True)
            self.step_optimizer()
        self.skipped_updates += self.config.updates_per_rollout
        self._rollout_was_bad = True
        bad = (~torch.isfinite(rollout.scores)).sum().item()
        log.warning(f"guard: rollout {self.rollouts + 1}: {bad} of {len(rollout)} scores are not finite; update skipped")
        self.finish_step(rollout, None, timer, started, time.perf_counter())
        metrics = {"objective/scores": rollout.scores[torch.isfinite(rollout.scores)].mean(),  # nan when none is
                   "objective/kl": 0.0, "guard/nonfinite_scores": float(bad)}
        self.log_metrics(self.common_metrics(rollout) | metrics, batch_size=len(rollout))

    def check_guard(self) -> None:
        """After each rollout: count rollouts with a skipped update in a row, and stop after max_bad_steps."""
        self.bad_in_a_row = self.bad_in_a_row + 1 if self._rollout_was_bad else 0
        if self.bad_in_a_row >= self.config.max_bad_steps:
            raise NonFiniteError(
                f"{self.bad_in_a_row} rollouts in a row (max_bad_steps={self.config.max_bad_steps}) had non-finite "
                f"scores, loss or gradient norm, up to rollout {self.rollouts}; stopped with the weights of the last "
                "good update (no non-finite weights saved). Check the reward model / reward function and lr")

    # ---- metrics -----------------------------------------------------------------------------------------
    def common_metrics(self, rollout: Rollout) -> dict[str, float | Tensor]:
        timings, tokens = self.last_timings, rollout.completion_mask.sum()
        metrics = {
            "completions/mean_length": rollout.lengths.float().mean(),
            "completions/eos_frac": rollout.ended_with_eos.float().mean(),
            "train/lr": self.lr_schedulers().get_last_lr()[0],
            "train/rollout": float(self.rollouts),
            "guard/skipped_steps": float(self.skipped_updates),
            "train/episode": float(self.episodes),
            "train/epoch": self.episodes / max(self._num_train_prompts() * self.config.k, 1),
            "time/tokens_per_second": tokens / max(timings.get("step", 0.0), 1e-9),
            "memory/peak_rss_mb": peak_rss_mb(),  # this process so far (averaged over ranks when logged)
        }
        if torch.cuda.is_available():
            metrics["memory/peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        metrics.update({f"time/{phase}": seconds for phase, seconds in timings.items() if phase != "step"})
        metrics.update(self.reward_metrics(rollout))
        if getattr(self, "_last_grad_norm", None) is not None:
            metrics["policy/grad_norm"] = self._last_grad_norm
        return metrics

    def log_metrics(self, metrics: dict, batch_size: int) -> None:
        """The step's metrics, averaged over ranks, to every logger at step = rollouts (as the evaluations), every
        log_every rollouts and at the last. Written here, inside the step, so a checkpoint taken as the step ends
        never precedes the row of its own rollout."""
        values = torch.stack([torch.as_tensor(v, dtype=torch.float32, device=self.device).reshape(()) for v in metrics.values()])
        if self.trainer.world_size > 1:
            values = self.trainer.strategy.reduce(values, reduce_op="mean")
        metrics = dict(zip(metrics, values))
        self.log("score", metrics["objective/scores"], prog_bar=True, logger=False, batch_size=batch_size)
        if "objective/kl" in metrics:  # algo=dpo samples from the reference: no KL of the policy's own samples
            self.log("kl", metrics["objective/kl"], prog_bar=True, logger=False, batch_size=batch_size)
        if self.rollouts % self.config.log_every == 0 or self.rollouts == self.config.total_rollouts:
            row = dict(zip(metrics, values.tolist()))  # one device sync
            for logger in self.loggers:
                logger.log_metrics(row, step=self.rollouts)
                logger.save()

    def _num_train_prompts(self) -> int:
        datamodule = getattr(self.trainer, "datamodule", None)
        return getattr(datamodule, "num_train_prompts", 0) or 0

    # ---- sharding, optimiser, checkpoints -------------------------------------------------------------------
    def configure_model(self) -> None:
        """trainer.strategy=fsdp2 (Lightning's ModelParallelStrategy): the policy sharded block by block over the
        data-parallel ranks before the optimiser is built. The frozen reference and reward model stay whole on each
        rank. Other strategies wrap the module themselves."""
        from lightning.pytorch.strategies import ModelParallelStrategy

        if isinstance(self.trainer.strategy, ModelParallelStrategy) and not hasattr(self.policy, "unshard"):
            shard_model(self.policy, self.device_mesh["data_parallel"])

    def configure_optimizers(self):
        cfg = self.config
        return adamw_with_schedule(self.trained_parameters(), cfg.lr, cfg.total_rollouts * cfg.updates_per_rollout,
                                   cfg.warmup_ratio, cfg.lr_schedule, cfg.weight_decay, cfg.adam_eps)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        # a checkpoint taken inside this rollout (Ctrl-C, an error) resumes by redoing it, from these states
        self._rng_before_rollout, self._rollout_finished = rng_states(), False
        self._rollout_was_bad = False

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # the reference and reward model never change: keep only what is trained (and the counters)
        state = {k: v for k, v in checkpoint["state_dict"].items() if k.startswith(self.trained_prefixes)}
        if has_adapters(self.policy):  # LoRA: the frozen base is the model every run loads; the adapters are trained
            state = {k: v for k, v in state.items() if not k.startswith("policy.") or ADAPTER_MARK in k}
        checkpoint["state_dict"] = state
        checkpoint["rloo_episodes"] = self.episodes
        checkpoint["rloo_train_seconds"] = self.train_seconds
        checkpoint["rloo_rollouts"] = self.rollouts
        checkpoint["rloo_guard"] = {"skipped_updates": self.skipped_updates, "bad_in_a_row": self.bad_in_a_row}
        states = rng_states() if self._rollout_finished else self._rng_before_rollout
        checkpoint["rloo_rng"] = states
        if self.trainer.world_size > 1:  # every rank samples from its own generators: keep each rank's (a collective)
            by_rank = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(by_rank, states)
            checkpoint["rloo_rng_by_rank"] = by_rank

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.episodes = checkpoint.get("rloo_episodes", 0)
        self.train_seconds = checkpoint.get("rloo_train_seconds", 0.0)
        self.rollouts = checkpoint.get("rloo_rollouts", 0)
        guard = checkpoint.get("rloo_guard", {})
        self.skipped_updates, self.bad_in_a_row = guard.get("skipped_updates", 0), guard.get("bad_in_a_row", 0)
        by_rank = checkpoint.get("rloo_rng_by_rank") or []
        same_world = len(by_rank) == self.trainer.world_size
        self._rng_to_restore = by_rank[self.trainer.global_rank] if same_world else checkpoint.get("rloo_rng")

    def on_train_start(self) -> None:
        """On resume: the random states of the checkpoint (as late as possible: nothing draws after this before the
        next rollout), and a learning rate changed since the checkpoint, applied from here on and said."""
        if self._rng_to_restore is not None:
            restore_rng_states(self._rng_to_restore)
            self._rng_to_restore = None
        for scheduler in self.trainer.lr_scheduler_configs:
            scheduler = scheduler.scheduler
            if scheduler.base_lrs != [self.config.lr] * len(scheduler.base_lrs):
                log.info(f"resume: lr {scheduler.base_lrs[0]:g} -> {self.config.lr:g} from optimiser step "
                         f"{self.trainer.global_step} on (the schedule's shape is kept)")
                scheduler.base_lrs = [self.config.lr] * len(scheduler.base_lrs)
                for group, factor in zip(scheduler.optimizer.param_groups, scheduler.lr_lambdas):  # a LambdaLR
                    group["lr"] = self.config.lr * factor(scheduler.last_epoch)
                scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]

    def train(self, mode: bool = True):
        # Lightning switches modules to train mode each epoch; every model stays in eval (no dropout)
        super().train(mode)
        for model in self.children():
            model.eval()
        return self
