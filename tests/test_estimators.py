"""The GRPO family's math (rloo/objectives/) against values computed by hand (in the comments), pass@k and the
majority vote against hand counts, and the one policy-gradient step (rloo/algorithms/policy_gradient.py) in a real
Trainer: its GRPO choices with RLOO's advantage train as RLOO, its token mean is the same whatever the micro-batches,
DAPO's dynamic sampling refills a rollout from fresh prompts, and every named algorithm guards alike."""

import math

import lightning as L
import pytest
import torch

from rloo.algorithms.registry import POLICY_GRADIENT_FAMILY
from rloo.evaluation.pass_at_k import majority_vote, pass_at_k
from rloo.objectives import (
    LossForm,
    aggregate,
    aggregation_share,
    batch_whitened_tokens,
    clipped_terms,
    group_advantages,
    informative_groups,
    kl_per_token,
    overlong_penalty,
    per_token_rewards,
    policy_gradient_loss,
    returns_to_go,
)
from tests.test_module import fit

D = torch.float64
ROOT7 = math.sqrt(7.0)


def close(a, b, tol=1e-6):
    assert torch.allclose(torch.as_tensor(a, dtype=D), torch.as_tensor(b, dtype=D), atol=tol), (a, b)


# ---- advantages -----------------------------------------------------------------------------------------------
REWARDS = torch.tensor([1.0, 2.0, 6.0, 0.0, 0.0, 0.0], dtype=D)  # two groups of k=3


def test_group_advantages_hand_values():
    # group 1: mean 3, centred [-2, -1, 3], unbiased var (4 + 1 + 9) / 2 = 7; group 2: all equal
    close(group_advantages(REWARDS, 3, "group_mean"), [-2, -1, 3, 0, 0, 0])
    close(group_advantages(REWARDS, 3, "group_std", std_eps=1e-12), [-2 / ROOT7, -1 / ROOT7, 3 / ROOT7, 0, 0, 0])
    plus_one = ROOT7 + 1  # std_eps = 1 in the denominator
    close(group_advantages(REWARDS, 3, "group_std", std_eps=1.0), [-2 / plus_one, -1 / plus_one, 3 / plus_one, 0, 0, 0])
    # leave-one-out: b_i = (9 - r_i) / 2 = [4, 3.5, 1.5] -> [-3, -1.5, 4.5], k/(k-1) times the centred rewards
    close(group_advantages(REWARDS, 3, "leave_one_out"), [-3, -1.5, 4.5, 0, 0, 0])


def test_reinforce_pp_returns_to_go_and_batch_whitening_hand_values():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    kl = torch.tensor([[0.1, 0.2, 0.3, 9.0], [0.5, 9.0, 9.0, 9.0]], dtype=D)  # 9 on padding must not count
    # r_t = -KL_t, the score on the last real token: [-0.1, -0.2, -0.3 + 2], [-0.5 - 1]
    rewards = per_token_rewards(torch.tensor([2.0, -1.0], dtype=D), kl, mask, 1.0)
    returns = returns_to_go(rewards, mask)
    close(returns, [[1.4, 1.5, 1.7, 0], [-1.5, 0, 0, 0]])
    # the four real returns: mean 0.775, deviations .625 .725 .925 -2.275, var over n (OpenRLHF's) = 6.6475 / 4
    std = math.sqrt((0.625**2 + 0.725**2 + 0.925**2 + 2.275**2) / 4)
    close(batch_whitened_tokens(returns, mask), [[0.625 / std, 0.725 / std, 0.925 / std, 0], [-2.275 / std, 0, 0, 0]])


def reinforce_pp_baseline_advantages(scores, mask, k):
    """REINFORCE++-baseline with the KL as a loss term (none in the reward): group-centred score, returns, whitened."""
    centred = group_advantages(scores, k, "group_mean")
    return batch_whitened_tokens(
        returns_to_go(per_token_rewards(centred, torch.zeros(mask.shape, dtype=D), mask, 0.0), mask), mask
    )


