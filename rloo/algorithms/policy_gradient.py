"""The on-policy policy-gradient step: RLOO (Ahmadian et al. 2024, after Kool et al. 2019), read top to bottom, and
every REINFORCE-family estimator as a choice of it (conf/algo/shared/estimator.yaml; the math in rloo/objectives/).

    1. rollout    : k completions per prompt, their reference log-probs and scores         (rloo/generation/rollout.py)
                    dynamic_sampling (DAPO): groups whose k scores are all equal are replaced by fresh prompts' groups
    2. reward     : R_i = score_i (+ overlong_i, DAPO) - beta * sum_t KL_t(y_i)   (KL inside R: kl_in=reward, the paper)
    3. advantage  : RLOO  A_i = R_i - mean_{j != i} R_j within each prompt's k                       (leave-one-out)
                    or a group form (GRPO's std, Dr. GRPO's mean), a moving average (REINFORCE), none (vanilla PG),
                    the best of k (RAFT), or per token (REINFORCE++: returns-to-go, z-scored over the batch)
    4. loss       : RLOO  mean_i max(-A_i r_i, -A_i clip(r_i, 1-eps, 1+eps)),  r_i = exp(sum_t log pi/pi_old)
                    or REINFORCE -A_i sum_t log pi; ratios per token (GRPO, DAPO) or per completion (RLOO, GSPO), an
                    asymmetric clip (DAPO), the KL as a loss term (kl_in=loss, GRPO), aggregated by loss_aggregation
    5. step       : num_ppo_epochs x num_mini_batches optimiser steps; micro-batches accumulate gradients

| algo=        | advantage              | loss_aggregation   | ratio             | clip low / high | KL               |
|--------------|------------------------|--------------------|-------------------|-----------------|------------------|
| rloo         | leave_one_out          | seq_mean_token_sum | sequence, summed  | 0.2 / 0.2       | reward, k1, 0.05 |
| grpo         | group_std              | seq_mean_token_mean| token             | 0.2 / 0.2       | loss, k3, 0.04   |
| dr_grpo      | group_mean             | token_sum_norm     | token             | 0.2 / 0.2       | loss, k3, 0.04   |
| dapo         | group_std              | token_mean         | token             | 0.2 / 0.28      | none (*)         |
| reinforce_pp | return_to_go_batch_std | token_mean         | token             | 0.2 / 0.2       | reward, k1, 0.05 |
| gspo         | group_std              | seq_mean_token_mean| sequence, mean    | 3e-4 / 4e-4     | none             |
| raft, reinforce, vanilla_pg: RLOO's step with advantage best_of_k, moving_average, none                             |

(*) and dynamic sampling, overlong shaping, no missing-EOS penalty. With one update per rollout (the default schedule)
every ratio is exactly 1 and no clip acts.

R needs log pi of the policy that sampled (for the KL). A rollout used for one update gets it from the update's own
forward pass, one forward fewer (`update_on_policy`); a reused rollout gets it from a forward before the first step
(`update_on_reused_rollout`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.algorithms.base import OnlineRLModule
from rloo.algorithms.configs import EstimatorConfig
from rloo.algorithms.metrics import METRIC_NAMES, StepStats, common_metrics, log_metrics
from rloo.generation.rollout import PhaseTimer, Rollout, clock, concatenate
from rloo.objectives import (
    LossForm,
    aggregation_share,
    batch_whitened_tokens,
    group_reward_std,
    informative_groups,
    kl_per_token,
    masked_mean,
    normalize_advantages,
    overlong_penalty,
    per_token_rewards,
    policy_gradient_loss,
    returns_to_go,
    sequence_advantages,
    sequence_rewards,
    updated_moving_average,
)


@dataclass
class StepTargets:
    """What the step derives from a rollout: the KL, the rewards and the advantages."""

    kl: Tensor  # [N] sum_t KL_t at the policy that sampled
    rewards: Tensor  # [N] R_i
    advantages: Tensor  # [N] A_i, or [N, T] A_t for a per-token advantage (REINFORCE++)

    @classmethod
    def zeros(cls, n: int, per_token_length: int | None, device) -> "StepTargets":
        zeros = torch.zeros(n, device=device, dtype=torch.float32)  # not the default dtype (bf16-true)
        shape = (n,) if per_token_length is None else (n, per_token_length)
        return cls(zeros, zeros.clone(), torch.zeros(shape, device=device, dtype=torch.float32))

    def sequence_advantages(self, completion_mask: Tensor) -> Tensor:
        """[N]: A_i, or the mean of a per-token advantage over each completion's tokens."""
        if self.advantages.dim() == 1:
            return self.advantages
        return masked_mean(self.advantages, completion_mask, dim=1)

    def assign(self, index: Tensor, part: "StepTargets") -> None:
        self.kl[index], self.rewards[index], self.advantages[index] = part.kl, part.rewards, part.advantages


