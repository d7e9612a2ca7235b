"""RAFT (Dong et al. 2023; algo=raft), one of RLOO's baselines in the paper (Ahmadian et al. 2024, Table 1): sample
k completions per prompt, keep the one the reward model scores best, and fine-tune on it. The step is RLOO's
(rloo.py), read top to bottom there, with the advantage replaced by a selection weight:

    A_i = k if completion i has the highest score of its prompt's k (the first of equal ones), else 0

so the REINFORCE loss mean_i(-A_i * sum_t log pi(y_i,t)) over all rows is the mean negative log-likelihood of the
best completions. The ranking uses the score after the missing-EOS penalty; the KL term is logged, not ranked by.
"""

from __future__ import annotations

from torch import Tensor

from rloo.algorithms.rloo import RLOOModule, unscored_sit_out
from rloo.objectives import best_of_k_advantages


class RAFTModule(RLOOModule):
    """RLOO's step, trained on the best of each prompt's k completions."""

    def advantages(self, rewards: Tensor, scores: Tensor) -> Tensor:
        return unscored_sit_out(best_of_k_advantages(scores, self.config.k), scores)