def test_reinforce_pp_baseline_whitens_per_token_as_openrlhf():
    # scores [1, 0, 1, 0], k = 2, lengths [4, 1, 4, 1]: centred [0.5, -0.5, 0.5, -0.5] on every token of each
    # completion, so 8 tokens of 0.5 and 2 of -0.5: mean 0.3, var (8 * 0.2^2 + 2 * 0.8^2) / 10 = 0.16, std 0.4;
    # 0.5 -> (0.5 - 0.3) / 0.4 = 0.5 and -0.5 -> (-0.5 - 0.3) / 0.4 = -2.0 (OpenRLHF; the per-sequence z-score gave
    # +-0.866, veRL's Bessel-corrected variance 1.6 / 9 gives 0.474 and -1.897)
    lengths = torch.tensor([4, 1, 4, 1])
    mask = (torch.arange(4)[None, :] < lengths[:, None]).long()
    advantages = reinforce_pp_baseline_advantages(torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=D), mask, 2)
    close(advantages, [[0.5] * 4, [-2.0, 0, 0, 0], [0.5] * 4, [-2.0, 0, 0, 0]])


def test_batch_whitening_over_two_ranks_is_the_global_batch_s():
    """Two ranks, each whitening its own rows with sums reduced over both (an all-reduce of two threads), give the
    rows of one whitening of the whole batch; alone, a rank's whitening differs."""
    import threading

    values = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [-1.0, 5.0, 0.0], [2.0, 2.0, 2.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])
    halves, slots, results = (slice(0, 2), slice(2, 4)), [None, None], [None, None]
    barrier = threading.Barrier(2)

    def all_reduce_sum(rank):
        def reduce(tensor):
            slots[rank] = tensor
            barrier.wait()
            total = slots[0] + slots[1]
            barrier.wait()  # both read before either writes the next
            return total

        return reduce

    def rank(r):
        results[r] = batch_whitened_tokens(values[halves[r]], mask[halves[r]], all_reduce_sum(r))

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    [thread.start() for thread in threads]
    [thread.join() for thread in threads]
    whole = batch_whitened_tokens(values, mask)
    close(torch.cat(results), whole, 1e-12)
    assert not torch.allclose(batch_whitened_tokens(values[:2], mask[:2]), whole[:2])


# ---- loss aggregation ----------------------------------------------------------------------------------------
TERMS = torch.tensor([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 100.0, 100.0]], dtype=D)  # 100 on padding
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token_mean", (1 + 2 + 3 + 4) / 4),  # every token alike: 2.5
        ("seq_mean_token_mean", (2 + 4) / 2),  # each completion's token mean, then the mean: 3
        ("seq_mean_token_sum", (6 + 4) / 2),  # each completion's sum, then the mean: 5
        ("token_sum_norm", 10 / (2 * 5)),  # the sum over (completions * constant 5): 1
    ],
)
def test_aggregation_hand_values(mode, expected):
    close(aggregate(TERMS, MASK, mode, constant=5), expected)


def test_aggregation_shares_add_micro_batches_up_to_the_whole():
    for mode in ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "token_sum_norm"):
        whole = aggregate(TERMS, MASK, mode, constant=5)
        parts = sum(
            aggregation_share(mode, MASK[i : i + 1], MASK) * aggregate(TERMS[i : i + 1], MASK[i : i + 1], mode, 5)
            for i in range(2)
        )
        close(parts, whole)
    assert aggregation_share("token_mean", MASK[:1], MASK) == 0.75  # 3 of the 4 tokens
    assert aggregation_share("seq_mean_token_mean", MASK[:1], MASK) == 0.5


# ---- clipping and ratios --------------------------------------------------------------------------------------
def test_asymmetric_clip_hand_values():
    ratio = torch.tensor([0.7, 1.0, 1.25, 1.3], dtype=D)
    # A = 1: clip(r, 0.8, 1.28) = [0.8, 1, 1.25, 1.28]; max(-r, -clip) = [-0.7, -1, -1.25, -1.28]
    terms, active = clipped_terms(torch.ones(4, dtype=D), ratio, 0.2, 0.28)
    close(terms, [-0.7, -1.0, -1.25, -1.28])
    assert active.tolist() == [False, False, False, True]
    # A = -1: max(r, clip) = [0.8, 1, 1.25, 1.3]: the low side binds
    terms, active = clipped_terms(-torch.ones(4, dtype=D), ratio, 0.2, 0.28)
    close(terms, [0.8, 1.0, 1.25, 1.3])
    assert active.tolist() == [True, False, False, False]
    # symmetric 0.2 clips 1.25 as well: clip-higher is what lets it through
    assert clipped_terms(torch.ones(4, dtype=D), ratio, 0.2, 0.2)[1].tolist() == [False, False, True, True]


