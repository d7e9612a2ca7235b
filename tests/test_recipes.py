"""The TL;DR recipes: each TRL release's published one key by key, and rloo's own as exactly three changes on top."""

import pytest
from omegaconf import OmegaConf

from rloo.config.checks import validate_train_config
from rloo.run.cli import expand_overrides, recipe_of
from tests.test_config import composed

# What every TRL release's docs (docs/source/rloo_trainer.md, v0.9.3 to v0.12.2) publish for RLOO on TL;DR, in TRL's
# own terms (the project's ../shared/ANCHORS.md, section 3), and where the releases differ.
ALL_RELEASES = {
    "rloo_k": 2,
    "learning_rate": 3e-6,
    "kl_coef": 0.03,
    "num_ppo_epochs": 2,
    "num_mini_batches": 2,
    "response_length": 53,
    "temperature": 0.7,
    "stop_token": "eos",
    "total_episodes": 1_000_000,
    "lr_scheduler": "linear, stepped once per rollout",
    "gradient clipping in RLOO's loop": None,
    "old log-probs": "from generation",
    "num GPUs": 8,
    "bf16": True,
}
PUBLISHED = {
    "tldr_pythia1b_trl09": ALL_RELEASES
    | {
        "per_device_train_batch_size": 16,
        "gradient_accumulation_steps": 16,
        "local_rollout_forward_batch_size": 16,
        "missing EOS": ("replace", -1.0),  # --non_eos_penalty, penalty_reward_value -1
        "deepspeed": "zero2",
        "model": "pythia1b",
    },
    "tldr_pythia1b_trl011": ALL_RELEASES
    | {
        "per_device_train_batch_size": 8,
        "gradient_accumulation_steps": 8,
        "local_rollout_forward_batch_size": 16,
        "missing EOS": ("subtract", 1.0),  # --missing_eos_penalty 1.0
        "deepspeed": "zero2",
        "model": "pythia1b",
    },
    "tldr_pythia6.9b_trl09": ALL_RELEASES
    | {
        "per_device_train_batch_size": 1,
        "gradient_accumulation_steps": 256,
        "local_rollout_forward_batch_size": 2,
        "missing EOS": ("replace", -1.0),
        "deepspeed": "zero3",
        "model": "pythia6.9b",
    },
}


def as_rloo_keys(published: dict) -> dict:
    """TRL's arguments as rloo's keys. TRL's RLOOTrainer: a rollout is per_device_train_batch_size x
    gradient_accumulation_steps x num_mini_batches completions on each device (local_batch_size)."""
    rule, value = published["missing EOS"]
    return {
        "k": published["rloo_k"],
        "lr": published["learning_rate"],
        "kl_coef": published["kl_coef"],
        "kl_estimator": "k1",
        "num_ppo_epochs": published["num_ppo_epochs"],
        "num_mini_batches": published["num_mini_batches"],
        "response_length": published["response_length"],
        "temperature": published["temperature"],
        "stop_token": published["stop_token"],
        "total_episodes": published["total_episodes"],
        "rollout_batch_size": published["per_device_train_batch_size"]
        * published["gradient_accumulation_steps"]
        * published["num_mini_batches"],
        "micro_batch_size": published["per_device_train_batch_size"],
        "generation_batch_size": published["local_rollout_forward_batch_size"],
        "missing_eos_penalty": value if rule == "subtract" else None,
        "missing_eos_score": value if rule == "replace" else None,
        "lr_schedule": "linear",
        "lr_schedule_per": "rollout",
        "warmup_ratio": 0.0,
        "max_grad_norm": published["gradient clipping in RLOO's loop"],
        "old_logprobs": "generation",
        "fp32_lm_head": False,
        "loss": "ppo_clip",
        "sequence_ratio": "sum",
        "clip_range": 0.2,
        "normalize_advantages": False,
        "trainer.devices": published["num GPUs"],
        "trainer.strategy": {"zero2": "deepspeed_stage_2", "zero3": "deepspeed_stage_3"}[published["deepspeed"]],
        "precision.trainer": "bf16-mixed" if published["bf16"] else "32-true",
        "model.name": published["model"],
        "data.name": "tldr",
    }


def keys_of(experiment: str, names, monkeypatch) -> dict:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # the recipes' judge=openai checks for one, sends nothing
    cfg = composed(f"experiment={experiment}")
    validate_train_config(cfg, world_size=8)
    return {name: OmegaConf.select(cfg, name) for name in names}


@pytest.mark.parametrize("experiment", sorted(PUBLISHED))
def test_each_trl_recipe_is_its_release_key_by_key(experiment, monkeypatch):
    expected = as_rloo_keys(PUBLISHED[experiment])
    assert keys_of(experiment, expected, monkeypatch) == expected


RLOO_CHANGES = {"old_logprobs": "recompute", "fp32_lm_head": True, "max_grad_norm": 1.0}


@pytest.mark.parametrize(
    "ours, published", [("tldr_pythia1b", "tldr_pythia1b_trl011"), ("tldr_pythia6.9b", "tldr_pythia6.9b_trl09")]
)
def test_rloos_recipe_is_the_published_one_with_three_documented_changes(ours, published):
    theirs = OmegaConf.to_container(composed(f"experiment={published}"), resolve=False)
    mine = OmegaConf.to_container(composed(f"experiment={ours}"), resolve=False)
    changed = {key: mine[key] for key in mine if mine[key] != theirs.get(key)}
    assert changed == RLOO_CHANGES


@pytest.mark.parametrize("model, recipe", [("pythia1b", "tldr_pythia1b"), ("pythia6.9b", "tldr_pythia6.9b")])
def test_model_alone_runs_rloos_recipe_for_it(model, recipe):
    assert recipe_of(model) == recipe
    assert expand_overrides([f"model={model}", "precision=bf16"]) == [
        f"model={model}",
        f"experiment={recipe}",
        "precision=bf16",
    ]
    assert recipe_of("tiny") is None
