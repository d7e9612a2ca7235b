"""Pure tensor math, no Lightning, Hydra or transformers: masked statistics (`statistics`), what a completion earns
(`rewards`: KL estimators, sequence and per-token rewards, missing-EOS and overlong rules), advantages
(`advantages`: leave-one-out, the GRPO family's group forms, REINFORCE++'s returns, GAE), the losses (`losses`: the
one clip, the aggregations, the policy-gradient loss every REINFORCE-family estimator is a choice of, DPO, PPO's
value loss) and the rollout / training mismatch (`mismatch`). Each is tested alone against hand-computed values
(tests/test_objectives.py, tests/test_estimators.py).

Shapes: N = prompts * k completions, prompt-major (rows p*k .. p*k+k-1 share prompt p); T = completion length.
"""

from rloo.objectives.advantages import (
    GROUP_FORMS,
    batch_whitened_tokens,
    best_of_k_advantages,
    gae_advantages,
    group_advantages,
    group_reward_std,
    informative_groups,
    leave_one_out_advantages,
    masked_leave_one_out_advantages,
    moving_average_advantages,
    normalize_advantages,
    returns_to_go,
    sequence_advantages,
    updated_moving_average,
)
from rloo.objectives.losses import (
    LossForm,
    aggregate,
    aggregate_sequences,
    aggregation_share,
    clipped_terms,
    clipped_value_loss,
    dpo_loss,
    explained_variance,
    policy_gradient_loss,
    preference_pairs,
)
from rloo.objectives.mismatch import IS_CORRECTIONS, importance_ratio_stats, importance_weights, logprob_mismatch
from rloo.objectives.rewards import (
    KL_ESTIMATORS,
    apply_missing_eos_penalty,
    kl_per_token,
    overlong_penalty,
    per_token_rewards,
    sequence_rewards,
)
from rloo.objectives.statistics import (
    entropy_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    token_logprobs,
)

__all__ = [
    "IS_CORRECTIONS",
    "importance_ratio_stats",
    "importance_weights",
    "logprob_mismatch",
    "GROUP_FORMS",
    "KL_ESTIMATORS",
    "LossForm",
    "aggregate",
    "aggregate_sequences",
    "aggregation_share",
    "apply_missing_eos_penalty",
    "batch_whitened_tokens",
    "best_of_k_advantages",
    "clipped_terms",
    "clipped_value_loss",
    "dpo_loss",
    "entropy_from_logits",
    "explained_variance",
    "gae_advantages",
    "group_advantages",
    "group_reward_std",
    "informative_groups",
    "kl_per_token",
    "leave_one_out_advantages",
    "masked_leave_one_out_advantages",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "moving_average_advantages",
    "normalize_advantages",
    "overlong_penalty",
    "per_token_rewards",
    "policy_gradient_loss",
    "preference_pairs",
    "returns_to_go",
    "sequence_advantages",
    "sequence_rewards",
    "token_logprobs",
    "updated_moving_average",
]