GSPO = LossForm("ppo_clip", "sequence", "mean", 3e-4, 4e-4, "seq_mean_token_mean")


def test_sequence_ratio_is_length_normalised_and_clipped_per_completion():
    old = torch.zeros(2, 3, dtype=D)
    new = torch.tensor([[0.1, 0.3, 7.0], [-0.6, 7.0, 7.0]], dtype=D)  # 7 on padding
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, stats = policy_gradient_loss(torch.tensor([1.0, -1.0], dtype=D), new, old, mask, GSPO)
    # exp(mean_t log rho): exp((0.1 + 0.3) / 2), exp(-0.6)
    close(stats["ratio_max"], math.exp(0.2))
    close(stats["ratio_min"], math.exp(-0.6))
    # A = 1, s = 1.2214 > 1.0004: -clip = -1.0004 wins; A = -1, s = 0.5488 < 0.9997: clip = 0.9997 wins
    assert stats["clipfrac"].item() == 1.0
    close(loss, (-1.0004 + 0.9997) / 2)


def test_on_policy_gradients_of_the_token_and_sequence_ratios():
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([1.0, -1.0], dtype=D)
    logprobs = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], dtype=D, requires_grad=True)
    # sequence (GSPO), seq_mean_token_mean: d/dlogp_{i,t} of mean_i(-A_i s_i) = -A_i / |y_i| / N at s = 1
    form = LossForm("ppo_clip", "sequence", "mean", 0.2, 0.2, "seq_mean_token_mean")
    (grad,) = torch.autograd.grad(policy_gradient_loss(adv, logprobs, logprobs.detach(), mask, form)[0], logprobs)
    close(grad, [[-0.25, -0.25, 0], [0.5, 0, 0]])
    # token ratios, token_mean over the 3 real tokens: -A_i / 3 on each
    form = LossForm("ppo_clip", "token", "sum", 0.2, 0.28, "token_mean")
    (grad,) = torch.autograd.grad(policy_gradient_loss(adv, logprobs, logprobs.detach(), mask, form)[0], logprobs)
    close(grad, [[-1 / 3, -1 / 3, 0], [1 / 3, 0, 0]])
    # RLOO: the summed sequence ratio, seq_mean_token_sum: -A_i / N on each token (REINFORCE's gradient)
    (grad,) = torch.autograd.grad(policy_gradient_loss(adv, logprobs, logprobs.detach(), mask, LossForm())[0], logprobs)
    close(grad, [[-0.5, -0.5, 0], [0.5, 0, 0]])


def test_a_sequence_term_weighs_completions_by_the_aggregation():
    """A sequence-level term is one per completion: seq_mean_* weigh completions alike, token_mean by length."""
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    adv = torch.tensor([2.0, -1.0], dtype=D)
    logprobs = torch.zeros(2, 4, dtype=D)  # ratio 1: the terms are -A = [-2, 1]
    for aggregation, expected in [
        ("seq_mean_token_mean", (-2 + 1) / 2),
        ("seq_mean_token_sum", (-2 + 1) / 2),
        ("token_mean", (3 * -2 + 1 * 1) / 4),  # -1.25
        ("token_sum_norm", (3 * -2 + 1) / (2 * 5)),  # constant 5: -0.5
    ]:
        form = LossForm("ppo_clip", "sequence", "sum", 0.2, 0.2, aggregation, 5)
        close(policy_gradient_loss(adv, logprobs, logprobs, mask, form)[0], expected)


def test_k1_and_k2_kl_loss_terms_hand_values():
    # log r = log pi - log pi_ref = log 0.5 - log 0.25 = log 2; k1 = log r (gradient 1), k2 = (log r)^2 / 2 (gradient
    # log r: REINFORCE++-baseline's recommended loss term, whose gradient is the k1 KL's true gradient)
    logprobs = torch.tensor([math.log(0.5), math.log(0.3)], dtype=D, requires_grad=True)
    ref = torch.tensor([math.log(0.25), math.log(0.3)], dtype=D)
    for estimator, value, gradient in [("k1", math.log(2), 1.0), ("k2", math.log(2) ** 2 / 2, math.log(2))]:
        kl = kl_per_token(logprobs, ref, estimator)
        close(kl, [value, 0.0])
        (grad,) = torch.autograd.grad(kl.sum(), logprobs)
        close(grad, [gradient, 1.0 if estimator == "k1" else 0.0])


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_the_kl_loss_term_uses_the_configured_estimator(tiny_run_assets, tokenizer, monkeypatch, estimator):
    """algo=grpo kl_estimator=<e>: the loss term (the call on log-probs that carry a gradient) is e's, as veRL's
    kl_loss_type; the logged kl_loss is its mean."""
    import rloo.algorithms.policy_gradient as step

    seen, real = [], step.kl_per_token
    monkeypatch.setattr(
        step, "kl_per_token", lambda lp, ref, e="k1": (seen.append((lp.requires_grad, e)), real(lp, ref, e))[1]
    )
    fit(tiny_run_assets, tokenizer, algorithm="grpo", kl_estimator=estimator)
    assert {e for grad, e in seen if grad} == {estimator} and {e for grad, e in seen if not grad} == {estimator}


