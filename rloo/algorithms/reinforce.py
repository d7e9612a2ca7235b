"""REINFORCE with a moving-average baseline (algo=reinforce) and vanilla policy gradient (algo=vanilla_pg), the
paper's two simplest baselines for RLOO (Ahmadian et al. 2024, Table 1). The step is RLOO's (rloo.py), read top to
bottom there; only the baseline subtracted from each sequence reward differs:

    rloo        : A_i = R_i - mean of the other k-1 completions of the same prompt
    reinforce   : A_i = R_i - b,  b a moving average of the mean R of earlier rollouts (decay baseline_decay)
    vanilla_pg  : A_i = R_i       (no baseline)

with R_i = score_i - beta * sum_t KL_t as in RLOO. Both sample k completions per prompt (k=1 by default: one
completion per prompt, as a policy gradient without a group needs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rloo.algorithms.rloo import RLOOConfig, RLOOModule, RLOOTargets, unscored_sit_out
from rloo.keys import FIXED, key
from rloo.objectives import moving_average_advantages, updated_moving_average
from rloo.rollout import PhaseTimer, Rollout


class VanillaPGModule(RLOOModule):
    """REINFORCE with no baseline: A_i = R_i."""

    def advantages(self, rewards: Tensor, scores: Tensor) -> Tensor:
        return unscored_sit_out(rewards.float(), scores)


@dataclass(frozen=True)
class ReinforceConfig(RLOOConfig):
    """RLOO's keys plus conf/algo/reinforce.yaml's."""

    baseline_decay: float = key(FIXED, low=0, high=1)


class ReinforceModule(RLOOModule):
    """REINFORCE with a moving-average baseline b: A_i = R_i - b. b stays fixed through a rollout's update and moves
    once the rollout is trained on (the mean R over all ranks), so it never depends on the samples it centres. It
    goes into checkpoints: a resumed run continues with the same b."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.baseline: float | None = None  # no rollout yet: b = 0

    def advantages(self, rewards: Tensor, scores: Tensor) -> Tensor:
        return unscored_sit_out(moving_average_advantages(rewards, self.baseline), scores)

    def finish_step(
        self, rollout: Rollout, targets: RLOOTargets | None, timer: PhaseTimer, started: float, rollout_done: float
    ) -> None:
        if targets is not None:  # None: the guard skipped this rollout, which moves nothing
            mean = targets.rewards.nanmean()
            if self.trainer.world_size > 1:
                mean = self.trainer.strategy.reduce(mean, reduce_op="mean")
            self.baseline = updated_moving_average(self.baseline, float(mean), self.config.baseline_decay)
        super().finish_step(rollout, targets, timer, started, rollout_done)

    def log_step(self, rollout: Rollout, targets: RLOOTargets, stats: dict) -> None:
        super().log_step(rollout, targets, stats | {"baseline": torch.tensor(self.baseline)})  # after this rollout

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["rloo_moving_baseline"] = self.baseline

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        self.baseline = checkpoint.get("rloo_moving_baseline")
