"""The policy-gradient step (PolicyGradientModule, algo=rloo) inside a real Lightning Trainer: frozen models stay
frozen, step accounting is exact."""

import copy

import lightning as L
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rloo.algorithms.policy_gradient import PolicyGradientModule
from rloo.data.prompts import PromptDataModule
from rloo.models.loading import freeze
from tests.builders import toy_split, train_config


def fit(
    assets, tokenizer, num_rollouts=3, module_class=PolicyGradientModule, algorithm="rloo", callbacks=(), **overrides
):
    values = dict(
        k=4,
        rollout_batch_size=16,
        micro_batch_size=8,
        generation_batch_size=16,
        response_length=6,
        lr=1e-2,
        warmup_ratio=0.0,
        total_episodes=16 * num_rollouts,
    )
    config = train_config(algorithm, num_rollouts, **{**values, **overrides})
    torch.manual_seed(0)  # the sampling stream: equal settings draw equal rollouts
    policy = AutoModelForCausalLM.from_pretrained(assets / "policy")
    reference = freeze(copy.deepcopy(policy))
    reward_model = freeze(AutoModelForSequenceClassification.from_pretrained(assets / "reward_model", num_labels=1))
    module = module_class(policy, reference, reward_model, tokenizer, config)
    spec = toy_split(assets / "train.jsonl")
    datamodule = PromptDataModule(
        tokenizer,
        spec,
        spec,
        64,
        False,
        config.rollout_batch_size // config.k,
        num_rollouts,
        seed=0,
        shuffle=True,
        num_workers=0,
        log=lambda *_: None,
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        max_steps=num_rollouts * config.updates_per_rollout,
        logger=False,
        enable_checkpointing=False,
        callbacks=list(callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer, module


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("epochs, minis", [(1, 1), (2, 2)])
def test_one_lightning_step_per_rollout_and_frozen_models_unchanged(tiny_run_assets, tokenizer, epochs, minis):
    policy_before = snapshot(AutoModelForCausalLM.from_pretrained(tiny_run_assets / "policy"))
    trainer, module = fit(tiny_run_assets, tokenizer, num_rollouts=3, num_ppo_epochs=epochs, num_mini_batches=minis)
    assert module.state.rollouts == 3 and module.state.episodes == 3 * 16  # completions
    assert trainer.global_step == 3 * epochs * minis  # Lightning counts every optimiser step
    assert module.lr_schedulers().last_epoch == 3 * epochs * minis  # and the schedule followed each
    for name, value in snapshot(module.reference).items():
        assert torch.equal(value, policy_before[name]), name  # the reference is the untouched initial policy
    for model in (module.reference, module.reward_model):
        assert all(p.grad is None and not p.requires_grad for p in model.parameters())
    changed = [not torch.equal(v, policy_before[k]) for k, v in snapshot(module.policy).items()]
    assert any(changed)


def test_reward_model_weights_do_not_change(tiny_run_assets, tokenizer):
    before = snapshot(
        AutoModelForSequenceClassification.from_pretrained(tiny_run_assets / "reward_model", num_labels=1)
    )
    _, module = fit(tiny_run_assets, tokenizer, num_rollouts=2)
    after = snapshot(module.reward_model)
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_on_policy_ratio_is_exactly_one_and_nothing_is_clipped(tiny_run_assets, tokenizer):
    """One update per rollout: the sequence ratio is 1 by construction, so PPO-clip is plain REINFORCE."""
    seen = []

    class Spy(PolicyGradientModule):
        def log_step(self, rollout, targets, stats, *rest):
            seen.append(stats)
            super().log_step(rollout, targets, stats, *rest)

    fit(tiny_run_assets, tokenizer, num_rollouts=2, module_class=Spy)
    for stats in seen:
        assert stats["ratio"] == 1.0 and stats["ratio_min"] == 1.0 and stats["ratio_max"] == 1.0
        assert stats["clipfrac"] == 0.0


def test_reused_rollout_first_update_has_ratio_one_in_fp32(tiny_run_assets, tokenizer):
    """With old log-probs recomputed by the training forward, the first mini-batch sees ratio 1 to 1e-5."""
    ratios = []

    class Spy(PolicyGradientModule):
        def policy_loss(self, part, *args):
            loss, stats = super().policy_loss(part, *args)
            if len(part) < 16:  # a micro-batch's; the whole rollout's is the first-epoch diagnostic
                ratios.append((stats["ratio_min"].item(), stats["ratio_max"].item()))
            return loss, stats

    fit(
        tiny_run_assets,
        tokenizer,
        num_rollouts=1,
        module_class=Spy,
        num_ppo_epochs=2,
        num_mini_batches=2,
        micro_batch_size=4,
    )
    # the two micro-batches of the first mini-batch come before any optimiser step
    for low, high in ratios[:2]:
        assert abs(low - 1) < 1e-5 and abs(high - 1) < 1e-5
    assert any(abs(high - 1) > 1e-5 or abs(low - 1) > 1e-5 for low, high in ratios[2:])  # later ones moved


def test_logged_ratio_extremes_are_the_extremes_over_micro_batches(tiny_run_assets, tokenizer):
    per_micro, logged = [], []

    class Spy(PolicyGradientModule):
        def policy_loss(self, part, *args):
            loss, stats = super().policy_loss(part, *args)
            if len(part) < 16:
                per_micro.append({key: value.item() for key, value in stats.items()})
            return loss, stats

        def log_step(self, rollout, targets, stats, *rest):
            logged.append(stats)
            super().log_step(rollout, targets, stats, *rest)

    fit(
        tiny_run_assets,
        tokenizer,
        num_rollouts=1,
        module_class=Spy,
        num_ppo_epochs=2,
        num_mini_batches=2,
        micro_batch_size=4,
    )
    assert logged[0]["ratio_min"] == pytest.approx(min(s["ratio_min"] for s in per_micro), abs=1e-7)
    assert logged[0]["ratio_max"] == pytest.approx(max(s["ratio_max"] for s in per_micro), abs=1e-7)
    assert logged[0]["ratio_min"] < logged[0]["ratio_max"]


def test_one_forward_per_micro_batch_gives_the_same_step_as_a_separate_forward(tiny_run_assets, tokenizer):
    """Used once, a rollout takes log pi (for the KL) from the update's own forward; the same step with a separate
    forward before the update must give the same rewards, advantages and gradient."""

    class Recorded(PolicyGradientModule):
        def on_before_optimizer_step(self, optimizer):
            self.gradient = [p.grad.clone() for p in self.policy.parameters()]  # before clipping
            super().on_before_optimizer_step(optimizer)

    class SeparateForward(Recorded):
        def takes_log_pi_from_the_update(self):
            return False

    _, fused = fit(tiny_run_assets, tokenizer, num_rollouts=1, module_class=Recorded)
    _, separate = fit(tiny_run_assets, tokenizer, num_rollouts=1, module_class=SeparateForward)
    assert torch.equal(fused.last_rollout.completion_ids, separate.last_rollout.completion_ids)  # the same samples
    for name in ("kl", "rewards", "advantages"):
        torch.testing.assert_close(
            getattr(fused.last_targets, name), getattr(separate.last_targets, name), atol=1e-5, rtol=0
        )
    assert fused.last_targets.advantages.abs().sum() > 0
    for a, b in zip(fused.gradient, separate.gradient):  # summed in another order (shuffled micro-batches)
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_diagnostics_at_two_by_two_measure_the_policy_that_sampled(tiny_run_assets, tokenizer):
    """At 2 epochs x 2 mini-batches the policy moves after the first mini-batch; mismatch/*, the entropy and the
    first-epoch clip fraction must still describe the rollout policy (here: the initial one, in fp32)."""
    from rloo.generation.forward import completion_logprobs_and_entropy
    from rloo.objectives import logprob_mismatch, masked_mean

    logged = []

    class Spy(PolicyGradientModule):
        def log_step(self, rollout, targets, stats, *rest):
            logged.append(stats)
            super().log_step(rollout, targets, stats, *rest)

    _, module = fit(
        tiny_run_assets,
        tokenizer,
        num_rollouts=1,
        module_class=Spy,
        num_ppo_epochs=2,
        num_mini_batches=2,
        micro_batch_size=4,
    )
    stats, rollout = logged[0], module.last_rollout
    initial = AutoModelForCausalLM.from_pretrained(tiny_run_assets / "policy").eval()
    with torch.no_grad():
        logprobs, entropy = completion_logprobs_and_entropy(
            initial, rollout.input_ids, rollout.attention_mask, rollout.completion_ids, rollout.completion_mask, 0.7
        )
    expected = logprob_mismatch(logprobs, rollout.generation_logprobs, rollout.completion_mask)
    assert stats["mismatch_abs_max"] < 1e-4  # fp32: the sampler and the training forward agree (before: 0.2 and more)
    assert stats["mismatch_abs_max"] == pytest.approx(expected["abs_max"].item(), abs=1e-6)
    assert stats["entropy"] == pytest.approx(masked_mean(entropy, rollout.completion_mask).item(), abs=1e-5)
    assert stats["first_epoch_clipfrac"] == 0.0  # old log-probs recomputed: the ratio at the rollout policy is 1
    assert stats["clipfrac"] > 0  # while the later mini-batches, after a step at lr 1e-2, do clip


def test_a_reused_rollout_shuffles_whole_groups_so_every_micro_batch_shares_its_prompts(tiny_run_assets, tokenizer):
    from rloo.generation.forward import shares_prefix

    seen = []

    class Spy(PolicyGradientModule):
        def policy_forward(self, rollout, with_entropy=True):
            seen.append(shares_prefix(self.policy, rollout.prompt_ids, rollout.prompt_mask, self.config.k))
            return super().policy_forward(rollout, with_entropy)

    fit(
        tiny_run_assets,
        tokenizer,
        num_rollouts=2,
        module_class=Spy,
        num_ppo_epochs=2,
        num_mini_batches=2,
        micro_batch_size=4,
    )
    # per rollout: the old log-probs (one chunk of 16), then 2 epochs x 2 mini-batches x 2 micro-batches of 4
    assert len(seen) == 2 * (1 + 8) and all(seen)


@pytest.mark.parametrize("per", ["rollout", "optimizer_step"])
def test_the_schedule_steps_per_rollout_or_per_optimiser_step(tiny_run_assets, tokenizer, per):
    """lr_schedule_per=rollout (TRL's RLOO): a linear decay over the rollouts, the same lr for every optimiser step of
    one rollout; optimizer_step: over the 3 x 2 x 2 optimiser steps."""
    lrs = []

    class Lrs(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            lrs.append(module.lr_schedulers().get_last_lr()[0])

    _, module = fit(
        tiny_run_assets,
        tokenizer,
        num_rollouts=3,
        num_ppo_epochs=2,
        num_mini_batches=2,
        lr_schedule="linear",
        lr_schedule_per=per,
        callbacks=[Lrs()],
    )
    steps = 3 if per == "rollout" else 12
    assert module.lr_schedulers().last_epoch == steps
    assert lrs == pytest.approx([1e-2 * (1 - n / steps) for n in ((1, 2, 3) if per == "rollout" else (4, 8, 12))])
