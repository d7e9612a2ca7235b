"""RLOOModule inside a real Lightning Trainer: frozen models stay frozen, step accounting is exact."""

import copy

import lightning as L
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rloo.algorithms.rloo import RLOOConfig, RLOOModule
from rloo.data import PromptDataModule, SplitSpec
from rloo.models import freeze


def fit(assets, tokenizer, num_rollouts=3, module_class=RLOOModule, **overrides):
    values = dict(k=4, rollout_batch_size=16, micro_batch_size=8, generation_batch_size=16, response_length=6,
                  lr=1e-2, warmup_ratio=0.0, total_steps=num_rollouts)
    config = RLOOConfig(**{**values, **overrides})
    policy = AutoModelForCausalLM.from_pretrained(assets / "policy")
    reference = freeze(copy.deepcopy(policy))
    reward_model = freeze(AutoModelForSequenceClassification.from_pretrained(assets / "reward_model", num_labels=1))
    module = module_class(policy, reference, reward_model, tokenizer, config)
    spec = SplitSpec(path=str(assets / "train.jsonl"), reference_column="reference")
    datamodule = PromptDataModule(tokenizer, spec, spec, 64, False, config.rollout_batch_size // config.k, num_rollouts,
                                  log=lambda *_: None)
    trainer = L.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, datamodule=datamodule)
    return trainer, module


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("epochs, minis", [(1, 1), (2, 2)])
def test_one_lightning_step_per_rollout_and_frozen_models_unchanged(tiny_run_assets, tokenizer, epochs, minis):
    policy_before = snapshot(AutoModelForCausalLM.from_pretrained(tiny_run_assets / "policy"))
    trainer, module = fit(tiny_run_assets, tokenizer, num_rollouts=3, num_ppo_epochs=epochs, num_mini_batches=minis)
    assert trainer.global_step == 3  # rollouts, not optimiser steps
    assert module.episodes == 3 * 16  # completions
    assert module.lr_schedulers().last_epoch == 3 * epochs * minis  # every optimiser step was taken
    for name, value in snapshot(module.reference).items():
        assert torch.equal(value, policy_before[name]), name  # the reference is the untouched initial policy
    for model in (module.reference, module.reward_model):
        assert all(p.grad is None and not p.requires_grad for p in model.parameters())
    changed = [not torch.equal(v, policy_before[k]) for k, v in snapshot(module.policy).items()]
    assert any(changed)


def test_reward_model_weights_do_not_change(tiny_run_assets, tokenizer):
    before = snapshot(AutoModelForSequenceClassification.from_pretrained(tiny_run_assets / "reward_model", num_labels=1))
    _, module = fit(tiny_run_assets, tokenizer, num_rollouts=2)
    after = snapshot(module.reward_model)
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_on_policy_ratio_is_exactly_one_and_nothing_is_clipped(tiny_run_assets, tokenizer):
    """One update per rollout: the sequence ratio is 1 by construction, so PPO-clip is plain REINFORCE."""
    seen = []

    class Spy(RLOOModule):
        def _log_step(self, rollout, kl, stats, *args):
            seen.append(stats)
            super()._log_step(rollout, kl, stats, *args)

    fit(tiny_run_assets, tokenizer, num_rollouts=2, module_class=Spy)
    for stats in seen:
        assert stats["ratio"] == 1.0 and stats["ratio_min"] == 1.0 and stats["ratio_max"] == 1.0
        assert stats["clipfrac"] == 0.0


def test_reused_rollout_first_update_has_ratio_one_in_fp32(tiny_run_assets, tokenizer):
    """With old log-probs recomputed by the training forward, the first mini-batch sees ratio 1 to 1e-5."""
    ratios = []

    class Spy(RLOOModule):
        def _micro_batch_loss(self, rollout, index, kl, first_epoch):
            loss, stats = super()._micro_batch_loss(rollout, index, kl, first_epoch)
            ratios.append((stats["ratio_min"], stats["ratio_max"]))
            return loss, stats

    fit(tiny_run_assets, tokenizer, num_rollouts=1, module_class=Spy, num_ppo_epochs=2, num_mini_batches=2,
        micro_batch_size=4)
    # the two micro-batches of the first mini-batch come before any optimiser step
    for low, high in ratios[:2]:
        assert abs(low - 1) < 1e-5 and abs(high - 1) < 1e-5
    assert any(abs(high - 1) > 1e-5 or abs(low - 1) > 1e-5 for low, high in ratios[2:])  # later ones moved


def test_logged_ratio_extremes_are_the_extremes_over_micro_batches(tiny_run_assets, tokenizer):
    per_micro, logged = [], []

    class Spy(RLOOModule):
        def _micro_batch_loss(self, rollout, index, kl, first_epoch):
            loss, stats = super()._micro_batch_loss(rollout, index, kl, first_epoch)
            per_micro.append(stats)
            return loss, stats

        def _log_step(self, rollout, kl, stats, *args):
            logged.append(stats)
            super()._log_step(rollout, kl, stats, *args)

    fit(tiny_run_assets, tokenizer, num_rollouts=1, module_class=Spy, num_ppo_epochs=2, num_mini_batches=2,
        micro_batch_size=4)
    assert logged[0]["ratio_min"] == min(s["ratio_min"] for s in per_micro)
    assert logged[0]["ratio_max"] == max(s["ratio_max"] for s in per_micro)
    assert logged[0]["ratio_min"] < logged[0]["ratio_max"]
