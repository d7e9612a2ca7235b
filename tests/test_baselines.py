"""The paper's other policy-gradient baselines on RLOO's step: REINFORCE with a moving-average baseline, vanilla
policy gradient and RAFT. Hand values and loops for the math, a real Trainer for the modules, and real runs of
`python -m rloo.train` for the options and for resuming the moving baseline."""

import lightning as L
import pytest
import torch
from transformers import AutoModelForCausalLM

from rloo.algorithms.policy_gradient import PolicyGradientModule
from rloo.objectives import best_of_k_advantages, moving_average_advantages, updated_moving_average
from tests.e2e import train
from tests.test_module import fit


# ---- the math --------------------------------------------------------------------------------------------
def test_best_of_k_hand_values():
    scores = torch.tensor([1.0, 3.0, 2.0, 5.0, 5.0, 0.0])
    assert best_of_k_advantages(scores, 3).tolist() == [0.0, 3.0, 0.0, 3.0, 0.0, 0.0]  # a tie: the first wins
    assert best_of_k_advantages(torch.tensor([float("nan"), -4.0]), 2).tolist() == [0.0, 2.0]  # nan never wins


def test_best_of_k_matches_a_loop_and_averages_to_the_nll_of_the_best():
    torch.manual_seed(0)
    k, scores = 4, torch.randn(24)
    expected = []
    for p in range(6):
        group = scores[p * k : (p + 1) * k].tolist()
        best = max(range(k), key=lambda i: (group[i], -i))
        expected += [float(k) if i == best else 0.0 for i in range(k)]
    weights = best_of_k_advantages(scores, k)
    assert weights.tolist() == expected
    sequence_logprobs = torch.randn(24)
    best_rows = torch.tensor(expected) > 0
    assert torch.allclose((-weights * sequence_logprobs).mean(), -sequence_logprobs[best_rows].mean())


def test_moving_average_hand_values():
    assert moving_average_advantages(torch.tensor([1.0, 2.0]), None).tolist() == [1.0, 2.0]  # no rollout yet: b = 0
    assert moving_average_advantages(torch.tensor([1.0, 2.0]), 0.5).tolist() == [0.5, 1.5]
    assert updated_moving_average(None, 2.0, 0.9) == 2.0  # the first rollout's mean starts it
    assert updated_moving_average(2.0, 4.0, 0.9) == pytest.approx(0.9 * 2.0 + 0.1 * 4.0)


# ---- the modules in a Trainer ------------------------------------------------------------------------------
class Record(L.Callback):
    """Each rollout's rewards and advantages as the module derived them, and its baseline after it."""

    def __init__(self):
        self.steps = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        targets, rollout = module.last_targets, module.last_rollout
        self.steps.append(
            {
                "rewards": targets.rewards.clone(),
                "advantages": targets.advantages.clone(),
                "scores": rollout.scores.clone(),
                "ended": rollout.ended_with_eos.clone(),
                "baseline": module.moving_baseline,
            }
        )


def fit_recorded(assets, tokenizer, algorithm, **keys):
    record = Record()
    _, module = fit(
        assets, tokenizer, module_class=PolicyGradientModule, algorithm=algorithm, callbacks=[record], **keys
    )
    return module, record.steps


def test_reinforce_subtracts_the_moving_average_of_earlier_rollouts(tiny_run_assets, tokenizer):
    module, steps = fit_recorded(tiny_run_assets, tokenizer, "reinforce", k=1, micro_batch_size=4, baseline_decay=0.5)
    baseline = None
    for step in steps:  # the loop reference: b before the rollout, then b <- 0.5 b + 0.5 mean R
        expected = step["rewards"] - (0.0 if baseline is None else baseline)
        assert torch.allclose(step["advantages"], expected, atol=1e-6)
        mean = step["rewards"].mean().item()
        baseline = mean if baseline is None else 0.5 * baseline + 0.5 * mean
        assert step["baseline"] == pytest.approx(baseline)
    assert len(steps) == 3 and module.moving_baseline == pytest.approx(baseline)


def test_vanilla_pg_uses_the_reward_itself(tiny_run_assets, tokenizer):
    _, steps = fit_recorded(tiny_run_assets, tokenizer, "vanilla_pg", k=1, micro_batch_size=4)
    for step in steps:
        assert torch.equal(step["advantages"], step["rewards"].float())


@pytest.mark.parametrize("rank_by", ["reward", "score"])
def test_raft_weights_the_best_of_each_prompt_by_its_ranking(tiny_run_assets, tokenizer, rank_by):
    before = AutoModelForCausalLM.from_pretrained(tiny_run_assets / "policy").state_dict()
    # a large kl_coef, so that ranking by R and by the score differ
    module, steps = fit_recorded(tiny_run_assets, tokenizer, "raft", k=4, kl_coef=5.0, raft_rank_by=rank_by)
    differ = False
    for step in steps:
        penalised = step["scores"] - 1.0 * (~step["ended"]).float()  # missing_eos_penalty 1.0 (conf/train.yaml)
        ranked = step["rewards"] if rank_by == "reward" else penalised  # R = penalised - 5 * sum_t KL_t
        groups = ranked.view(-1, 4)
        chosen = step["advantages"].view(-1, 4)
        assert (chosen.sum(1) == 4).all() and ((chosen == 0) | (chosen == 4)).all()
        assert torch.equal(groups[chosen == 4], groups.max(1).values)
        differ |= not torch.equal(step["rewards"].view(-1, 4).argmax(1), penalised.view(-1, 4).argmax(1))
    assert differ  # the two rankings chose differently somewhere: the key matters
    after = module.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # it trained on them


# ---- end to end (a step of every algorithm in every precision runs in-process in tests/test_matrix.py) ------
@pytest.mark.slow
def test_reinforce_resumes_with_its_moving_baseline_bit_identical(finished_run):
    base, _ = finished_run
    args = ("algo=reinforce", "logger=csv", "eval.before=false", "eval.after=false")
    straight = train(base / "reinforce", base / "cache", *args)
    assert straight.returncode == 0, straight.stderr[-3000:]
    checkpoint = torch.load(base / "reinforce" / "checkpoints" / "step1.ckpt", weights_only=True)
    assert isinstance(checkpoint["rloo_moving_baseline"], float)
    resumed = train(
        base / "reinforce_resumed", base / "cache", *args, f"resume={base / 'reinforce' / 'checkpoints' / 'step1.ckpt'}"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = (
        AutoModelForCausalLM.from_pretrained(base / run / "policy").state_dict()
        for run in ("reinforce", "reinforce_resumed")
    )
    assert all(torch.equal(a[k], b[k]) for k in a)
