"""python -m rloo.reward: train the embedded task's reward model into <run dir>/reward_model and print its report."""

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from transformers import GPTNeoXForCausalLM, GPTNeoXForSequenceClassification

from rloo.config.checks import ConfigError
from rloo.run.cli import exit_on_config_error, run_entry_point
from rloo.toy.bootstrap import (
    build_tokenizer,
    format_report,
    measure,
    reward_pairs,
    task_splits,
    train_reward_model,
    train_sft_policy,
)
from rloo.utils.ownership import own_output_dir


@hydra.main(config_path="../conf", config_name="reward", version_base="1.3")
def main(cfg: DictConfig) -> None:
    if cfg.policy is not None and not Path(cfg.policy).is_dir():
        return exit_on_config_error(
            ConfigError(f"policy={cfg.policy!r} is not a directory: give a save_pretrained SFT policy dir or null")
        )
    run_dir = own_output_dir(cfg)
    bootstrap = OmegaConf.to_container(cfg.bootstrap, resolve=True)
    splits, tokenizer = task_splits(bootstrap), build_tokenizer(bootstrap)
    report: dict = {}
    policy_dir = cfg.policy
    if policy_dir is None:
        policy_dir = run_dir / "policy"
        report |= train_sft_policy(bootstrap, tokenizer, splits["train"], policy_dir)
        print(f"SFT policy saved to {policy_dir}")
    out_dir = run_dir / "reward_model"
    report |= train_reward_model(bootstrap, tokenizer, reward_pairs(bootstrap), out_dir, policy_dir=policy_dir)
    report |= measure(
        bootstrap,
        GPTNeoXForCausalLM.from_pretrained(policy_dir),
        GPTNeoXForSequenceClassification.from_pretrained(out_dir),
        tokenizer,
        splits["validation"],
    )
    print(f"reward model saved to {out_dir}")
    print(format_report(report))


if __name__ == "__main__":
    run_entry_point(main, "reward")
