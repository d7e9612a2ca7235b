"""RAFT (Dong et al. 2023; algo=raft), one of RLOO's baselines in the paper (Ahmadian et al. 2024, Table 1): sample
k completions per prompt, keep the one the reward model scores best, and fine-tune on it. The step is RLOO's
(rloo.py), read top to bottom there, with the advantage replaced by a selection weight:

    A_i = k if completion i has the highest score of its prompt's k (the first of equal ones), else 0

so the REINFORCE loss mean_i(-A_i * sum_t log pi(y_i,t)) over all rows is the mean negative log-likelihood of the
best completions.

"Best" by `raft_rank_by`: `reward` (the default) ranks by the reward every method of the paper's comparison
maximises, R = score - kl_coef * sum_t KL_t, so kl_coef holds RAFT near the reference as it holds RLOO; `score`
ranks by the reward-model score alone (after the missing-EOS rule), as Dong et al. rank, and kl_coef then changes
nothing RAFT learns (one run of Table 1 in miniature drifted to a KL of 21.6 nats that way, docs/baselines.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from rloo.algorithms.rloo import RLOOConfig, RLOOModule, unscored_sit_out
from rloo.keys import FIXED, key
from rloo.objectives import best_of_k_advantages

RAFT_RANKINGS = ("reward", "score")  # R (KL-penalised) | the score alone


@dataclass(frozen=True)
class RAFTConfig(RLOOConfig):
    raft_rank_by: str = key(FIXED, choices=RAFT_RANKINGS)


class RAFTModule(RLOOModule):
    """RLOO's step, trained on the best of each prompt's k completions."""

    def advantages(self, rewards: Tensor, scores: Tensor) -> Tensor:
        ranked = rewards if self.config.raft_rank_by == "reward" else scores  # an unscored completion: nan in both
        return unscored_sit_out(best_of_k_advantages(ranked, self.config.k), scores)
