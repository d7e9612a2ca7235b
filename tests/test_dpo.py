"""algo=dpo, the paper's offline baseline: the pair selection and the DPO loss against hand values and loops, the
module in a real Trainer (its pairs come from the frozen reference, whatever the policy learns), and real runs of
`python -m rloo.train`."""

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from rloo.algorithms.dpo import DPOModule
from rloo.objectives import dpo_loss, preference_pairs
from rloo.run.cli import compose_train_config
from rloo.utils.errors import ConfigError
from tests.test_module import fit

NAN = float("nan")


# ---- the math --------------------------------------------------------------------------------------------
def test_preference_pairs_hand_values():
    chosen, rejected, decided = preference_pairs(torch.tensor([1.0, 3.0, 5.0, 5.0, NAN, 2.0, -1.0, 0.0]), 2)
    assert chosen.tolist()[0] == 1 and rejected.tolist()[0] == 0  # 3 beats 1
    assert chosen.tolist()[3] == 7 and rejected.tolist()[3] == 6  # 0 beats -1
    assert decided.tolist() == [True, False, False, True]  # a tie and a nan make no pair


def test_preference_pairs_match_a_loop_for_k_above_two():
    torch.manual_seed(0)
    k, scores = 4, torch.randint(0, 3, (40,)).float()  # many ties
    chosen, rejected, decided = preference_pairs(scores, k)
    for p in range(10):
        group = scores[p * k : (p + 1) * k].tolist()
        best = max(range(k), key=lambda i: (group[i], -i))
        worst = min(range(k), key=lambda i: (group[i], i))
        assert (chosen[p].item(), rejected[p].item()) == (p * k + best, p * k + worst)
        assert decided[p].item() == (group[best] > group[worst])


def test_dpo_loss_hand_values():
    # beta 0.1; chosen +0.5 over the reference, rejected -0.5: margin 0.1 * 0.5 - 0.1 * (-0.5) = 0.1
    loss, stats = dpo_loss(torch.tensor([-1.0]), torch.tensor([-2.0]), torch.tensor([-1.5]), torch.tensor([-1.5]), 0.1)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-0.1)))
    assert stats["margin"].item() == pytest.approx(0.1) and stats["accuracy"].item() == 1.0
    assert stats["chosen_reward"].item() == pytest.approx(0.05) and stats["rejected_reward"].item() == pytest.approx(
        -0.05
    )
    # the policy equal to the reference: log 2 per decided pair; an undecided pair adds 0 but counts in the mean
    same = torch.tensor([-3.0, -4.0])
    loss, _ = dpo_loss(same, same, same, same, 0.5, weights=torch.tensor([True, False]))
    assert loss.item() == pytest.approx(math.log(2) / 2)


def test_dpo_loss_matches_a_loop_and_its_gradient_prefers_the_chosen():
    torch.manual_seed(1)
    pc, pr, rc, rr = (torch.randn(6) for _ in range(4))
    pc.requires_grad_(True)
    pr.requires_grad_(True)
    weights = torch.tensor([1, 1, 0, 1, 1, 0]).bool()
    loss, _ = dpo_loss(pc, pr, rc, rr, 0.2, weights)
    expected = (
        sum(
            -math.log(1 / (1 + math.exp(-0.2 * ((pc[i] - rc[i]) - (pr[i] - rr[i])).item())))
            for i in range(6)
            if weights[i]
        )
        / 6
    )
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    assert (pc.grad[weights] < 0).all() and (pr.grad[weights] > 0).all()  # descent raises chosen, lowers rejected
    assert (pc.grad[~weights] == 0).all()


# ---- the module in a Trainer ----------------------------------------------------------------------------------
def test_dpo_learns_from_pairs_the_reference_samples_whatever_the_policy_does(tiny_run_assets, tokenizer):
    import lightning as L

    class Record(L.Callback):
        def __init__(self):
            self.completions = []

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.completions.append(module.last_rollout.completion_ids.clone())

    before = AutoModelForCausalLM.from_pretrained(tiny_run_assets / "policy").state_dict()
    runs = {}
    for lr in (1e-2, 1e-6):
        record = Record()
        _, module = fit(
            tiny_run_assets, tokenizer, module_class=DPOModule, algorithm="dpo", callbacks=[record], k=2, lr=lr
        )
        runs[lr] = (record.completions, module.policy.state_dict())
    (fast, fast_weights), (slow, slow_weights) = runs[1e-2], runs[1e-6]
    # offline: the same seed draws the same pairs at both learning rates, though the policies part ways
    assert len(fast) == 3 and all(torch.equal(a, b) for a, b in zip(fast, slow))
    assert any(not torch.allclose(fast_weights[k], slow_weights[k]) for k in before)
    assert any(not torch.equal(fast_weights[k], before[k]) for k in before)


def test_the_first_dpo_loss_is_log_two_per_decided_pair(tiny_run_assets, tokenizer, monkeypatch):
    """At step one the policy is the reference: every implicit reward is 0, so each decided pair's loss is log 2."""
    import lightning as L

    seen = {}

    class First(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.setdefault("decided", module.last_targets.decided.float().mean().item())

    import rloo.algorithms.dpo as dpo

    original = dpo.log_metrics

    def capture(module, metrics, batch_size):
        seen.setdefault("loss", float(metrics["loss/policy_avg"]))
        original(module, metrics, batch_size)

    monkeypatch.setattr(dpo, "log_metrics", capture)
    fit(
        tiny_run_assets,
        tokenizer,
        num_rollouts=1,
        module_class=DPOModule,
        algorithm="dpo",
        callbacks=[First()],
        k=2,
        micro_batch_size=16,
    )
    assert seen["decided"] > 0
    assert seen["loss"] == pytest.approx(math.log(2) * seen["decided"], rel=1e-5)


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["model.lora=true"], "model.lora"),
        (["micro_batch_size=3"], "micro_batch_size"),
        (["dpo_beta=0"], "dpo_beta"),
        (["k=1"], "k"),
    ],
)
def test_dpo_refuses_what_it_cannot_do(overrides, key):
    from rloo.config.checks import validate_train_config

    with pytest.raises(ConfigError, match=key):
        validate_train_config(compose_train_config(["algo=dpo", *overrides]))