def test_k3_kl_loss_term_hand_values():
    logprobs = torch.tensor([math.log(0.5), math.log(0.3)], dtype=D, requires_grad=True)
    ref = torch.tensor([math.log(0.25), math.log(0.3)], dtype=D)
    kl = kl_per_token(logprobs, ref, "k3")
    # pi_ref / pi = 0.5: 0.5 - log 0.5 - 1 = 0.19315; equal log-probs: 0
    close(kl, [0.5 - math.log(0.5) - 1, 0.0])
    (grad,) = torch.autograd.grad(kl.sum(), logprobs)
    close(grad, [1 - 0.5, 0.0])  # d/dlogp (e^{ref - lp} - (ref - lp) - 1) = 1 - pi_ref / pi


# ---- DAPO's sampling changes ---------------------------------------------------------------------------------
def test_overlong_shaping_hand_values():
    # L_max 16, L_cache 4: free up to 12, then (12 - |y|) / 4 down to -1 at 16, -1 beyond
    close(overlong_penalty(torch.tensor([10, 12, 13, 15, 16, 17]), 16, 4), [0, 0, -0.25, -0.75, -1.0, -1.0])
    # the paper's fifth of L_max = 16: L_cache 3.2, free up to 12.8; 13 -> -0.2 / 3.2 = -0.0625, 14 -> -0.375
    close(overlong_penalty(torch.tensor([12, 13, 14, 16]), 16, 0.2 * 16), [0, -0.0625, -0.375, -1.0])


def test_dynamic_sampling_filter_keeps_groups_with_a_signal():
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert informative_groups(scores, 3).tolist() == [False, True, False]


# ---- pass@k and majority vote ---------------------------------------------------------------------------------
def test_pass_at_k_hand_values():
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)  # c / n
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2) / C(5,2)
    assert pass_at_k(4, 3, 2) == 1.0  # C(1, 2) = 0: any two draws hold a correct one
    assert pass_at_k(4, 0, 4) == 0.0
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def test_majority_vote_hand_values():
    assert majority_vote(["4", "5", "4", "7"], [True, False, True, False]) is True
    assert majority_vote(["3", "5", "5", "3"], [False, True, True, False]) is False  # a tie: the first seen, "3"
    assert majority_vote([None, None, "8", None], [False, False, True, False]) is True  # no answer, no vote
    assert majority_vote([None, None], [False, False]) is False


# ---- the module in a Trainer -----------------------------------------------------------------------------------
def test_group_module_with_rloo_choices_trains_as_rloo(tiny_run_assets, tokenizer):
    """GRPO's token-level ratio with RLOO's advantage, sequence sums and the KL in the reward is RLOO's step: the
    same weights after three rollouts as algo=rloo loss=reinforce's, from the same samples."""
    shared = dict(kl_coef=0.05, kl_estimator="k1", micro_batch_size=16)
    _, rloo = fit(tiny_run_assets, tokenizer, loss="reinforce", **shared)
    _, group = fit(
        tiny_run_assets,
        tokenizer,
        algorithm="grpo",
        advantage="leave_one_out",
        loss_aggregation="seq_mean_token_sum",
        kl_in="reward",
        **shared,
    )
    for (name, a), b in zip(rloo.policy.state_dict().items(), group.policy.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-5), name


