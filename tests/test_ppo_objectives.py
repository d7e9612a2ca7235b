"""PPO's math against slow references: per-token rewards, GAE (with padding), clipped value loss."""

import pytest
import torch

from rloo.objectives import clipped_value_loss, explained_variance, gae_advantages, per_token_rewards


def gae_loop(rewards, values, lengths, gamma, lam):
    """One row at a time, straight from the definition, over the real tokens only."""
    n, width = rewards.shape
    advantages, returns = torch.zeros(n, width), torch.zeros(n, width)
    for i in range(n):
        t_end = int(lengths[i])
        running = 0.0
        for t in reversed(range(t_end)):
            next_value = float(values[i, t + 1]) if t + 1 < t_end else 0.0
            delta = float(rewards[i, t]) + gamma * next_value - float(values[i, t])
            running = delta + gamma * lam * running
            advantages[i, t] = running
            returns[i, t] = running + float(values[i, t])
    return advantages, returns


@pytest.mark.parametrize("gamma, lam", [(1.0, 0.95), (0.9, 0.5), (1.0, 1.0), (0.99, 0.0)])
def test_gae_matches_the_loop_reference_with_padding(gamma, lam):
    torch.manual_seed(0)
    lengths = torch.tensor([5, 1, 3, 0, 5])
    mask = torch.arange(5)[None, :] < lengths[:, None]
    # garbage on padding must not leak into real positions
    rewards = torch.where(mask, torch.randn(5, 5), torch.full((5, 5), 1e6))
    values = torch.where(mask, torch.randn(5, 5), torch.full((5, 5), -1e6))
    advantages, returns = gae_advantages(rewards, values, mask, gamma, lam)
    expected_adv, expected_ret = gae_loop(rewards, values, lengths, gamma, lam)
    torch.testing.assert_close(advantages, expected_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(returns, expected_ret, atol=1e-5, rtol=1e-5)
    assert (advantages[~mask] == 0).all() and (returns[~mask] == 0).all()


def test_gae_by_hand_on_two_tokens():
    # r = [0, 1], V = [0.5, 0.2], gamma 1, lambda 0.5:
    # delta_1 = 1 - 0.2 = 0.8; A_1 = 0.8; delta_0 = 0 + 0.2 - 0.5 = -0.3; A_0 = -0.3 + 0.5 * 0.8 = 0.1
    advantages, returns = gae_advantages(
        torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.2]]), torch.ones(1, 2, dtype=torch.bool), gamma=1.0, lam=0.5
    )
    torch.testing.assert_close(advantages, torch.tensor([[0.1, 0.8]]))
    torch.testing.assert_close(returns, torch.tensor([[0.6, 1.0]]))


def test_lambda_one_gamma_one_returns_are_the_reward_to_go():
    torch.manual_seed(1)
    rewards, values = torch.randn(3, 6), torch.randn(3, 6)
    mask = torch.ones(3, 6, dtype=torch.bool)
    _, returns = gae_advantages(rewards, values, mask, 1.0, 1.0)
    reward_to_go = rewards.flip(1).cumsum(1).flip(1)  # Monte Carlo return: the values cancel
    torch.testing.assert_close(returns, reward_to_go, atol=1e-5, rtol=1e-5)


def test_per_token_rewards_put_the_score_on_the_last_real_token():
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.5, 9.0, 9.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]])
    rewards = per_token_rewards(torch.tensor([2.0, -1.0, 7.0]), kl, mask, kl_coef=0.5)
    expected = torch.tensor([[-0.05, -0.1, -0.15 + 2.0], [-0.25 - 1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(rewards, expected)


def test_clipped_value_loss_by_hand():
    # eps 0.2. token 1: V_old 0, V 1, G 1 -> clipped 0.2, errors (0, 0.64): clipped wins, 0.64
    #          token 2: V_old 0, V 0.1, G 1 -> within the clip, both 0.81
    #          token 3: V_old 0, V -1, G -2 -> clipped -0.2, errors (1, 3.24): clipped wins, 3.24
    #          token 4: padding (V far off, must not count)
    values = torch.tensor([[1.0, 0.1, -1.0, 50.0]], requires_grad=True)
    old = torch.zeros(1, 4)
    returns = torch.tensor([[1.0, 1.0, -2.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, clipfrac = clipped_value_loss(values, old, returns, mask, 0.2)
    torch.testing.assert_close(loss, torch.tensor(0.5 * (0.64 + 0.81 + 3.24) / 3))
    torch.testing.assert_close(clipfrac, torch.tensor(2 / 3))
    loss.backward()
    # where the clipped term wins, V gets no gradient (the clamp is flat there)
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, 0.5 * 2 * (0.1 - 1.0) / 3, 0.0, 0.0]]))


def test_explained_variance():
    target = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    assert explained_variance(target, target, mask).item() == pytest.approx(1.0)
    assert explained_variance(torch.full_like(target, 2.0), target, mask).item() == pytest.approx(0.0, abs=1e-6)
