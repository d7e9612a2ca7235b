"""What every online RL algorithm here shares: its settings, the rollout call, the policy forward, the
epoch / mini-batch / micro-batch schedule, the optimiser step, and the rollout / training mismatch diagnostics.

The algorithms (policy_gradient.py, ppo.py, dpo.py) write their own `training_step` from these pieces, in order; the
rollout itself is rloo/generation/rollout.py's, the same for all of them.

Steps. Lightning counts every optimiser step (`trainer.global_step`); one batch of the train loop is one
rollout, counted by `rollouts` and logged as `train/rollout`. With one update per rollout the two agree.
"""

from __future__ import annotations

import logging
import time
from typing import Iterator

import torch
from lightning import LightningModule
from torch import Tensor

from rloo.algorithms.asynchrony import CHECKPOINT_KEY as ASYNC_CHECKPOINT_KEY
from rloo.algorithms.asynchrony import checkpoint_state, collect_from_producer, start_producer
from rloo.algorithms.configs import OnlineRLConfig
from rloo.algorithms.metrics import common_metrics, log_metrics
from rloo.algorithms.optim import adamw_with_schedule
from rloo.algorithms.run_state import RunState
from rloo.algorithms.schedule import MicroBatch, StrategyAdapter, micro_batches, mini_batch_indices
from rloo.generation.forward import completion_logprobs_and_entropy
from rloo.generation.rollout import PhaseTimer, Rollout, clock
from rloo.models.lora import ADAPTER_MARK, has_adapters
from rloo.models.sharding import GATHERS, gather_fits, shard_model, whole_bytes
from rloo.objectives import (
    apply_missing_eos_penalty,
    group_reward_std,
    importance_ratio_stats,
    importance_weights,
    logprob_mismatch,
    masked_mean,
    masked_sum,
)
from rloo.rewards.scoring import Reward
from rloo.service.episodes import EpisodeService, RolloutNotes
from rloo.utils.errors import NoLearningSignal, NonFiniteError

log = logging.getLogger("rloo")


