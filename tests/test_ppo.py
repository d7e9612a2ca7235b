"""algo=ppo: PPOModule in a real Lightning Trainer, and `python -m rloo.train algo=ppo` end to end."""

import copy
import csv
import json

import lightning as L
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rloo.algorithms.ppo import PPOModule
from rloo.data.prompts import PromptDataModule
from rloo.models.loading import freeze, load_value_model
from tests.builders import toy_split, train_config
from tests.e2e import train


def snapshot(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def fit_ppo(assets, tokenizer, num_rollouts=2, module_class=PPOModule, **overrides):
    values = dict(
        k=1,
        rollout_batch_size=8,
        micro_batch_size=4,
        generation_batch_size=8,
        response_length=6,
        lr=1e-2,
        warmup_ratio=0.0,
        num_ppo_epochs=2,
        num_mini_batches=2,
        total_episodes=8 * num_rollouts,
    )
    config = train_config("ppo", num_rollouts, **{**values, **overrides})
    policy = AutoModelForCausalLM.from_pretrained(assets / "policy")
    reference = freeze(copy.deepcopy(policy))
    reward_model = freeze(AutoModelForSequenceClassification.from_pretrained(assets / "reward_model", num_labels=1))
    value_model = load_value_model(str(assets / "reward_model"), tokenizer)
    module = module_class(policy, reference, reward_model, value_model, tokenizer, config)
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
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer, module


def test_ppo_trains_policy_and_value_model_and_leaves_the_frozen_ones(tiny_run_assets, tokenizer):
    reward_before = snapshot(
        AutoModelForSequenceClassification.from_pretrained(tiny_run_assets / "reward_model", num_labels=1)
    )
    policy_before = snapshot(AutoModelForCausalLM.from_pretrained(tiny_run_assets / "policy"))
    trainer, module = fit_ppo(tiny_run_assets, tokenizer, num_rollouts=2)
    assert module.state.rollouts == 2 and module.state.episodes == 16  # k=1
    assert trainer.global_step == module.lr_schedulers().last_epoch == 2 * 2 * 2  # rollouts x epochs x mini-batches
    # the value model starts as the reward model and then learns; the reward model itself never changes
    assert all(torch.equal(v, reward_before[k]) for k, v in snapshot(module.reward_model).items())
    assert any(not torch.equal(v, reward_before[k]) for k, v in snapshot(module.value_model).items())
    assert any(not torch.equal(v, policy_before[k]) for k, v in snapshot(module.policy).items())
    assert all(torch.equal(v, policy_before[k]) for k, v in snapshot(module.reference).items())
    rollout, targets = module.last_rollout, module.last_targets
    assert targets.advantages.shape == rollout.completion_ids.shape == targets.returns.shape
    real = rollout.completion_mask.bool()
    assert (targets.advantages[~real] == 0).all() and (targets.values[~real] == 0).all()
    # whitened over real tokens: mean 0, std 1
    assert abs(targets.advantages[real].mean().item()) < 1e-5
    assert abs(targets.advantages[real].std().item() - 1) < 1e-3


def test_ppo_first_mini_batch_has_ratio_one_and_metrics_are_real(tiny_run_assets, tokenizer):
    per_micro, logged = [], []

    class Spy(PPOModule):
        def micro_batch_loss(self, *args):
            loss, stats = super().micro_batch_loss(*args)
            per_micro.append({key: value.item() for key, value in stats.items()})
            return loss, stats

        def log_step(self, rollout, scores, targets, stats):
            logged.append(stats)
            super().log_step(rollout, scores, targets, stats)

    # rollout 8 rows, 2 mini-batches of 4, micro-batches of 2: the first two come before any optimiser step
    fit_ppo(tiny_run_assets, tokenizer, num_rollouts=1, module_class=Spy, micro_batch_size=2)
    for stats in per_micro[:2]:
        assert abs(stats["ratio_min"] - 1) < 1e-5 and abs(stats["ratio_max"] - 1) < 1e-5
        assert stats["value_clipfrac"] == 0.0  # V == V_old: nothing to clip yet
    assert any(s["value_clipfrac"] > 0 or abs(s["ratio_max"] - 1) > 1e-5 for s in per_micro[2:])
    assert logged[0]["value_loss"] > 0
    mean_value_loss = sum(s["value_loss"] for s in per_micro) / len(per_micro)  # equal-size micro-batches
    assert abs(logged[0]["value_loss"] - mean_value_loss) < 1e-6


@pytest.mark.slow
def test_train_algo_ppo_end_to_end(finished_run):
    base, _ = finished_run
    run = base / "ppo"
    result = train(run, base / "cache", "algo=ppo", "k=1", "eval_every=0", "checkpoint_every=0", "num_ppo_epochs=2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["rollouts"] == 3 and summary["optimizer_steps"] == 3 * 2 and summary["episodes"] == 24
    rows = list(csv.DictReader((run / "csv" / "metrics.csv").open()))
    logged = {key for row in rows for key, value in row.items() if value not in ("", None)}
    ppo_metrics = {
        "loss/value_avg",
        "val/clipfrac_avg",
        "value/mse",
        "value/explained_variance",
        "time/values",
        "policy/clipfrac_avg",
        "objective/kl",
        "objective/scores",
        "time/generate",
        "time/old_logprobs",
    }
    assert ppo_metrics <= logged, ppo_metrics - logged
    value_losses = [float(r["loss/value_avg"]) for r in rows if r.get("loss/value_avg")]
    assert len(value_losses) == 3 and all(v > 0 for v in value_losses)
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)
    prefixes = {key.split(".")[0] for key in ckpt["state_dict"]}
    assert prefixes == {"policy", "value_model"}
    config = (run / "config.yaml").read_text()
    assert "algorithm: ppo" in config and "vf_coef: 0.1" in config
