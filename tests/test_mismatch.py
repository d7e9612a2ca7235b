"""Rollout/training mismatch: diagnostics and importance-sampling corrections against hand computations."""

import math

import pytest
import torch

from rloo.objectives import (
    importance_weights,
    logprob_mismatch,
)
from tests.loss_forms import reinforce_loss, sequence_ppo_clip_loss, token_clip_fraction, token_ppo_clip_loss

# two sequences; the second has one padding position holding garbage
TRAIN = torch.tensor([[-1.0, -2.0, -0.5], [-0.2, -0.3, 99.0]])
ROLLOUT = torch.tensor([[-1.1, -1.5, -0.5], [-0.2, -0.9, -99.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
# delta = train - rollout on real tokens: [[0.1, -0.5, 0], [0, 0.6]]


def test_mismatch_statistics_by_hand():
    stats = logprob_mismatch(TRAIN, ROLLOUT, MASK)
    assert stats["abs_mean"].item() == pytest.approx((0.1 + 0.5 + 0 + 0 + 0.6) / 5)
    assert stats["abs_max"].item() == pytest.approx(0.6)
    expected_mult = (math.exp(0.1) + math.exp(0.5) + 1 + 1 + math.exp(0.6)) / 5
    assert stats["token_mult_prob_error"].item() == pytest.approx(expected_mult)
    assert stats["seq_log_ratio_min"].item() == pytest.approx(-0.4)
    assert stats["seq_log_ratio_max"].item() == pytest.approx(0.6)
    assert stats["seq_log_ratio_mean"].item() == pytest.approx(0.1)


def test_identical_logprobs_have_no_mismatch():
    stats = logprob_mismatch(TRAIN, TRAIN.clone(), MASK)
    assert stats["abs_max"].item() == 0 and stats["token_mult_prob_error"].item() == 1.0


def test_truncated_token_weights():
    weights, seq = importance_weights(TRAIN, ROLLOUT, MASK, "tis_token", cap=1.5)
    assert seq is None
    expected = torch.tensor([[math.exp(0.1), math.exp(-0.5), 1.0], [1.0, min(math.exp(0.6), 1.5), 0.0]])
    torch.testing.assert_close(weights, expected)


def test_truncated_sequence_weights():
    _, seq = importance_weights(TRAIN, ROLLOUT, MASK, "tis_sequence", cap=1.5)
    torch.testing.assert_close(seq, torch.tensor([math.exp(-0.4), 1.5]))


def test_masked_tokens_and_sequences():
    tokens, _ = importance_weights(TRAIN, ROLLOUT, MASK, "mask_token", low=0.8, high=1.2)
    # rho: e^0.1=1.105 in, e^-0.5=0.607 out, 1 in | 1 in, e^0.6=1.82 out, padding 0
    torch.testing.assert_close(tokens, torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]]))
    _, seq = importance_weights(TRAIN, ROLLOUT, MASK, "mask_sequence", low=0.5, high=1.5)
    torch.testing.assert_close(seq, torch.tensor([1.0, 0.0]))  # e^-0.4 = 0.67 in, e^0.6 = 1.82 out


def test_geometric_mean_filter_normalises_by_length():
    # geometric means: exp(-0.4/3) = 0.875, exp(0.6/2) = 1.35
    _, seq = importance_weights(TRAIN, ROLLOUT, MASK, "geometric", low=0.8, high=1.25)
    torch.testing.assert_close(seq, torch.tensor([1.0, 0.0]))
    _, seq = importance_weights(TRAIN, ROLLOUT, MASK, "geometric", low=0.8, high=1.4)
    torch.testing.assert_close(seq, torch.tensor([1.0, 1.0]))


def test_unknown_correction_is_refused():
    with pytest.raises(ValueError, match="is_correction"):
        importance_weights(TRAIN, ROLLOUT, MASK, "magic")


def test_token_weights_scale_each_tokens_gradient_in_the_sequence_loss():
    """On-policy (ratio 1), the weighted loss has gradient -A_i * w_t / N at each real token."""
    logprobs = TRAIN.clone().requires_grad_(True)
    weights = torch.tensor([[0.5, 2.0, 1.0], [1.0, 0.25, 0.0]])
    advantages = torch.tensor([1.0, -2.0])
    loss, stats = sequence_ppo_clip_loss(advantages, logprobs, logprobs.detach(), MASK, 0.2, token_weights=weights)
    loss.backward()
    expected = -advantages[:, None] * weights * MASK / 2
    torch.testing.assert_close(logprobs.grad, expected)
    assert stats.ratio_mean.item() == 1.0  # weights change the gradient, not the ratio


def test_sequence_weights_drop_a_sequence_from_the_gradient():
    logprobs = TRAIN.clone().requires_grad_(True)
    loss, _ = sequence_ppo_clip_loss(
        torch.tensor([1.0, -2.0]), logprobs, logprobs.detach(), MASK, 0.2, sequence_weights=torch.tensor([1.0, 0.0])
    )
    loss.backward()
    assert (logprobs.grad[1] == 0).all() and (logprobs.grad[0, :3] == -0.5).all()
    # the same as REINFORCE on the first sequence alone, over the whole batch of 2
    reference = TRAIN.clone().requires_grad_(True)
    reinforce_loss(torch.tensor([1.0, 0.0]), reference, MASK).backward()
    torch.testing.assert_close(logprobs.grad, reference.grad)


def test_length_normalised_ratio_is_the_geometric_mean():
    logprobs = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    old = torch.tensor([[-1.2, -1.2, -1.2, -1.2]])
    mask = torch.ones(1, 4)
    _, summed = sequence_ppo_clip_loss(torch.tensor([1.0]), logprobs, old, mask, 0.2)
    _, normed = sequence_ppo_clip_loss(torch.tensor([1.0]), logprobs, old, mask, 0.2, length_normalized=True)
    assert summed.ratio_mean.item() == pytest.approx(math.exp(0.8))  # clipped: 2.2 > 1.2
    assert normed.ratio_mean.item() == pytest.approx(math.exp(0.2))  # 1.22: also out, but far less
    assert summed.clipfrac.item() == 1.0


def test_token_clip_fraction_against_a_loop():
    torch.manual_seed(0)
    logprobs, old = torch.randn(6, 5) * 0.3, torch.randn(6, 5) * 0.3
    mask = (torch.rand(6, 5) > 0.3).long()
    advantages = torch.randn(6)
    clipped = total = 0
    for i in range(6):
        for t in range(5):
            if not mask[i, t]:
                continue
            r = math.exp(logprobs[i, t] - old[i, t])
            a = advantages[i].item()
            clipped += (-a * min(max(r, 0.8), 1.2)) > (-a * r)
            total += 1
    assert token_clip_fraction(advantages, logprobs, old, mask, 0.2).item() == pytest.approx(clipped / total)


def test_token_loss_with_weights():
    logprobs = TRAIN.clone().requires_grad_(True)
    adv = torch.ones(2, 3)
    weights = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    loss, _ = token_ppo_clip_loss(adv, logprobs, logprobs.detach(), MASK, 0.2, token_weights=weights)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, -weights * MASK / 5)  # masked mean over the 5 real tokens