class OnlineRLModule(LightningModule):
    """Holds the trained policy, the frozen reference and the frozen reward model (and whatever else an
    algorithm trains, see `trained_prefixes`). Subclasses write `training_step`."""

    trained_prefixes: tuple[str, ...] = ("policy.",)  # state_dict entries a checkpoint keeps

    def __init__(self, policy, reference, reward_model, tokenizer, config: OnlineRLConfig):
        super().__init__()
        self.policy, self.reference, self.reward_model = policy, reference, reward_model
        self.tokenizer, self.config = tokenizer, config
        self.automatic_optimization = False  # several optimiser steps per rollout
        self.strict_loading = False  # checkpoints hold the trained models only (see on_save_checkpoint)
        self.policy.eval()  # no dropout: on-policy the ratio must be exactly 1
        self.state = RunState()  # counters, guard, random states: what checkpoints carry
        self.strategy = StrategyAdapter(self)  # what differs by strategy in accumulation and optimiser steps
        # rows in, scored Rollouts out: environments, reward functions and an external harness are its (the builder
        # sets them: rloo.run.assemble.build_module)
        self.episode_service = EpisodeService(
            tokenizer,
            reference,
            reward_model,
            config.k,
            config.sampling,
            config.generation_batch_size,
            config.shared_prefix,
        )
        # max_staleness > 0 or producer=process: the service runs in a producer process beside this one, started
        # with training (rloo.algorithms.asynchrony); the builder sets what it builds there and its threads
        self.producer = None
        self.producer_parts, self.producer_threads = None, 1
        self.async_saved: dict | None = None  # a checkpoint's in-flight state, until the producer starts from it
        self.async_metrics: dict = {}  # the last rollout's staleness, queue and sides' seconds
        self.last_rollout: Rollout | None = None
        self.last_notes = RolloutNotes()  # the last rollout's episodes and what its reward functions logged
        self.last_targets = None  # what the algorithm derived from it (StepTargets, PPOTargets)
        self.sampled_in_rollout: int | None = None  # completions generated for this rollout, where more than it holds
        self.last_timings: dict[str, float] = {}  # seconds of the last step, by phase (rollout phases, update)
        self.last_mismatch: dict[str, Tensor] = {}  # per-token delta logp, sequence log-ratio (log_histograms)
        self.last_grad_norm: Tensor | None = None  # of the last optimiser step, before clipping
        self.train_started = (time.monotonic(), 0)  # (when, episodes then) this process began training: eps
        self.sampler_note: tuple[str, str] | None = None  # the sampler, where the run changes it from the planned one

    # ---- the pieces of a step, in the order a step uses them -------------------------------------------------
    def collect(self, batch: dict[str, Tensor], timer: PhaseTimer, sampler=None) -> Rollout:
        """The one rollout every algorithm uses (rloo.service.episodes.EpisodeService.rollout): k episodes per
        prompt, sampled by the policy as it is now (version `state.rollouts`) or by `sampler` (algo=dpo: the frozen
        reference, for offline pairs), the reference's log-probs and the scores."""
        if self.producer is not None and sampler is None:  # sampled and scored beside the learner
            return collect_from_producer(self, batch, timer)
        service = self.episode_service
        rollout, self.last_notes = service.rollout(
            self.policy,
            batch,
            timer,
            self.state.rollouts,
            sampler=sampler,
            harness=self,  # rollout=module:function is handed the module, as TRL hands its trainer
            trainer_state=self.trainer_state() if service.reward is not None else None,
        )
        return rollout

    @property
    def reward(self) -> Reward | None:
        """reward= other than the reward model alone (rloo.rewards.scoring), the episode service's."""
        return self.episode_service.reward

    @property
    def environment(self):
        """env=: the episode service's rloo.environments.base.EnvironmentSpec (None: plain completions)."""
        return self.episode_service.environment

    def masks_bad_scores(self) -> bool:
        """reward_errors=mask: completions without a finite score leave the baseline instead of stopping the run."""
        return self.reward is not None and self.reward.on_error == "mask"

    def trainer_state(self):
        """Where training stands, for reward functions that take TRL's `trainer_state`."""
        from rloo.algorithms.metrics import epochs_done
        from rloo.rewards.trl_arguments import TrainerState

        state = self.state
        return TrainerState(
            self.trainer.global_step, epochs_done(self), self.trainer.max_steps, state.rollouts, state.episodes
        )

    def reward_metrics(self, rollout: Rollout) -> dict[str, float]:
        if self.reward is None:
            return {}
        notes = self.last_notes  # what the rollout's reward functions gave (here, or in a producer process)
        metrics = {f"reward/{name.rsplit(':', 1)[-1]}": mean for name, mean in notes.reward_terms.items()}
        for name, count in notes.not_applicable.items():  # the completions a function returned None for
            metrics[f"reward/none/{name.rsplit(':', 1)[-1]}"] = float(count)
        if self.masks_bad_scores():
            metrics["reward/masked"] = float((~torch.isfinite(rollout.scores)).sum())
        return metrics

    def episode_metrics(self) -> dict[str, float]:
        """With env=: the last rollout's model turns per episode, the fraction cut by max_turns or the token budget
        (env/truncated), and the means of what the environment's info reported (env/<name>)."""
        episodes = self.last_notes.episodes
        if self.environment is None or not episodes:
            return {}
        metrics = {
            "env/turns": sum(e.turns for e in episodes) / len(episodes),
            "env/truncated": sum(e.truncated for e in episodes) / len(episodes),
            "env/replied": sum(e.replied for e in episodes) / len(episodes),
        }
        for name in sorted({name for e in episodes for name in e.info}):
            values = [e.info[name] for e in episodes if name in e.info]
            metrics[f"env/{name}"] = sum(values) / len(values)
        return metrics

    def policy_forward(self, rollout: Rollout, with_entropy: bool = True) -> tuple[Tensor, Tensor | None]:
        """log pi(y_t | .) `[n, T]` (with gradient) and the per-token entropy `[n, T]` of the policy as it is now
        (None without `with_entropy`)."""
        cfg = self.config
        return completion_logprobs_and_entropy(
            self.policy,
            rollout.input_ids,
            rollout.attention_mask,
            rollout.completion_ids,
            rollout.completion_mask,
            cfg.sampling.temperature,
            with_entropy=with_entropy,
            group_size=cfg.k if cfg.shared_prefix else 1,
        )

    @torch.no_grad()
    def rollout_policy_forward(self, rollout: Rollout) -> tuple[Tensor, Tensor]:
        """`policy_forward` of the whole rollout before any optimiser step, in chunks of generation_batch_size:
        the training-style log-probs of the policy that sampled it `[N, T]` (float32), and its entropy."""
        size, parts = self.config.generation_batch_size, []
        for start in range(0, len(rollout), size):
            parts.append(self.policy_forward(rollout.select(slice(start, start + size))))
        return torch.cat([p[0] for p in parts]).float(), torch.cat([p[1] for p in parts]).float()

    def mini_batches(self, n: int, shuffle: bool) -> Iterator[list[Tensor]]:
        """One pass over n rollout rows: num_mini_batches lists of micro-batch row indices (rloo.algorithms.schedule);
        shuffled by whole prompt groups where micro-batches hold whole groups (shared_prefix)."""
        cfg = self.config
        whole_groups = (
            cfg.shared_prefix
            and cfg.k > 1
            and cfg.micro_batch_size % cfg.k == 0
            and (n // cfg.num_mini_batches) % cfg.k == 0
        )
        return mini_batch_indices(
            n, cfg.k, cfg.micro_batch_size, cfg.num_mini_batches, whole_groups, shuffle, self.device
        )

    def update_micro_batches(self, n: int, shuffle: bool, epochs: int | None = None) -> Iterator[MicroBatch]:
        """The update over n rollout rows: `epochs` (num_ppo_epochs) passes of `mini_batches`, the optimiser
        stepped after each mini-batch (rloo.algorithms.schedule.micro_batches)."""
        epochs = self.config.num_ppo_epochs if epochs is None else epochs
        return micro_batches((self.mini_batches(n, shuffle) for _ in range(epochs)), self.step_optimizer)

    def correction_weights(
        self, part: Rollout, rollout_policy_logprobs: Tensor
    ) -> tuple[Tensor | None, Tensor | None, dict]:
        """The weights of is_correction for a micro-batch: pi_train / pi_rollout at the rollout policy."""
        cfg = self.config
        token_w, sequence_w = importance_weights(
            rollout_policy_logprobs,
            part.generation_logprobs,
            part.completion_mask,
            cfg.is_correction,
            cfg.is_cap,
            cfg.is_low,
            cfg.is_high,
        )
        if token_w is not None:
            return token_w, None, {"is_weight": token_w.sum() / part.completion_mask.sum().clamp(min=1)}
        if sequence_w is not None:
            return None, sequence_w, {"is_weight": sequence_w.mean()}
        return None, None, {}

    def accumulate_gradients(self, loss: Tensor, micro: MicroBatch, share: float | None = None) -> None:
        """Accumulate the gradient of a micro-batch's mean loss as its share of the mini-batch mean (its share of the
        rows, unless `share` says otherwise: of the tokens, for a token mean); gradients are reduced across ranks
        after the last micro-batch of a mini-batch only."""
        if share is None:
            share = len(micro.index) / (self.config.rollout_batch_size // self.config.num_mini_batches)
        with self.strategy.backward_sync(micro.last_of_mini_batch):
            self.manual_backward(loss * share)

    def penalised_scores(self, rollout: Rollout) -> Tensor:
        """The rollout's scores after the missing-EOS rule (missing_eos_penalty subtracted, or missing_eos_score in
        place of the score), [N]."""
        cfg = self.config
        return apply_missing_eos_penalty(
            rollout.scores, rollout.ended_with_eos, cfg.missing_eos_penalty, cfg.missing_eos_score
        )

    def step_optimizer(self) -> None:
        """One optimiser step (Lightning counts it in global_step), the schedule (unless it counts rollouts), and
        fresh gradients."""
        optimizer = self.optimizers()
        optimizer.step()
        if (norm := self.strategy.grad_norm_of_last_step()) is not None:
            self.last_grad_norm = norm
        if self.config.lr_schedule_per == "optimizer_step":
            self.lr_schedulers().step()
        optimizer.zero_grad(set_to_none=True)

    def rollout_diagnostics(
        self, rollout: Rollout, rollout_policy_logprobs: Tensor, entropy: Tensor
    ) -> dict[str, Tensor]:
        """The training forward at the rollout policy against the sampler (mismatch/*), and the policy's entropy.

        Both must be measured before the policy moves: from the update's forward when each rollout is used once,
        else from the forward that precedes the first optimiser step.
        """
        mask = rollout.completion_mask
        stats = {
            f"mismatch_{key}": value
            for key, value in logprob_mismatch(rollout_policy_logprobs, rollout.generation_logprobs, mask).items()
        }
        cfg = self.config
        raw = importance_ratio_stats(  # pi_learner / pi_behaviour before is_correction truncates or masks it
            rollout_policy_logprobs,
            rollout.generation_logprobs,
            mask,
            cfg.is_correction,
            cfg.is_cap,
            cfg.is_low,
            cfg.is_high,
        )
        stats |= {f"is_raw_{key}": value for key, value in raw.items()}
        stats["entropy"] = masked_mean(entropy, mask)  # of the distribution, per token (TRL: policy/entropy_avg)
        stats["entropy_seq"] = masked_sum(-rollout_policy_logprobs, mask, dim=1).mean()  # TRL: objective/entropy
        if self.config.log_histograms:  # for the W&B histograms (rloo.run.callbacks.MismatchHistograms)
            delta = (rollout_policy_logprobs - rollout.generation_logprobs) * mask
            self.last_mismatch = {
                "delta_logp": delta[mask.bool()].float().cpu(),
                "seq_log_ratio": delta.sum(1).float().cpu(),
            }
        return stats

    def finish_step(self, rollout: Rollout, targets, timer: PhaseTimer, started: float, rollout_done: float) -> None:
        now = clock()
        self.last_timings = dict(
            timer.seconds, rollout=rollout_done - started, update=now - rollout_done, step=now - started
        )
        sampled, self.sampled_in_rollout = self.sampled_in_rollout or len(rollout), None
        world = self.trainer.world_size
        self.state.finish_rollout(len(rollout) * world, now - started, sampled * world)
        if self.config.budget == "sampled" and self.state.sampled >= self.config.total_rollouts * len(rollout) * world:
            self.trainer.should_stop = True  # the budget counts generated completions: spent
        if self.config.lr_schedule_per == "rollout":  # TRL's RLOO: once per rollout, after all its optimiser steps
            self.lr_schedulers().step()
        if targets is not None:  # a rollout the guard skipped has its own count
            self.check_learning_signal(rollout)
        self.check_guard()
        self.last_rollout, self.last_targets = rollout, targets

    def trained_parameters(self) -> Iterator[torch.nn.Parameter]:
        return (p for p in self.policy.parameters() if p.requires_grad)  # with LoRA, the adapters only

    def on_before_optimizer_step(self, optimizer) -> None:
        if self.strategy.clips_itself:  # DeepSpeed clips inside its step; p.grad holds nothing here
            return
        # here gradients are already unscaled under fp16, so clipping sees their true norm
        params = [p for p in self.trained_parameters() if p.grad is not None]
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm is not None else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # the norm before clipping
        if hasattr(norm, "full_tensor"):  # FSDP2: the norm over every rank's shards, as a DTensor
            norm = norm.full_tensor()
        if params and not torch.isfinite(norm) and not self.strategy.loss_scaled():
            # guard: a non-finite loss or gradient. Without gradients AdamW leaves every weight and moment as it is;
            # Lightning still counts the step, so the schedule and the checkpoints' step counts stay regular
            for p in params:
                p.grad = None
            self.state.skipped_updates += 1
            self.state.rollout_was_bad = True
        self.last_grad_norm = norm

    # ---- guards ----------------------------------------------------------------------------------------------
    def scores_are_finite(self, rollout: Rollout) -> bool:
        return bool(torch.isfinite(rollout.scores).all())

    def skip_rollout(self, rollout: Rollout, timer: PhaseTimer, started: float) -> None:
        """Guard: the reward model scored some completion nan or inf. No update learns from this rollout; its
        optimiser steps are taken without gradients (weights unchanged), and it is counted."""
        for _ in range(self.config.updates_per_rollout):
            self.optimizers().zero_grad(set_to_none=True)
            self.step_optimizer()
        self.state.skipped_updates += self.config.updates_per_rollout
        self.state.rollout_was_bad = True
        bad = (~torch.isfinite(rollout.scores)).sum().item()
        log.warning(
            f"guard: rollout {self.state.rollouts + 1}: {bad} of {len(rollout)} scores are not finite; update skipped"
        )
        self.finish_step(rollout, None, timer, started, clock())
        metrics = {
            "objective/scores": rollout.scores[torch.isfinite(rollout.scores)].mean(),  # nan when none is
            "objective/kl": 0.0,
            "guard/nonfinite_scores": float(bad),
        }
        log_metrics(self, common_metrics(self, rollout) | metrics, batch_size=len(rollout))

    def check_learning_signal(self, rollout: Rollout) -> None:
        """A rollout in which no prompt's k completions differ in score (every group's std 0, on every rank) teaches
        nothing from the reward: said, counted, and max_no_signal_steps in a row stop the run (a constant or broken
        reward, a task the policy always or never solves). One completion per prompt has no group to ask."""
        cfg = self.config
        if cfg.k < 2:
            return
        spread = (group_reward_std(self.penalised_scores(rollout), cfg.k) > 1e-6).any().float()  # nan std: none
        if self.trainer.world_size > 1:
            spread = self.trainer.strategy.reduce(spread, reduce_op="sum")
        self.state.note_signal(bool(spread > 0))
        if spread > 0:
            return
        log.warning(  # not "rollout N: ...": progress lines start so
            f"no learning signal in rollout {self.state.rollouts}: no prompt's {cfg.k} completions differ in score "
            f"({self.state.no_signal_in_a_row} in a row; max_no_signal_steps={cfg.max_no_signal_steps} stop the run)"
        )
        if self.state.no_signal_in_a_row >= cfg.max_no_signal_steps:
            raise NoLearningSignal(
                f"{self.state.no_signal_in_a_row} rollouts in a row (max_no_signal_steps={cfg.max_no_signal_steps}) "
                f"had no prompt whose {cfg.k} completions differ in score, up to rollout {self.state.rollouts}: the "
                "reward gives nothing to learn from. Check the reward function (a constant?) and the task's difficulty"
            )

    def check_guard(self) -> None:
        """After each rollout (RunState counts the bad ones in a row): stop after max_bad_steps."""
        if self.state.bad_in_a_row >= self.config.max_bad_steps:
            raise NonFiniteError(
                f"{self.state.bad_in_a_row} rollouts in a row (max_bad_steps={self.config.max_bad_steps}) had "
                f"non-finite scores, loss or gradient norm, up to rollout {self.state.rollouts}; stopped with the "
                "weights of the last "
                "good update (no non-finite weights saved). Check the reward model / reward function and lr"
            )

    # ---- sharding, optimiser, checkpoints -------------------------------------------------------------------
    def configure_model(self) -> None:
        """trainer.strategy=fsdp2 (Lightning's ModelParallelStrategy): the policy sharded block by block over the
        data-parallel ranks before the optimiser is built. The frozen reference and reward model stay whole on each
        rank. Other strategies wrap the module themselves."""
        from lightning.pytorch.strategies import ModelParallelStrategy

        strategy = self.trainer.strategy
        if isinstance(strategy, ModelParallelStrategy) and not hasattr(self.policy, "unshard"):
            shard_model(self.policy, self.device_mesh["data_parallel"])
        if isinstance(strategy, ModelParallelStrategy) or getattr(strategy, "zero_stage_3", False):
            self.decide_rollout_gather()

    def decide_rollout_gather(self) -> None:
        """Partitioned policy weights (fsdp2, ZeRO-3) and the lean decode: each rollout gathers the policy's weights
        whole for it (rloo.models.sharding.whole_weights) where the copy, and the decode's own copy of the linear
        weights where it makes one, fit in the memory free on every rank (the smallest room decides, so all ranks
        agree); else HF generate steps through the sharded model, and the log and summary.json say why."""
        from rloo.generation.fast_paths import decode_copies_weights
        from rloo.utils.memory import free_bytes

        if not self.config.sampling.lean_decode:
            return
        needed = whole_bytes(self.policy) * (2 if decode_copies_weights(self.policy, self.config.sampling) else 1)
        free = free_bytes(self.device, self.trainer.num_devices)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            room = torch.tensor([free], dtype=torch.float64, device=self.device)
            torch.distributed.all_reduce(room, op=torch.distributed.ReduceOp.MIN)
            free = int(room.item())
        fits = gather_fits(needed, free)
        setattr(self.policy, GATHERS, fits)
        if not fits:
            why = (
                f"lean_decode=true, but the policy's weights gathered whole for it ({needed / 2**20:,.0f} MiB with "
                f"the decode's copy) would not fit in the {free / 2**20:,.0f} MiB free on the fullest rank: HF "
                "generate steps through the sharded model, gathering every block for every token"
            )
            self.sampler_note = ("hf_generate", why)
            log.warning(f"rloo: sampler: hf_generate ({why})")

    def configure_optimizers(self):
        cfg = self.config
        return adamw_with_schedule(
            self.trained_parameters(),
            cfg.lr,
            cfg.total_rollouts * (cfg.updates_per_rollout if cfg.lr_schedule_per == "optimizer_step" else 1),
            cfg.warmup_ratio,
            cfg.lr_schedule,
            cfg.weight_decay,
            cfg.adam_eps,
        )

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        self.state.begin_rollout()  # a checkpoint taken inside this rollout (Ctrl-C, an error) redoes it from here

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # the reference and reward model never change: keep only what is trained (and the run state)
        state = {k: v for k, v in checkpoint["state_dict"].items() if k.startswith(self.trained_prefixes)}
        if has_adapters(self.policy):  # LoRA: the frozen base is the model every run loads; the adapters are trained
            state = {k: v for k, v in state.items() if not k.startswith("policy.") or ADAPTER_MARK in k}
        checkpoint["state_dict"] = state
        by_rank = None
        if self.trainer.world_size > 1:  # every rank's random states (a collective)
            by_rank = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(by_rank, self.state.rng_for_checkpoint())
        self.state.save(checkpoint, by_rank)
        if self.producer is not None:  # what is in flight: the versions the next rollouts are sampled by
            checkpoint[ASYNC_CHECKPOINT_KEY] = checkpoint_state(self)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.state.load(checkpoint, self.trainer.world_size, self.trainer.global_rank)
        self.async_saved = checkpoint.get(ASYNC_CHECKPOINT_KEY)

    def teardown(self, stage: str) -> None:
        self.close_producer()

    def close_producer(self) -> None:
        """The run ends, however it ends (a failure reaches rloo.run.pipeline.fit, not this hook): the producer
        process with it. What a checkpoint reads of it stays."""
        if self.producer is not None:
            self.producer.close()

    def on_train_start(self) -> None:
        """On resume: the random states of the checkpoint (as late as possible: nothing draws after this before the
        next rollout), and a learning rate changed since the checkpoint, applied from here on and said."""
        self.state.restore_rng()
        self.train_started = (time.monotonic(), self.state.episodes)
        if getattr(self.config, "producer_process", False):
            self.producer, self.async_saved = start_producer(self, self.async_saved), None
        for scheduler in self.trainer.lr_scheduler_configs:
            scheduler = scheduler.scheduler
            if scheduler.base_lrs != [self.config.lr] * len(scheduler.base_lrs):
                log.info(
                    f"resume: lr {scheduler.base_lrs[0]:g} -> {self.config.lr:g} from optimiser step "
                    f"{self.trainer.global_step} on (the schedule's shape is kept)"
                )
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
