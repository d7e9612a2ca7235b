"""DPO (Rafailov et al. 2023; algo=dpo), the offline baseline of RLOO's paper (Ahmadian et al. 2024, Table 1): the
whole training step, read top to bottom.

    1. pairs  : k completions (k=2) per prompt sampled from the frozen SFT policy, the reference, never from the
                policy being trained; scored by the run's reward, as the RL methods' completions are. The best of
                each prompt's k is chosen, the worst rejected; a tie makes no pair.         (rloo/generation/rollout.py)
    2. loss   : -log sigmoid(beta * [(log pi - log pi_ref)(chosen) - (log pi - log pi_ref)(rejected)]),
                log pi the sum of the completion's token log-probs
    3. step   : num_ppo_epochs x num_mini_batches optimiser steps; micro-batches of whole pairs accumulate gradients

Offline: the pairs come from a distribution fixed before training (the SFT policy and the reward), so drawing them
rollout by rollout is drawing one dataset of total_episodes / k pairs up front, seen once in order. The budget is
counted as the RL methods' is: episodes are completions, two per pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.algorithms.base import OnlineRLModule
from rloo.algorithms.metrics import METRIC_NAMES, StepStats, common_metrics, log_metrics
from rloo.generation.rollout import PhaseTimer, Rollout, clock
from rloo.objectives import dpo_loss, masked_sum, preference_pairs


@dataclass
class DPOTargets:
    """The preference pairs of a rollout: the chosen and the rejected row of each prompt [P], and whether decided."""

    chosen: Tensor
    rejected: Tensor
    decided: Tensor

    def sequence_advantages(self, completion_mask: Tensor) -> Tensor:
        """Each row's part in the pairs, where the sample table shows an advantage: +1 chosen, -1 rejected, else 0."""
        labels = torch.zeros(completion_mask.shape[0], device=completion_mask.device)
        labels[self.chosen[self.decided]], labels[self.rejected[self.decided]] = 1.0, -1.0
        return labels


class DPOModule(OnlineRLModule):
    """Holds the trained policy, the frozen reference (which samples the pairs) and the frozen reward model (which
    labels them); `training_step` is one DPO step on a batch of pairs."""

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        cfg, timer, started = self.config, PhaseTimer(), clock()

        # 1. pairs: k completions per prompt from the reference, their reference log-probs and scores    [N = P * k]
        rollout = self.collect(batch, timer, sampler=self.reference)
        if not self.scores_are_finite(rollout) and not self.masks_bad_scores():  # guard: no labels from nan
            return self.skip_rollout(rollout, timer, started)
        scores = self.penalised_scores(rollout)
        targets = DPOTargets(*preference_pairs(scores, cfg.k))
        rollout_done = clock()

        # 2-3. the DPO loss of each micro-batch's pairs (rows stay prompt-major: a micro-batch holds whole groups)
        stats = StepStats()
        for micro in self.update_micro_batches(len(rollout), shuffle=False):  # 3. a step after each mini-batch
            index, part = micro.index, rollout.select(micro.index)
            logprobs, _ = self.policy_forward(part, with_entropy=False)  # [n, T]
            sequence = masked_sum(logprobs, part.completion_mask, dim=1)  # log pi(y) [n]
            reference = masked_sum(part.ref_logprobs, part.completion_mask, dim=1)  # log pi_ref(y) [n]
            chosen, rejected, decided = preference_pairs(scores[index], cfg.k)  # within the part
            loss, loss_stats = dpo_loss(
                sequence[chosen], sequence[rejected], reference[chosen], reference[rejected], cfg.dpo_beta, decided
            )
            self.accumulate_gradients(loss, micro)
            stats.add({"loss": loss, **loss_stats}, len(index))

        self.finish_step(rollout, targets, timer, started, rollout_done)
        self.log_step(rollout, scores, targets, stats.means())

    def log_step(self, rollout: Rollout, scores: Tensor, targets: DPOTargets, stats: dict) -> None:
        names = {
            "chosen_reward": "dpo/chosen_reward",
            "rejected_reward": "dpo/rejected_reward",
            "margin": "dpo/margin",
            "accuracy": "dpo/accuracy",
        }
        metrics = common_metrics(self, rollout) | {
            "objective/scores": scores.nanmean(),  # of the reference's samples: what the pairs are made of
            "dpo/decided_frac": targets.decided.float().mean(),
            "dpo/score_gap": (scores[targets.chosen] - scores[targets.rejected])[targets.decided].mean()
            if targets.decided.any()
            else torch.tensor(0.0),
        }
        metrics.update({names.get(key, METRIC_NAMES.get(key, key)): value for key, value in stats.items()})
        log_metrics(self, metrics, batch_size=len(rollout))
