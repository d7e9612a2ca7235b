"""python -m rloo.sft: SFT the embedded task's policy into <run dir>/policy and print its report."""

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf
from transformers import GPTNeoXForCausalLM

from rloo.run.cli import run_entry_point
from rloo.toy.bootstrap import build_tokenizer, format_report, measure, task_splits, train_sft_policy
from rloo.utils.ownership import own_output_dir


@hydra.main(config_path="../conf", config_name="sft", version_base="1.3")
def main(cfg: DictConfig) -> None:
    own_output_dir(cfg)
    bootstrap = OmegaConf.to_container(cfg.bootstrap, resolve=True)
    splits, tokenizer = task_splits(bootstrap), build_tokenizer(bootstrap)
    out_dir = Path(cfg.paths.output_dir) / "policy"
    report = train_sft_policy(bootstrap, tokenizer, splits["train"], out_dir)
    report |= measure(bootstrap, GPTNeoXForCausalLM.from_pretrained(out_dir), None, tokenizer, splits["validation"])
    print(f"SFT policy saved to {out_dir}")
    print(format_report(report))


if __name__ == "__main__":
    run_entry_point(main, "sft")
