"""The named forms of rloo.objectives.policy_gradient_loss that the hand-computed tests check: RLOO's REINFORCE and
sequence-level PPO clip, PPO's token-level clip. Each is one LossForm of the one loss, nothing computed here."""

from types import SimpleNamespace

from rloo.objectives import LossForm, policy_gradient_loss


def _stats(stats: dict) -> SimpleNamespace:
    """The loss's statistics by the names the tests use (ratio_mean for the loss's `ratio`)."""
    return SimpleNamespace(**{"ratio_mean" if name == "ratio" else name: value for name, value in stats.items()})


def reinforce_loss(advantages, logprobs, mask, token_weights=None, sequence_weights=None):
    """RLOO's loss=reinforce: mean_i -A_i sum_t w_t log pi_t."""
    form = LossForm("reinforce", "sequence", "sum", 0.2, 0.2, "seq_mean_token_sum")
    return policy_gradient_loss(advantages, logprobs, logprobs.detach(), mask, form, token_weights, sequence_weights)[0]


def sequence_ppo_clip_loss(
    advantages,
    logprobs,
    old_logprobs,
    mask,
    clip_range,
    length_normalized=False,
    token_weights=None,
    sequence_weights=None,
):
    """RLOO's loss=ppo_clip: one ratio per completion, summed (or, length_normalized, GSPO's mean) log-ratios."""
    form = LossForm(
        "ppo_clip", "sequence", "mean" if length_normalized else "sum", clip_range, clip_range, "seq_mean_token_sum"
    )
    loss, stats = policy_gradient_loss(advantages, logprobs, old_logprobs, mask, form, token_weights, sequence_weights)
    return loss, _stats(stats)


def token_ppo_clip_loss(
    advantages, logprobs, old_logprobs, mask, clip_range, token_weights=None, sequence_weights=None
):
    """PPO's policy loss: a ratio per token, a symmetric clip, the mean over the batch's real tokens."""
    form = LossForm("ppo_clip", "token", "sum", clip_range, clip_range, "token_mean")
    loss, stats = policy_gradient_loss(advantages, logprobs, old_logprobs, mask, form, token_weights, sequence_weights)
    return loss, _stats(stats)


def token_clip_fraction(advantages, logprobs, old_logprobs, mask, clip_range):
    """What a token-level clip would null, as the sequence-level loss reports it beside its own clip fraction."""
    return sequence_ppo_clip_loss(advantages, logprobs, old_logprobs, mask, clip_range)[1].token_clipfrac