@pytest.mark.parametrize("algorithm", ["dapo", "reinforce_pp"])
def test_token_mean_is_the_same_whatever_the_micro_batches(tiny_run_assets, tokenizer, algorithm):
    """The token mean weighs each micro-batch by its share of the mini-batch's tokens: one micro-batch of 16 and
    four of 4 take the same optimiser steps."""
    # REINFORCE++ whitens over the batch: its forward comes first unless one micro-batch holds the rollout, which
    # draws no shuffle; two sizes that both split it draw alike
    sizes = (8, 4) if algorithm == "reinforce_pp" else (16, 4)
    runs = [fit(tiny_run_assets, tokenizer, algorithm=algorithm, micro_batch_size=size)[1] for size in sizes]
    for (name, a), b in zip(runs[0].policy.state_dict().items(), runs[1].policy.state_dict().values()):
        assert torch.allclose(a, b, atol=5e-5), name  # float32 sums in another order: ~1e-5 apart


class RecordSteps(L.Callback):
    """Each step's rollout and targets, and the metrics it logged (rloo.algorithms.policy_gradient.log_metrics,
    wrapped)."""

    def __init__(self, monkeypatch=None, reward=None):
        import rloo.algorithms.policy_gradient as step

        self.reward, self.metrics, self.rollouts = reward, [], []
        if monkeypatch is not None:
            logged = step.log_metrics
            monkeypatch.setattr(
                step, "log_metrics", lambda module, m, **kw: (self.metrics.append(dict(m)), logged(module, m, **kw))
            )

    def setup(self, trainer, module, stage):
        if self.reward is not None:
            module.episode_service.reward = self.reward

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.rollouts.append((module.last_rollout, module.last_targets))


