"""Tests for rloo.objectives against independent references: hand-computed
numbers (arithmetic in comments) and slow pure-Python loop implementations."""

import math
import statistics

import pytest
import torch

from rloo.objectives import (
    apply_missing_eos_penalty,
    group_reward_std,
    kl_per_token,
    leave_one_out_advantages,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    normalize_advantages,
    sequence_rewards,
)
from tests.loss_forms import reinforce_loss, sequence_ppo_clip_loss, token_ppo_clip_loss

D = torch.float64


def t(x, dtype=D, **kw):
    return torch.tensor(x, dtype=dtype, **kw)


def close(a, b, tol=1e-10):
    torch.testing.assert_close(torch.as_tensor(a, dtype=D), torch.as_tensor(b, dtype=D), rtol=tol, atol=tol)


def random_batch(n=4, T=6, seed=0):
    """logprobs, old_logprobs, mask with ragged lengths (every row has >= 1 real token)."""
    g = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(n, T, generator=g, dtype=D) * 3
    old = logprobs - 0.3 * torch.randn(n, T, generator=g, dtype=D)
    lengths = torch.randint(1, T + 1, (n,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return logprobs, old, mask


# ---------------------------------------------------------------- loop references


def loo_reference(rewards, k):
    """Leave-one-out advantages, one prompt and one completion at a time."""
    r = [float(x) for x in rewards]
    out = []
    for p in range(len(r) // k):
        group = r[p * k : (p + 1) * k]
        for i in range(k):
            others = [group[j] for j in range(k) if j != i]
            baseline = sum(others) / (k - 1)
            out.append(group[i] - baseline)
    return out


def masked_sum_rows_reference(values, mask):
    out = []
    for i in range(values.shape[0]):
        s = 0.0
        for j in range(values.shape[1]):
            if mask[i][j]:
                s += float(values[i][j])
        out.append(s)
    return out


# ---------------------------------------------------------------- leave-one-out


@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_loo_matches_loop_reference(k):
    g = torch.Generator().manual_seed(k)
    rewards = torch.randn(5 * k, generator=g, dtype=D)
    close(leave_one_out_advantages(rewards, k), loo_reference(rewards, k))


@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_loo_each_group_uses_only_its_own_rewards(k):
    g = torch.Generator().manual_seed(100 + k)
    num_prompts = 6
    rewards = torch.randn(num_prompts * k, generator=g, dtype=D)
    adv = leave_one_out_advantages(rewards, k).reshape(num_prompts, k)
    # shuffling whole groups just shuffles the advantage groups
    perm = torch.randperm(num_prompts, generator=g)
    shuffled = rewards.reshape(num_prompts, k)[perm].reshape(-1)
    adv_shuffled = leave_one_out_advantages(shuffled, k).reshape(num_prompts, k)
    close(adv_shuffled, adv[perm])
    # changing another group's rewards leaves group 0 untouched
    changed = rewards.clone()
    changed[k:] += 1000.0
    close(leave_one_out_advantages(changed, k)[:k], adv[0])


def test_loo_layout_is_prompt_major():
    # repeat_interleave layout: prompt 0 -> rows 0..2, prompt 1 -> rows 3..5.
    # Constant reward within each group -> zero advantage everywhere.
    # (a prompt-minor reading would form groups {0, 0, 10} and {0, 10, 10}: nonzero)
    rewards = torch.repeat_interleave(t([0.0, 10.0]), 3)
    assert rewards.tolist() == [0, 0, 0, 10, 10, 10]
    close(leave_one_out_advantages(rewards, 3), [0.0] * 6)


@pytest.mark.parametrize("k", [2, 3, 4, 8])
def test_loo_identity_and_zero_sum(k):
    g = torch.Generator().manual_seed(200 + k)
    rewards = torch.randn(4 * k, generator=g, dtype=D)
    adv = leave_one_out_advantages(rewards, k).reshape(4, k)
    for p in range(4):
        group = [float(x) for x in rewards[p * k : (p + 1) * k]]
        mean = sum(group) / k
        for i in range(k):
            # A_i = k/(k-1) * (R_i - mean_group)
            assert math.isclose(float(adv[p, i]), k / (k - 1) * (group[i] - mean), abs_tol=1e-12)
        assert abs(float(adv[p].sum())) < 1e-12


def test_loo_hand_k2():
    # prompt 0: R = [1, 3]: b_0 = 3, A_0 = 1 - 3 = -2; b_1 = 1, A_1 = 3 - 1 = 2
    # prompt 1: R = [5, 5]: A = [0, 0]
    close(leave_one_out_advantages(t([1.0, 3.0, 5.0, 5.0]), 2), [-2.0, 2.0, 0.0, 0.0])


def test_loo_hand_k3():
    # R = [1, 2, 6], sum = 9
    # b_0 = (9-1)/2 = 4.0 -> A_0 = 1 - 4.0 = -3.0
    # b_1 = (9-2)/2 = 3.5 -> A_1 = 2 - 3.5 = -1.5
    # b_2 = (9-6)/2 = 1.5 -> A_2 = 6 - 1.5 = 4.5
    close(leave_one_out_advantages(t([1.0, 2.0, 6.0]), 3), [-3.0, -1.5, 4.5])


def test_loo_float32_and_bf16_inputs():
    r32 = torch.tensor([1.0, 2.0, 6.0])
    assert leave_one_out_advantages(r32, 3).dtype == torch.float32
    close(leave_one_out_advantages(r32.bfloat16(), 3), [-3.0, -1.5, 4.5])


@pytest.mark.parametrize("k", [1, 0, -2])
def test_loo_k_below_two_raises(k):
    with pytest.raises(ValueError, match="k"):
        leave_one_out_advantages(t([1.0, 2.0, 3.0, 4.0]), k)


def test_loo_non_divisible_raises():
    with pytest.raises(ValueError, match="divisible"):
        leave_one_out_advantages(t([1.0, 2.0, 3.0, 4.0, 5.0]), 2)


# ---------------------------------------------------------------- group std / normalisation


def test_group_reward_std_vs_loop():
    rewards = t([1.0, 2.0, 6.0, 4.0, 4.0, 4.0, -1.0, 0.0, 3.0])
    expected = [statistics.stdev([float(x) for x in rewards[p * 3 : p * 3 + 3]]) for p in range(3)]
    got = group_reward_std(rewards, 3)
    close(got, expected)
    assert got[1] == 0.0  # constant group -> exactly zero std (counts toward frac_reward_zero_std)
    with pytest.raises(ValueError):
        group_reward_std(rewards, 2)


def test_normalize_advantages_vs_loop():
    adv = t([-3.0, -1.5, 4.5, 2.0])
    vals = [float(x) for x in adv]
    mu, sd = statistics.mean(vals), statistics.stdev(vals)
    close(normalize_advantages(adv), [(v - mu) / (sd + 1e-8) for v in vals])
    # a single element must not give nan
    assert torch.isfinite(normalize_advantages(t([3.0]))).all()


# ---------------------------------------------------------------- KL estimators


def test_kl_estimators_hand_values():
    logprobs = t([[-1.0, -2.0]])
    ref = t([[-1.5, -1.5]])
    # log r = [-1.0 - (-1.5), -2.0 - (-1.5)] = [0.5, -0.5]
    close(kl_per_token(logprobs, ref, "k1"), [[0.5, -0.5]])
    # k2 = 0.5^2 / 2 = 0.125 for both signs
    close(kl_per_token(logprobs, ref, "k2"), [[0.125, 0.125]])
    # k3(0.5) = e^-0.5 - 1 + 0.5 = 0.6065306597 - 0.5 = 0.1065306597
    # k3(-0.5) = e^0.5 - 1 - 0.5 = 1.6487212707 - 1.5 = 0.1487212707
    close(kl_per_token(logprobs, ref, "k3"), [[0.1065306597126334, 0.1487212707001282]])
    # default is k1
    close(kl_per_token(logprobs, ref), [[0.5, -0.5]])


def test_kl_k2_k3_nonnegative_and_padding_safe():
    g = torch.Generator().manual_seed(0)
    logprobs = -torch.rand(64, 32, generator=g) * 10
    ref = -torch.rand(64, 32, generator=g) * 10
    for est in ("k2", "k3"):
        assert (kl_per_token(logprobs, ref, est) >= 0).all()
    # padded positions hold 0 in both: every estimator is exactly 0 there, no inf/nan
    zeros = torch.zeros(3, 5)
    for est in ("k1", "k2", "k3"):
        out = kl_per_token(zeros, zeros, est)
        assert torch.equal(out, torch.zeros(3, 5))
        out_bf16 = kl_per_token(logprobs.bfloat16(), ref.bfloat16(), est)
        assert torch.isfinite(out_bf16).all() and out_bf16.shape == (64, 32)


def test_kl_unknown_estimator_raises():
    with pytest.raises(ValueError, match=r"kl_estimator must be one of k1, k2, k3, got 'k4'"):
        kl_per_token(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


# ---------------------------------------------------------------- masked statistics


def test_masked_mean_ignores_padding():
    values = t([[1.0, 2.0, 1e30], [4.0, float("inf"), float("nan")]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    close(masked_mean(values, mask), (1 + 2 + 4) / 3)  # 7/3
    close(masked_mean(values, mask, dim=1), [1.5, 4.0])  # (1+2)/2, 4/1
    close(masked_sum(values, mask), 7.0)
    close(masked_sum(values, mask, dim=1), [3.0, 4.0])
    # float mask gives the same answer as bool mask
    close(masked_mean(values, mask.to(D)), 7 / 3)


def test_masked_mean_empty_mask_is_zero_with_finite_grad():
    values = t([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    mask = torch.tensor([[False, False], [True, False]])
    out = masked_mean(values, mask, dim=1)
    close(out, [0.0, 3.0])
    out.sum().backward()
    assert torch.isfinite(values.grad).all()
    close(values.grad, [[0.0, 0.0], [1.0, 0.0]])
    close(masked_mean(values.detach(), torch.zeros(2, 2, dtype=torch.bool)), 0.0)


def test_masked_var_and_whiten_vs_loop():
    values = t([[1.0, 2.0, 99.0], [4.0, 7.0, -99.0]])
    mask = torch.tensor([[True, True, False], [True, True, False]])
    real = [1.0, 2.0, 4.0, 7.0]
    close(masked_var(values, mask), statistics.variance(real))  # unbiased: 26/3
    close(masked_var(values, mask, unbiased=False), statistics.pvariance(real))  # 26/4
    mu, var = statistics.mean(real), statistics.variance(real)
    w = masked_whiten(values, mask)
    expected = [
        [(1 - mu) / math.sqrt(var + 1e-8), (2 - mu) / math.sqrt(var + 1e-8), 0.0],
        [(4 - mu) / math.sqrt(var + 1e-8), (7 - mu) / math.sqrt(var + 1e-8), 0.0],
    ]
    close(w, expected)
    w_noshift = masked_whiten(values, mask, shift_mean=False)
    close(w_noshift[mask], torch.tensor(expected, dtype=D)[mask] + mu)
    assert (w_noshift[~mask] == 0).all()


# ---------------------------------------------------------------- rewards


def test_sequence_rewards_vs_loop():
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(5, generator=g, dtype=D)
    kl = torch.randn(5, 7, generator=g, dtype=D)
    _, _, mask = random_batch(5, 7, seed=3)
    kl_coef = 0.05
    expected = []
    for i in range(5):
        total_kl = 0.0
        for j in range(7):
            if mask[i, j]:
                total_kl += float(kl[i, j])
        expected.append(float(scores[i]) - kl_coef * total_kl)
    close(sequence_rewards(scores, kl, mask, kl_coef), expected)
    # padding invariance
    kl_junk = torch.where(mask, kl, t(1e6))
    close(sequence_rewards(scores, kl_junk, mask, kl_coef), expected)


def test_sequence_rewards_hand():
    # R = 1.0 - 0.1 * (0.5 + 1.5) = 0.8 ; second row: 2.0 - 0.1 * 4.0 = 1.6
    scores = t([1.0, 2.0])
    kl = t([[0.5, 1.5, 7.0], [4.0, 8.0, 8.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    close(sequence_rewards(scores, kl, mask, 0.1), [0.8, 1.6])


def test_missing_eos_penalty():
    scores = t([1.0, 2.0, 3.0])
    eos = torch.tensor([True, False, True])
    # only the middle one was truncated: 2.0 - 1.0 = 1.0
    close(apply_missing_eos_penalty(scores, eos, 1.0), [1.0, 1.0, 3.0])
    close(apply_missing_eos_penalty(scores, eos, 0.5), [1.0, 1.5, 3.0])
    for penalty in (None, 0, 0.0):
        out = apply_missing_eos_penalty(scores, eos, penalty)
        close(out, [1.0, 2.0, 3.0])
        assert out is not scores
        out += 10  # a new tensor: the input is not aliased
    close(scores, [1.0, 2.0, 3.0])
    apply_missing_eos_penalty(scores, eos, 1.0)
    close(scores, [1.0, 2.0, 3.0])  # not modified in place


# ---------------------------------------------------------------- REINFORCE


def test_reinforce_loss_and_grad_hand():
    adv = t([2.0, -1.0], requires_grad=True)
    logprobs = t([[-1.0, -2.0, 123.0], [-0.5, 55.0, -77.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    # S_0 = -1 - 2 = -3, S_1 = -0.5
    # loss = mean(-2 * -3, -(-1) * -0.5) = mean(6, -0.5) = 2.75
    loss = reinforce_loss(adv, logprobs, mask)
    close(loss, 2.75)
    loss.backward()
    # dL/dlogprob_{i,t} = -A_i / N on real tokens: -2/2 = -1, 1/2 = 0.5; 0 on padding
    close(logprobs.grad, [[-1.0, -1.0, 0.0], [0.5, 0.0, 0.0]])
    assert adv.grad is None  # advantages are constants


def test_reinforce_sums_bf16_in_float32():
    # 300 tokens of -0.7; bf16 stores -0.69921875, so S = 300 * -0.69921875 = -209.765625
    # and loss = -A * S = 209.765625. A bf16 result would round to 210.0.
    lp = torch.full((1, 300), -0.7, dtype=torch.bfloat16)
    mask = torch.ones(1, 300, dtype=torch.bool)
    loss = reinforce_loss(torch.tensor([1.0]), lp, mask)
    assert loss.dtype == torch.float32
    assert float(loss) == 209.765625


# ---------------------------------------------------------------- sequence PPO-clip


def test_sequence_ppo_ratio_one_matches_reinforce_gradient_exactly():
    for dtype in (torch.float32, D, torch.bfloat16):
        lp, _, mask = random_batch(6, 5, seed=7)
        lp = lp.to(dtype)
        adv = torch.randn(6, generator=torch.Generator().manual_seed(1), dtype=D).to(dtype)
        lp_a = lp.clone().requires_grad_(True)
        lp_b = lp.clone().requires_grad_(True)
        ref = reinforce_loss(adv, lp_a, mask)
        ppo, stats = sequence_ppo_clip_loss(adv, lp_b, lp.detach(), mask, clip_range=0.2)
        ref.backward()
        ppo.backward()
        assert torch.equal(lp_a.grad, lp_b.grad), dtype
        # the surrogate value is -mean(A * ratio) = -mean(A) at ratio 1 (REINFORCE's
        # value -mean(A * log pi) differs by a constant; only the gradient is shared)
        close(ppo, -adv.to(D).mean(), tol=1e-6)
        assert float(stats.clipfrac) == 0.0 and float(stats.approxkl) == 0.0
        assert float(stats.ratio_min) == float(stats.ratio_max) == float(stats.ratio_mean) == 1.0


def _seq_case(adv, ratio, n_tokens=2):
    """One sequence whose summed log ratio is log(ratio), split over n_tokens real tokens + 1 pad."""
    old = t([[-0.7] * n_tokens + [0.0]])
    lp = old.clone()
    lp[0, :n_tokens] += math.log(ratio) / n_tokens
    mask = torch.tensor([[True] * n_tokens + [False]])
    return t([adv]), lp, old, mask


@pytest.mark.parametrize(
    "adv, ratio, loss, clipfrac, grad",
    [
        # A=+1, r=1.5: max(-1.5, -1*1.2) = -1.2 -> clipped term active, zero gradient
        (1.0, 1.5, -1.2, 1.0, 0.0),
        # A=-1, r=0.5: max(0.5, 1*0.8) = 0.8 -> clipped term active, zero gradient
        (-1.0, 0.5, 0.8, 1.0, 0.0),
        # A=+1, r=0.5: max(-0.5, -0.8) = -0.5 -> unclipped; dL/dlogprob_t = -A*r = -0.5
        (1.0, 0.5, -0.5, 0.0, -0.5),
        # A=-1, r=1.5: max(1.5, 1.2) = 1.5 -> unclipped; dL/dlogprob_t = -A*r = 1.5
        (-1.0, 1.5, 1.5, 0.0, 1.5),
        # A=+1, r=1.1 inside [0.8, 1.2]: both terms equal -1.1 -> not clipped, grad -1.1
        (1.0, 1.1, -1.1, 0.0, -1.1),
    ],
)
def test_sequence_ppo_hand_cases(adv, ratio, loss, clipfrac, grad):
    a, lp, old, mask = _seq_case(adv, ratio)
    lp.requires_grad_(True)
    out, stats = sequence_ppo_clip_loss(a, lp, old, mask, clip_range=0.2)
    close(out, loss)
    close(stats.clipfrac, clipfrac)
    close(stats.ratio_mean, ratio)
    close(stats.approxkl, 0.5 * math.log(ratio) ** 2)
    out.backward()
    close(lp.grad, [[grad, grad, 0.0]])


def test_sequence_ppo_hand_batch():
    # the four cases above in one batch of N=4 sequences:
    # loss = mean(-1.2, 0.8, -0.5, 1.5) = 0.6 / 4 = 0.15 ; clipfrac = 2/4
    cases = [(1.0, 1.5), (-1.0, 0.5), (1.0, 0.5), (-1.0, 1.5)]
    parts = [_seq_case(a, r) for a, r in cases]
    adv = torch.cat([p[0] for p in parts])
    lp = torch.cat([p[1] for p in parts]).requires_grad_(True)
    old = torch.cat([p[2] for p in parts])
    mask = torch.cat([p[3] for p in parts])
    out, stats = sequence_ppo_clip_loss(adv, lp, old, mask, clip_range=0.2)
    close(out, 0.15)
    close(stats.clipfrac, 0.5)
    close(stats.ratio_min, 0.5)
    close(stats.ratio_max, 1.5)
    close(stats.ratio_mean, 1.0)  # (1.5 + 0.5 + 0.5 + 1.5) / 4
    close(stats.approxkl, 0.5 * (math.log(1.5) ** 2 + math.log(0.5) ** 2) / 2)
    out.backward()
    # per-sequence grads from the single cases, divided by N = 4
    close(lp.grad, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [-0.125, -0.125, 0.0], [0.375, 0.375, 0.0]])
    for v in vars(stats).values():
        assert v.dim() == 0 and not v.requires_grad


def test_sequence_ppo_vs_loop_reference():
    lp, old, mask = random_batch(8, 6, seed=11)
    adv = torch.randn(8, generator=torch.Generator().manual_seed(2), dtype=D)
    eps = 0.2
    terms, clipped = [], 0
    for i in range(8):
        log_ratio = 0.0
        for j in range(6):
            if mask[i, j]:
                log_ratio += float(lp[i, j]) - float(old[i, j])
        r = math.exp(log_ratio)
        a = float(adv[i])
        unclipped, clip_term = -a * r, -a * min(max(r, 1 - eps), 1 + eps)
        terms.append(max(unclipped, clip_term))
        clipped += clip_term > unclipped
    out, stats = sequence_ppo_clip_loss(adv, lp, old, mask, eps)
    close(out, sum(terms) / 8)
    close(stats.clipfrac, clipped / 8)


# ---------------------------------------------------------------- token PPO-clip


def token_ppo_reference(adv, lp, old, mask, eps):
    total, count, clipped, kl, ratios = 0.0, 0, 0, 0.0, []
    for i in range(lp.shape[0]):
        for j in range(lp.shape[1]):
            if not mask[i, j]:
                continue
            log_r = float(lp[i, j]) - float(old[i, j])
            r = math.exp(log_r)
            a = float(adv[i, j])
            unclipped, clip_term = -a * r, -a * min(max(r, 1 - eps), 1 + eps)
            total += max(unclipped, clip_term)
            clipped += clip_term > unclipped
            kl += 0.5 * log_r**2
            ratios.append(r)
            count += 1
    return total / count, clipped / count, kl / count, ratios


def test_token_ppo_vs_loop_reference():
    lp, old, mask = random_batch(6, 8, seed=5)
    adv = torch.randn(6, 8, generator=torch.Generator().manual_seed(9), dtype=D)
    loss, clipfrac, kl, ratios = token_ppo_reference(adv, lp, old, mask, 0.2)
    assert 0 < clipfrac < 1  # the random batch exercises both branches
    out, stats = token_ppo_clip_loss(adv, lp, old, mask, 0.2)
    close(out, loss)
    close(stats.clipfrac, clipfrac)
    close(stats.approxkl, kl)
    close(stats.ratio_mean, sum(ratios) / len(ratios))
    close(stats.ratio_min, min(ratios))
    close(stats.ratio_max, max(ratios))
    for v in vars(stats).values():
        assert v.dim() == 0 and not v.requires_grad


def test_token_ppo_hand():
    # real tokens: (A=+1, r=1.5) -> -1.2 clipped ; (A=-1, r=1.5) -> 1.5 ; third is padding
    # loss = (-1.2 + 1.5) / 2 = 0.15 ; clipfrac = 1/2
    old = t([[-1.0, -1.0, -1.0]])
    lp = (old + t([[math.log(1.5), math.log(1.5), 5.0]])).requires_grad_(True)
    adv = t([[1.0, -1.0, 100.0]])
    mask = torch.tensor([[True, True, False]])
    out, stats = token_ppo_clip_loss(adv, lp, old, mask, 0.2)
    close(out, 0.15)
    close(stats.clipfrac, 0.5)
    close(stats.ratio_max, 1.5)  # the padded ratio e^5 is ignored
    out.backward()
    # clipped token: 0 ; unclipped: d/dlp (1 * r) / 2 = 1.5 / 2 = 0.75 ; padding: 0
    close(lp.grad, [[0.0, 0.75, 0.0]])


# ---------------------------------------------------------------- padding invariance


def _with_junk(x, mask, value):
    return torch.where(mask, x, torch.full_like(x, value))


@pytest.mark.parametrize("junk", [0.0, 1e4, -1e4, 80.0])
def test_padding_invariance(junk):
    lp, old, mask = random_batch(5, 7, seed=13)
    adv = torch.randn(5, generator=torch.Generator().manual_seed(4), dtype=D)
    adv_tok = adv[:, None].expand(5, 7).clone()

    def run(lp_in, old_in, adv_tok_in):
        results = []
        for fn in ("reinforce", "seq", "tok"):
            x = lp_in.clone().requires_grad_(True)
            if fn == "reinforce":
                loss, stats = reinforce_loss(adv, x, mask), None
            elif fn == "seq":
                loss, stats = sequence_ppo_clip_loss(adv, x, old_in, mask, 0.2)
            else:
                loss, stats = token_ppo_clip_loss(adv_tok_in, x, old_in, mask, 0.2)
            loss.backward()
            results.append((loss.detach(), x.grad, stats))
        return results

    clean = run(lp, old, adv_tok)
    dirty = run(_with_junk(lp, mask, junk), _with_junk(old, mask, -junk), _with_junk(adv_tok, mask, junk))
    for (l0, g0, s0), (l1, g1, s1) in zip(clean, dirty):
        assert torch.equal(l0, l1)
        assert torch.equal(g0, g1)
        assert torch.isfinite(g1).all() and (g1[~mask] == 0).all()
        if s0 is not None:
            for name in vars(s0):
                assert torch.equal(getattr(s0, name), getattr(s1, name)), name


def test_masked_sums_match_loop_reference():
    lp, _, mask = random_batch(4, 6, seed=21)
    close(masked_sum(lp, mask, dim=1), masked_sum_rows_reference(lp, mask))


# ---- log-probs and entropy from logits, against a per-position loop
def test_token_logprobs_and_entropy_match_loop():
    from rloo.objectives import entropy_from_logits, token_logprobs

    torch.manual_seed(0)
    logits = torch.randn(3, 5, 7) * 3
    ids = torch.randint(0, 7, (3, 5))
    lp = token_logprobs(logits, ids)
    ent = entropy_from_logits(logits)
    for i in range(3):
        for t in range(5):
            row = [float(z) for z in logits[i, t]]
            z = math.log(sum(math.exp(v) for v in row))
            probs = [math.exp(v - z) for v in row]
            assert abs(lp[i, t].item() - (row[ids[i, t]] - z)) < 1e-5
            assert abs(ent[i, t].item() - -sum(p * math.log(p) for p in probs)) < 1e-5


def test_token_logprobs_bf16_logits_computed_in_float32():
    from rloo.objectives import token_logprobs

    logits = torch.randn(2, 4, 50).bfloat16()
    ids = torch.randint(0, 50, (2, 4))
    lp = token_logprobs(logits, ids)
    assert lp.dtype == torch.float32
    assert torch.allclose(lp, torch.log_softmax(logits.float(), -1).gather(-1, ids[..., None]).squeeze(-1), atol=1e-6)


# ---- the learning-rate schedule shared by every module
def test_lr_factor_warms_up_then_follows_the_schedule():
    from rloo.algorithms.optim import lr_factor

    # 10 steps, 4 of warm-up: (s+1)/5 for s < 4, then 1 - (s-4)/6
    assert [round(lr_factor(s, 4, 10, "linear"), 6) for s in range(10)] == [
        0.2,
        0.4,
        0.6,
        0.8,
        1.0,
        round(5 / 6, 6),
        round(4 / 6, 6),
        0.5,
        round(2 / 6, 6),
        round(1 / 6, 6),
    ]
    assert lr_factor(7, 4, 10, "cosine") == pytest.approx(0.5 * (1 + math.cos(math.pi * 3 / 6)))
    assert lr_factor(9, 4, 10, "constant") == 1.0
    with pytest.raises(ValueError, match="lr_schedule"):
        lr_factor(5, 4, 10, "step")


def test_missing_eos_score_replaces_the_score_as_trl_09():
    scores = t([1.0, 2.0, float("nan"), -3.0])
    eos = torch.tensor([True, False, False, False])
    out = apply_missing_eos_penalty(scores, eos, None, replacement=-1.0)
    assert out[0] == 1.0 and out[1] == -1.0 and torch.isnan(out[2]) and out[3] == -1.0  # unscored stays unscored
