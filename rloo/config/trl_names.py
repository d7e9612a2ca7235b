"""TRL's config names (GRPOConfig, RLOOConfig, and the transformers TrainingArguments under them) and the rloo key or
argument that does their job: docs/extending.md tabulates them, and a TRL name handed to rloo (rloo.fit, or the
command line) is refused in one line naming rloo's."""

from __future__ import annotations

TRL_NAMES: dict[str, str] = {
    # sampling
    "num_generations": "k (completions per prompt)",
    "rloo_k": "k (completions per prompt)",
    "max_completion_length": "response_length",
    "max_prompt_length": "data.max_prompt_length",
    "local_rollout_forward_batch_size": "generation_batch_size",
    # the objective
    "beta": "kl_coef",
    "epsilon": "clip_range",
    "cliprange": "clip_range",
    "epsilon_high": "clip_range_high",
    "loss_type": "algo= (grpo, dr_grpo, dapo; loss_aggregation sets the sum alone)",
    "scale_rewards": "advantage (group_std: scaled per group, group_mean: not scaled)",
    "importance_sampling_level": "algo=gspo (sequence-level ratios)",
    "num_iterations": "num_ppo_epochs (passes over each rollout)",
    "steps_per_generation": "num_mini_batches (optimiser steps per pass over a rollout)",
    # optimisation
    "learning_rate": "lr",
    "per_device_train_batch_size": "micro_batch_size (completions per forward and backward)",
    "gradient_accumulation_steps": "rollout_batch_size (completions per rollout = micro_batch_size x accumulation)",
    "num_train_epochs": "total_episodes (completions to train on)",
    "max_steps": "total_episodes (completions to train on = rollouts x rollout_batch_size)",
    "lr_scheduler_type": "lr_schedule",
    "bf16": "precision=bf16",
    "fp16": "precision=fp16",
    # logging, saving, evaluation
    "logging_steps": "log_every (rollouts)",
    "save_steps": "checkpoint_every (rollouts)",
    "save_total_limit": "keep_checkpoints",
    "eval_steps": "eval_every (rollouts)",
    "report_to": "logger= (wandb, csv, none)",
    "output_dir": "rloo.fit(output_dir=...) or hydra.run.dir=",
    "resume_from_checkpoint": "resume= (a run dir, a .ckpt file or auto)",
    "reward_weights": "rloo.fit(reward_weights=...) or reward='1.0*model + 0.5*module:function'",
}

SAME_NAMES = (  # TRL's names that are rloo's keys too, doing the same job
    "temperature",
    "top_k",
    "top_p",
    "seed",
    "warmup_ratio",
    "weight_decay",
    "max_grad_norm",
    "missing_eos_penalty",
    "generation_batch_size",
)


def trl_name_error(name: str) -> str | None:
    """The one line refusing `name` where it is TRL's name for something rloo calls otherwise; None otherwise."""
    top = name.lstrip("+~").split(".")[0]
    if top in TRL_NAMES and "." not in name.lstrip("+~"):
        return f"{top} is TRL's name (GRPOConfig / RLOOConfig): rloo's is {TRL_NAMES[top]} (docs/extending.md)"
    return None


def markdown_table() -> str:
    """The table docs/extending.md shows (a test checks that it is there, row for row)."""
    lines = ["| TRL (GRPOConfig / RLOOConfig / TrainingArguments) | rloo |", "|---|---|"]
    lines += [f"| `{name}` | {rloo} |" for name, rloo in TRL_NAMES.items()]
    same = ", ".join(f"`{name}`" for name in SAME_NAMES)
    return "\n".join(lines) + f"\n\nThe same name in both: {same}.\n"