def test_grpo_advantages_are_the_group_standardised_scores(tiny_run_assets, tokenizer):
    record = RecordSteps()
    fit(tiny_run_assets, tokenizer, algorithm="grpo", callbacks=[record])
    for rollout, targets in record.rollouts:
        scores = rollout.scores.double() - 1.0 * (~rollout.ended_with_eos.bool()).double()  # missing-EOS penalty 1
        for p in range(len(scores) // 4):
            group = scores[p * 4 : p * 4 + 4]
            expected = (group - group.mean()) / (group.std() + 1e-4)
            got = targets.sequence_advantages(rollout.completion_mask)[p * 4 : p * 4 + 4]
            close(got[rollout.lengths[p * 4 : p * 4 + 4] > 0], expected[rollout.lengths[p * 4 : p * 4 + 4] > 0], 1e-4)


def test_reinforce_pp_baseline_gives_each_token_its_group_centred_score_whitened(tiny_run_assets, tokenizer):
    """algo=reinforce_pp_baseline in a Trainer (KL as a loss term, none in the reward): every token of a completion
    carries (s_i - mean of its group - mu) / sigma, mu and sigma over the rollout's real tokens (variance over n)."""
    record = RecordSteps()
    fit(tiny_run_assets, tokenizer, algorithm="reinforce_pp_baseline", callbacks=[record])
    for rollout, targets in record.rollouts:
        mask = rollout.completion_mask.bool()
        scores = rollout.scores.double() - 1.0 * (~rollout.ended_with_eos.bool()).double()  # missing-EOS penalty 1
        centred = (scores.reshape(-1, 4) - scores.reshape(-1, 4).mean(1, keepdim=True)).reshape(-1)
        tokens = centred[:, None].expand(mask.shape)[mask]  # each completion's centred score on each real token
        expected = (tokens - tokens.mean()) / tokens.var(unbiased=False).clamp(min=1e-8).sqrt()
        assert targets.advantages.shape == mask.shape
        close(targets.advantages[mask], expected, 1e-4)
        assert (targets.advantages[~mask] == 0).all()


def test_dynamic_sampling_refills_from_fresh_prompts_and_says_how_many_were_dropped(
    tiny_run_assets, tokenizer, monkeypatch
):
    from rloo.rewards.scoring import Reward, parse_reward

    constant = Reward(parse_reward("tests.reward_functions:constant"), "raise")
    record = RecordSteps(monkeypatch, constant)  # every group's scores are equal: every group is dropped, every round
    fit(tiny_run_assets, tokenizer, algorithm="dapo", callbacks=[record], num_rollouts=2)
    first = record.metrics[0]
    assert first["dynamic_sampling/rounds"] == 3  # dynamic_sampling_rounds
    assert first["dynamic_sampling/dropped_groups"] == 4 * 4  # 4 prompts a round, 4 rounds
    assert first["dynamic_sampling/filled_with_dropped"] == 4
    assert first["dynamic_sampling/sampled_completions"] == 64
    rollout, targets = record.rollouts[0]
    assert len(rollout) == 16 and torch.count_nonzero(targets.advantages) == 0

    record = RecordSteps(monkeypatch, Reward(parse_reward("tests.reward_functions:length"), "raise"))
    fit(tiny_run_assets, tokenizer, algorithm="dapo", callbacks=[record], num_rollouts=2)
    for step, (rollout, _) in zip(record.metrics, record.rollouts):
        kept = 4 - step["dynamic_sampling/filled_with_dropped"]
        groups = informative_groups(rollout.scores - 0.0, 4)  # the refilled rollout leads with informative groups
        assert groups[: int(kept)].all() and len(rollout) == 16


def test_a_sampled_budget_stops_dapo_once_its_generated_completions_reach_it(tiny_run_assets, tokenizer, monkeypatch):
    """budget=sampled: total_episodes counts every completion generated. With every group dropped every round, the
    first rollout generates 64 completions (16 trained on): a budget of 4 rollouts x 16 is spent after one rollout;
    a sampled budget without dropped groups is the trained one."""
    from rloo.rewards.scoring import Reward, parse_reward

    constant = Reward(parse_reward("tests.reward_functions:constant"), "raise")
    record = RecordSteps(monkeypatch, constant)
    sampled = dict(budget="sampled", lr_schedule="constant", callbacks=[record], num_rollouts=4)
    _, module = fit(tiny_run_assets, tokenizer, algorithm="dapo", **sampled)
    assert (module.state.rollouts, module.state.episodes, module.state.sampled) == (1, 16, 64)
    _, module = fit(tiny_run_assets, tokenizer, algorithm="grpo", **sampled | {"callbacks": []})
    assert (module.state.rollouts, module.state.episodes, module.state.sampled) == (4, 64, 64)


# ---- the named algorithms and the keys they refuse ------------------------------------------------------------
# Each named algorithm as its authors run it; every value with its source. Keys not listed are RLOO's
# (conf/algo/shared/estimator.yaml): no dynamic sampling, no overlong shaping, a sequence ratio summed over tokens.
PUBLISHED = {
    "rloo": dict(  # Ahmadian et al. 2024 (arXiv:2402.14740), sec. 3-4; TRL RLOOConfig
        advantage="leave_one_out",  # eq. 6: the mean reward of the other k - 1
        ratio_level="sequence",  # "the whole completion is one action"
        loss_aggregation="seq_mean_token_sum",  # the loss of a completion is its summed log-prob
        clip_range=0.2,  # TRL RLOOConfig cliprange 0.2
        clip_high=0.2,
        kl_in="reward",  # R = r - beta KL inside the reward, leave-one-out baselined too
        kl_coef=0.05,  # TRL RLOOConfig kl_coef 0.05
        kl_estimator="k1",  # sum_t log pi / pi_ref
    ),
    "grpo": dict(  # Shao et al. 2024 (DeepSeekMath, arXiv:2402.03300), sec. 4.1, eq. 3 and 21
        advantage="group_std",  # (r - mean) / std
        ratio_level="token",
        loss_aggregation="seq_mean_token_mean",  # 1/G sum_i 1/|o_i| sum_t
        clip_range=0.2,  # eps 0.2 (TRL GRPOConfig epsilon)
        clip_high=0.2,
        kl_in="loss",  # beta D_KL as a loss term
        kl_coef=0.04,  # sec. 4.1: "the coefficient of KL is 0.04"
        kl_estimator="k3",  # eq. 4: pi_ref / pi - log(pi_ref / pi) - 1
    ),
    "dr_grpo": dict(  # Liu et al. 2025 (arXiv:2503.20783), sec. 3.1; scripts of sail-sg/understand-r1-zero
        advantage="group_mean",  # no std division
        ratio_level="token",
        loss_aggregation="token_sum_norm",  # no 1/|o_i|: token sums over a constant
        clip_range=0.2,
        clip_high=0.2,
        kl_in=None,
        kl_coef=0.0,  # the authors' scripts train with beta 0
    ),
    "dapo": dict(  # Yu et al. 2025 (arXiv:2503.14476), sec. 3, eq. 8-13, table of hyper-parameters
        advantage="group_std",
        ratio_level="token",
        loss_aggregation="token_mean",  # token-level policy gradient loss, sec. 3.3
        clip_range=0.2,  # eps_low 0.2
        clip_high=0.28,  # clip-higher: eps_high 0.28, sec. 3.1
        kl_in=None,
        kl_coef=0.0,  # "we exclude the KL term", sec. 2.3
        dynamic_sampling=True,  # sec. 3.2
        overlong="shape",  # soft overlong punishment, eq. 13
        overlong_buffer=0.2,  # L_cache 4,096 of L_max 20,480, sec. 4.1
        missing_eos_penalty=None,
    ),
    "reinforce_pp": dict(  # Hu 2025 (arXiv:2501.03262), sec. 3; OpenRLHF advantage_estimator=reinforce
        advantage="return_to_go_batch_std",  # per-token KL in the reward, returns-to-go, global batch whitening
        ratio_level="token",
        loss_aggregation="token_mean",  # OpenRLHF PolicyLoss: the masked mean over the batch's tokens
        clip_range=0.2,  # OpenRLHF eps_clip 0.2
        clip_high=0.2,
        kl_in="reward",
        kl_coef=0.05,  # RLOO's beta (no figure in the paper); k1 as OpenRLHF's default kl_estimator
        kl_estimator="k1",
    ),
    "reinforce_pp_baseline": dict(  # Hu 2025; OpenRLHF examples/scripts/train_reinforce_baseline_*.sh
        advantage="group_mean_batch_std",  # advantage_estimator=reinforce_baseline: group mean, token whitening
        ratio_level="token",
        loss_aggregation="token_mean",
        clip_range=0.2,
        clip_high=0.2,
        kl_in="loss",  # --use_kl_loss
        kl_coef=1e-3,  # --init_kl_coef 1e-3
        kl_estimator="k2",  # --kl_estimator k2
    ),
    "gspo": dict(  # Zheng et al. 2025 (arXiv:2507.18071), sec. 4, eq. 5-7 and sec. 5.1
        advantage="group_std",
        ratio_level="sequence",
        sequence_ratio="mean",  # s_i = (pi / pi_old)^(1/|y_i|), length-normalised
        loss_aggregation="seq_mean_token_mean",
        clip_range=3e-4,  # "left and right clipping ranges ... 3e-4 and 4e-4", sec. 5.1
        clip_high=4e-4,
        kl_in=None,
        kl_coef=0.0,  # no KL term
    ),
}
RLOO_REST = dict(sequence_ratio="sum", dynamic_sampling=False, overlong="none", missing_eos_penalty=1.0, k=4)


@pytest.mark.parametrize("algorithm", sorted(PUBLISHED))
def test_each_named_algorithm_composes_to_its_authors_choices(algorithm):
    from tests.builders import train_config

    config, expected = train_config(algorithm, 10), RLOO_REST | PUBLISHED[algorithm]
    kl_in = expected.pop("kl_in")
    assert config.kl_in_loss == (kl_in == "loss") and config.kl_in_reward == (kl_in == "reward")
    got = {name: getattr(config, name) for name in expected}
    assert got == expected and type(config).__name__ == "EstimatorConfig"
    if algorithm == "dapo":  # the run's L_cache: a fifth of its response_length
        assert config.overlong_cache_tokens == 0.2 * config.sampling.max_new_tokens


@pytest.mark.parametrize(
    "overrides, refused",
    [
        (["algo=grpo", "std_eps=0.1", "advantage=group_mean"], "std_eps=0.1 does nothing with advantage=group_mean"),
        (["algo=grpo", "aggregation_constant=64"], "aggregation_constant=64 does nothing with loss_aggregation"),
        (["algo=dapo", "kl_in=loss"], "kl_in=loss does nothing with kl_coef=0"),
        (["algo=gspo", "kl_estimator=k1"], "kl_estimator=k1 does nothing with kl_coef=0"),
        (["algo=grpo", "kl_coef=0", "kl_estimator=k1"], "kl_estimator=k1 does nothing with kl_coef=0"),
        (["algo=grpo", "dynamic_sampling_rounds=5"], "dynamic_sampling_rounds=5 does nothing with dynamic_sampling"),
        (["algo=dapo", "budget=sampled"], "budget=sampled stops a dynamic_sampling run at a rollout no one knows"),
        (["algo=grpo", "overlong_buffer=0.5"], "overlong_buffer=0.5 does nothing with overlong=none"),
        (["algo=dapo", "overlong_cache=4"], "overlong_cache is not a config key of python -m rloo.train: it is now"),
        (["algo=dapo", "overlong_buffer=2"], "overlong_buffer=2 is not allowed"),
        (["algo=reinforce_pp_baseline", "ratio_level=sequence"], "advantage=group_mean_batch_std gives one per"),
        (["algo=reinforce_pp", "ratio_level=sequence"], "ratio_level=sequence needs one advantage per completion"),
        (["algo=rloo", "baseline_decay=0.5"], "baseline_decay=0.5 does nothing with advantage=leave_one_out"),
        (["algo=reinforce", "raft_rank_by=score"], "raft_rank_by=score does nothing with advantage=moving_average"),
        (["algo=grpo", "sequence_ratio=mean"], "sequence_ratio=mean does nothing with ratio_level=token"),
        (
            ["algo=rloo", "loss=reinforce", "clip_range_high=0.3"],
            "clip_range_high=0.3 does nothing with loss=reinforce",
        ),
        (["algo=rloo", "advantage=group_std", "k=1"], "k=1 is not allowed: an integer >= 2 with advantage=group_std"),
        (["algo=grpo", "eval.pass_k=[1,8]"], "eval.pass_k=[1, 8] does nothing with eval.samples_per_prompt=0"),
        (["algo=grpo", "eval.samples_per_prompt=4"], "needs reward functions"),
        (
            ["algo=grpo", "reward=rloo.toy.rule_rewards:topic_recall", "eval.samples_per_prompt=4", "eval.pass_k=[8]"],
            "eval.pass_k=[8] is not allowed: each k in [1, eval.samples_per_prompt=4]",
        ),
        (
            ["algo=grpo", "reward=rloo.toy.rule_rewards:topic_recall", "eval.samples_per_prompt=4", "eval.answer=x:y"],
            "eval.answer: cannot import 'x'",
        ),
    ],
)
def test_a_key_the_estimator_does_not_read_is_refused_in_one_line(overrides, refused):
    from tests.test_config import first_error

    error = first_error(*overrides)
    assert refused in error and "\n" not in error


def test_dynamic_sampling_is_refused_on_several_devices():
    from rloo.config.checks import ConfigError, validate_train_config, world_size
    from rloo.run.cli import compose_train_config

    cfg = compose_train_config(["algo=dapo", "trainer.devices=2", "trainer.strategy=ddp"])
    with pytest.raises(ConfigError, match="dynamic_sampling=true runs on one device"):
        validate_train_config(cfg, world_size(cfg.trainer))


# ---- guards: the same for every estimator of the one step --------------------------------------------------------
FAMILY = POLICY_GRADIENT_FAMILY


@pytest.mark.parametrize("algorithm", FAMILY)
def test_a_rollout_no_completion_could_be_scored_counts_as_bad_for_every_estimator(
    tiny_run_assets, tokenizer, algorithm
):
    """reward_errors=mask and a reward function that always fails: every rollout is unscored, each counts as bad,
    and max_bad_steps in a row stop the run, whichever estimator the step runs."""
    from rloo.rewards.scoring import Reward, parse_reward
    from rloo.utils.errors import NonFiniteError

    failing = Reward(parse_reward("tests.reward_functions:raises"), "mask")
    with pytest.raises(NonFiniteError, match=r"^2 rollouts in a row \(max_bad_steps=2\)"):
        fit(tiny_run_assets, tokenizer, algorithm=algorithm, callbacks=[RecordSteps(reward=failing)], max_bad_steps=2)


@pytest.mark.parametrize("algorithm", ["rloo", "grpo", "dapo"])
def test_rollouts_whose_scores_do_not_differ_are_counted_and_stop_the_run(tiny_run_assets, tokenizer, algorithm):
    """A constant reward: no prompt's k completions differ in score. Each rollout counts, and max_no_signal_steps in
    a row stop the run; a reward with spread counts none."""
    from rloo.rewards.scoring import Reward, parse_reward
    from rloo.utils.errors import NoLearningSignal

    constant = Reward(parse_reward("tests.reward_functions:constant"), "raise")
    with pytest.raises(NoLearningSignal, match=r"^2 rollouts in a row \(max_no_signal_steps=2\) had no prompt whose 4"):
        fit(
            tiny_run_assets,
            tokenizer,
            algorithm=algorithm,
            callbacks=[RecordSteps(reward=constant)],
            max_no_signal_steps=2,
        )
    _, module = fit(tiny_run_assets, tokenizer, algorithm=algorithm, max_no_signal_steps=1)  # the reward model's scores
    assert module.state.no_signal_rollouts == 0 and module.state.rollouts == 3