class PolicyGradientModule(OnlineRLModule):
    """Holds the trained policy, the frozen reference and the frozen reward model; `training_step` is one step of the
    estimator its config chooses (RLOO by default)."""

    config: EstimatorConfig

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.moving_baseline: float | None = None  # advantage=moving_average: b before any rollout is 0

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        cfg, timer, started = self.config, PhaseTimer(), clock()

        # 1. rollout: k completions per prompt, reference log-probs, scores                          [N = prompts * k]
        rollout, sampling_stats = self.collect(batch, timer), {}
        if cfg.dynamic_sampling:  # DAPO: groups without a learning signal replaced by fresh prompts' groups
            rollout, sampling_stats = self.keep_informative_groups(rollout, timer)
        if not self.scores_are_finite(rollout) and not self.masks_bad_scores():  # guard: nothing to learn from nan
            return self.skip_rollout(rollout, timer, started)
        if not torch.isfinite(rollout.scores).any():  # reward_errors=mask, every completion unscored: counted bad
            self.state.rollout_was_bad = True  # (max_bad_steps in a row stop the run)

        # 2-5. rewards, advantages, loss and optimiser steps. R needs log pi(y_t) of the policy that sampled [N, T],
        # from a training-style forward: used once, the update's own forward provides it; reused, a forward first
        if self.takes_log_pi_from_the_update():
            rollout_done = clock()
            targets, rollout_policy_logprobs, entropy, stats = self.update_on_policy(rollout)
            old_logprobs = None  # the update's own forward: every first-epoch ratio is exactly 1
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
            diagnostics["first_epoch_clipfrac"] = (
                0.0
                if old_logprobs is None
                else self.first_epoch_clipfrac(rollout, targets, rollout_policy_logprobs, old_logprobs)
            )
        self.log_step(rollout, targets, stats.means() | diagnostics, sampling_stats)

    def update_on_policy(self, rollout: Rollout) -> tuple[StepTargets, Tensor, Tensor, StepStats]:
        """Each rollout used for one optimiser step: micro-batches of whole prompt groups in order, each one's forward
        the rollout policy's, so log pi, R and A come from it (detached) and the loss from the same forward."""
        n, mask = len(rollout), self.loss_mask(rollout)
        # float32 as rollout_policy_forward's, whatever the models compute in (bf16-true: bf16 ref log-probs)
        rollout_policy_logprobs = torch.zeros_like(rollout.ref_logprobs, dtype=torch.float32)  # [N, T]
        entropy = torch.zeros_like(rollout_policy_logprobs)  # [N, T]
        per_token = mask.shape[1] if self.config.per_token_advantage else None
        targets, stats = StepTargets.zeros(n, per_token, self.device), StepStats()
        for micro in self.update_micro_batches(n, shuffle=False, epochs=1):  # one mini-batch; 5. step after it
            index, part = micro.index, rollout.select(micro.index)
            logprobs, part_entropy = self.policy_forward(part)  # [n, T]
            rollout_policy_logprobs[index], entropy[index] = logprobs.detach().float(), part_entropy.float()
            targets.assign(index, self.rewards_and_advantages(part, logprobs.detach()))  # 2-3. R, A
            loss, loss_stats = self.policy_loss(
                part,
                mask[index],
                targets.advantages[index],
                logprobs,
                logprobs.detach(),
                rollout_policy_logprobs[index],
            )  # 4. loss
            self.accumulate_gradients(loss, micro, self.share(mask, micro))
            stats.add({"loss": loss, **loss_stats}, len(index))
        return targets, rollout_policy_logprobs, entropy, stats

    def update_on_reused_rollout(
        self, rollout: Rollout, targets: StepTargets, old_logprobs: Tensor, rollout_policy_logprobs: Tensor
    ) -> StepStats:
        """num_ppo_epochs passes over the rollout, num_mini_batches optimiser steps each, whole groups shuffled; the
        rewards and advantages were fixed before the first step."""
        stats, mask = StepStats(), self.loss_mask(rollout)
        for micro in self.update_micro_batches(len(rollout), shuffle=True):  # 5. a step after each mini-batch
            index, part = micro.index, rollout.select(micro.index)
            logprobs, _ = self.policy_forward(part, with_entropy=False)  # [n, T]
            loss, loss_stats = self.policy_loss(
                part,
                mask[index],
                targets.advantages[index],
                logprobs,
                old_logprobs[index],
                rollout_policy_logprobs[index],
            )  # 4. loss
            self.accumulate_gradients(loss, micro, self.share(mask, micro))
            stats.add({"loss": loss, **loss_stats}, len(index))
        return stats

    @torch.no_grad()
    def first_epoch_clipfrac(
        self, rollout: Rollout, targets: StepTargets, rollout_policy_logprobs: Tensor, old_logprobs: Tensor
    ) -> Tensor:
        """The clip fraction at the policy that sampled against the old log-probs (old_logprobs=generation: the
        sampler's), before any optimiser step: what the rollout / training mismatch alone nulls."""
        mask = self.loss_mask(rollout)
        _, stats = policy_gradient_loss(targets.advantages, rollout_policy_logprobs, old_logprobs, mask, self.loss_form)
        return stats["clipfrac"]

    def takes_log_pi_from_the_update(self) -> bool:
        """One forward pass serves the KL and the loss: one update per rollout, old log-probs recomputed, and no
        advantage that whitens over more rows than one micro-batch holds."""
        cfg = self.config
        whitens_across_micro_batches = cfg.batch_wide_advantage and cfg.micro_batch_size < cfg.rollout_batch_size
        return not cfg.reuses_rollout and cfg.old_logprobs == "recompute" and not whitens_across_micro_batches

    # ---- 1. DAPO's dynamic sampling ----------------------------------------------------------------------------------
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
        self.sampled_in_rollout = sampled_groups * k
        return full, {
            "dynamic_sampling/dropped_groups": float(sampled_groups - have),
            "dynamic_sampling/rounds": float(rounds),
            "dynamic_sampling/filled_with_dropped": float(max(prompts - have, 0)),
            "dynamic_sampling/sampled_completions": float(sampled_groups * k),
        }

    # ---- 2-3. rewards and advantages, on tensors from rloo/objectives/ -----------------------------------------------
    def rewards_and_advantages(self, rollout: Rollout, logprobs: Tensor) -> StepTargets:
        """R = score - beta * sum_t KL_t and A, for whole prompt groups (the whole rollout for the batch-wide forms),
        from log pi of the policy that sampled."""
        cfg, mask = self.config, rollout.completion_mask
        kl_tokens = kl_per_token(logprobs, rollout.ref_logprobs, cfg.kl_estimator) * mask  # KL_t, 0 on padding
        scores = self.shaped_scores(rollout)
        beta = cfg.kl_coef if cfg.kl_in == "reward" else 0.0
        rewards = sequence_rewards(scores, kl_tokens, mask, beta)  # R_i = s_i - beta * sum_t KL_t
        if cfg.per_token_advantage:  # REINFORCE++(-baseline): r_t = -beta KL_t (+ score at the end), G_t, whitened
            advantages = self.per_token_advantages(scores, kl_tokens, mask, beta)  # [N, T]
        else:
            advantages = self.advantages(rewards, scores)  # [N]
            if cfg.normalize_advantages:
                advantages = normalize_advantages(advantages)
        return StepTargets(kl_tokens.sum(1), rewards, advantages)

    def advantages(self, rewards: Tensor, scores: Tensor, form: str | None = None) -> Tensor:
        """A_i of the chosen form (or `form`); with reward_errors=mask an unscored completion gets A = 0 and leaves
        its group's baseline."""
        cfg = self.config
        valid = torch.isfinite(scores) if self.masks_bad_scores() and not torch.isfinite(scores).all() else None
        ranking = rewards if cfg.raft_rank_by == "reward" else scores  # best_of_k; unscored: nan in both
        form = form or cfg.advantage
        return sequence_advantages(rewards, cfg.k, form, valid, cfg.std_eps, self.moving_baseline, ranking)

    def per_token_advantages(self, scores: Tensor, kl_tokens: Tensor, mask: Tensor, beta: float) -> Tensor:
        """REINFORCE++ (return_to_go_batch_std) and REINFORCE++-baseline (group_mean_batch_std: the score less its
        group's mean first, as OpenRLHF's `reinforce_baseline`): per-token rewards r_t = -beta KL_t plus the score at
        the last token, returns-to-go (gamma 1), whitened over every token of the global batch. [N, T]."""
        cfg = self.config
        if cfg.advantage == "group_mean_batch_std":
            scores = self.advantages(scores, scores, form="group_mean")  # s_i - mean of its group's
        token_rewards = per_token_rewards(torch.nan_to_num(scores), kl_tokens, mask, beta)
        across_ranks = self.trainer.strategy.reduce if self.trainer.world_size > 1 else None
        sum_over_ranks = None if across_ranks is None else (lambda tensor: across_ranks(tensor, reduce_op="sum"))
        return batch_whitened_tokens(returns_to_go(token_rewards, mask), mask, sum_over_ranks)

    def shaped_scores(self, rollout: Rollout) -> Tensor:
        """The scores after the missing-EOS rule and DAPO's overlong shaping (overlong=shape), [N]."""
        cfg, scores = self.config, self.penalised_scores(rollout)
        if cfg.overlong == "shape":
            scores = scores + overlong_penalty(rollout.lengths, cfg.sampling.max_new_tokens, cfg.overlong_cache_tokens)
        return scores

    # ---- 4. the loss -------------------------------------------------------------------------------------------------
    @property
    def loss_form(self) -> LossForm:
        cfg = self.config
        return LossForm(
            cfg.loss,
            cfg.ratio_level,
            cfg.sequence_ratio,
            cfg.clip_range,
            cfg.clip_high,
            cfg.loss_aggregation,
            cfg.aggregation_denominator,
        )

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
        """The loss of a micro-batch and its statistics, weighted by is_correction (pi_train / pi_rollout)."""
        cfg = self.config
        token_w, sequence_w, is_stats = self.correction_weights(part, rollout_policy_logprobs)
        kl_loss = None
        if cfg.kl_in_loss:  # GRPO: + beta * KL_t per token, aggregated with the policy terms
            kl_loss = kl_per_token(logprobs, part.ref_logprobs, cfg.kl_estimator)
            is_stats = is_stats | {"kl_loss": masked_mean(kl_loss.detach(), mask)}
            kl_loss = cfg.kl_coef * kl_loss
        loss, stats = policy_gradient_loss(
            advantages, logprobs, old_logprobs, mask, self.loss_form, token_w, sequence_w, kl_loss
        )
        return loss, stats | is_stats

    def share(self, mask: Tensor, micro) -> float:
        """A micro-batch's share of its mini-batch's loss: of the tokens for a token mean, else of the rows."""
        return aggregation_share(self.config.loss_aggregation, mask[micro.index], mask[micro.mini_batch])

    # ---- after the step: the moving baseline, metrics, checkpoints ---------------------------------------------------
    def finish_step(
        self, rollout: Rollout, targets: StepTargets | None, timer: PhaseTimer, started: float, rollout_done: float
    ) -> None:
        """advantage=moving_average: b moves once the rollout is trained on (the mean R over all ranks), so it never
        depends on the samples it centres. A rollout the guard skipped (targets None) moves nothing."""
        if self.config.advantage == "moving_average" and targets is not None:
            mean = targets.rewards.nanmean()
            if self.trainer.world_size > 1:
                mean = self.trainer.strategy.reduce(mean, reduce_op="mean")
            self.moving_baseline = updated_moving_average(self.moving_baseline, float(mean), self.config.baseline_decay)
        super().finish_step(rollout, targets, timer, started, rollout_done)

    def log_step(self, rollout: Rollout, targets: StepTargets, stats: dict, sampling_stats: dict) -> None:
        cfg = self.config
        scores = self.penalised_scores(rollout)
        kl_in_reward = cfg.kl_coef if cfg.kl_in == "reward" else 0.0
        metrics = common_metrics(self, rollout) | {
            "objective/scores": scores.nanmean(),  # nan only where reward_errors=mask left a completion unscored
            "objective/kl": targets.kl.mean(),
            "objective/non_score_reward": (-kl_in_reward * targets.kl).mean(),
            "objective/rlhf_reward": targets.rewards.nanmean(),
            "objective/advantage_std": targets.sequence_advantages(rollout.completion_mask).std(),
        }
        if cfg.k > 1:  # one completion per prompt (algo=reinforce, vanilla_pg) has no group
            group_std = group_reward_std(scores, cfg.k)  # [prompts]
            metrics["reward_std"] = group_std.nanmean()
            metrics["frac_reward_zero_std"] = (group_std < 1e-6).float().mean()
        if cfg.advantage == "moving_average":  # after this rollout
            stats = stats | {"baseline": torch.tensor(self.moving_baseline)}
        metrics.update({METRIC_NAMES.get(name, name): value for name, value in stats.items()})
        metrics.update(sampling_stats)
        log_metrics(self, metrics, batch_size=len(rollout))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["rloo_moving_baseline"] = self.moving_baseline

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.moving_baseline = checkpoint.get("rloo_moving_baseline")


def _to(value, device):
    return value.to(device) if isinstance(value, Tensor) else value
