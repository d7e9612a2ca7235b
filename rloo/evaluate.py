"""python -m rloo.evaluate: judge a saved policy on held-out prompts; writes verdicts.jsonl and summary.json.

python -m rloo.evaluate                                   # the embedded task's SFT policy vs the references
python -m rloo.evaluate policy=outputs/<date>/<time>      # a training run's policy
python -m rloo.evaluate policy=A opponent=B               # head to head
python -m rloo.evaluate model=pythia1b policy=<dir> judge=openai   # the published TL;DR evaluation
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hydra  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from rloo.config.checks import ConfigError, policy_location, validate_eval_config  # noqa: E402
from rloo.run.cli import exit_on_config_error, fail, run_entry_point  # noqa: E402
from rloo.utils.errors import (  # noqa: E402
    CTRL_C_EXIT_CODE,
    SIGTERM_EXIT_CODE,
    EnvironmentFailed,
    JudgeFailed,
    RewardFunctionError,
    WriteError,
)


class StoppedBySigterm(BaseException):
    """Raised in the main thread by rloo.evaluate's SIGTERM handler: the evaluation stops where it is."""


def stop_on_sigterm(signum, frame):
    raise StoppedBySigterm()


def run(cfg: DictConfig) -> dict:
    import lightning as L
    import torch

    from rloo.config.checks import eval_sampling
    from rloo.data.prompts import SplitSpec, load_split, system_prompt_note, tokenize_prompts
    from rloo.evaluation.heldout import complete, evaluate_policy, summarize_eval
    from rloo.judges import build_judge
    from rloo.models.loading import load_policy, load_reward_model, load_tokenizer
    from rloo.rewards.scoring import ENV, Reward, RewardTerm
    from rloo.run.assemble import environment_from_config, precision_arguments, quiet_lightning_logs, resolve_sources
    from rloo.utils import atomic
    from rloo.utils.ownership import own_output_dir

    started = time.time()
    quiet_lightning_logs()
    log = logging.getLogger("rloo").info
    out = own_output_dir(cfg)  # before anything is written into it
    atomic.write_text(out / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True), "the resolved config")
    if cfg.trainer.get("num_threads"):
        torch.set_num_threads(cfg.trainer.num_threads)

    model_src, data_src, _ = resolve_sources(cfg, log)
    policy_src = policy_location(cfg.policy, "policy") if cfg.policy else model_src["policy"]
    opponent_src = policy_location(cfg.opponent, "opponent") if cfg.opponent else None
    own_tokenizer = Path(policy_src, "tokenizer_config.json").exists()
    tokenizer = load_tokenizer(
        policy_src if own_tokenizer else model_src["tokenizer"], model_src["pad_token"], model_src["chat_template"]
    )
    environment = environment_from_config(cfg, tokenizer)  # env=: held-out episodes (its tools in the prompts)
    spec = SplitSpec(**data_src["validation"])
    rows, over, empty = tokenize_prompts(
        load_split(spec, "data.validation"),
        spec,
        tokenizer,
        cfg.data.max_prompt_length,
        cfg.data.truncate_prompts,
        "data.validation",
        cfg.data.get("system_prompt"),
        None if environment is None else environment.tools,
    )
    note, _ = system_prompt_note(rows, tokenizer, cfg.data.get("system_prompt"), f"data.validation ({spec.path})")
    if note is not None:
        log(note)
    rows = rows[: cfg.eval.num_prompts]
    log(
        f"data: {len(rows)} held-out prompts from {spec.path} ({over} over {cfg.data.max_prompt_length} tokens, "
        f"{empty} empty dropped)"
    )
    if not rows:
        raise ConfigError(
            f"data.validation: no prompts left from {spec.path} ({empty} empty; max_prompt_length="
            f"{cfg.data.max_prompt_length})"
        )

    fabric = L.Fabric(
        accelerator=cfg.trainer.accelerator,
        devices=1,
        **precision_arguments(cfg.precision.trainer, cfg.trainer.accelerator, fabric=True),
    )
    L.seed_everything(cfg.seed, verbose=False)
    sampling = eval_sampling(cfg)
    judge = build_judge(cfg.get("judge"), model_src["reward_model"], model_src["tokenizer"])
    if judge is not None:
        judge.setup(fabric.device)
    reward_model = None
    if cfg.score and model_src["reward_model"]:
        reward_model = load_reward_model(model_src["reward_model"], model_src["frozen_dtype"], tokenizer).to(
            fabric.device
        )

    others, opponent_measured = None, {}
    with fabric.autocast():
        if opponent_src is not None:
            opponent = load_policy(opponent_src, tokenizer).to(fabric.device).eval()
            done = complete(opponent, tokenizer, rows, sampling, cfg.eval.batch_size, fabric.device, environment)
            others = done["texts"]
            opponent_measured = {
                "opponent_mean_length": done["length"].mean().item(),
                "opponent_eos_frac": done["eos"].mean().item(),
            }
            del opponent
        policy = load_policy(policy_src, tokenizer).to(fabric.device).eval()
        per_row, samples = evaluate_policy(
            policy,
            tokenizer,
            rows,
            sampling,
            cfg.eval.batch_size,
            judge,
            reward_model,
            fabric.device,
            others,
            reward=None if environment is None else Reward([RewardTerm(1.0, ENV)], "raise"),
            judge_timeout_s=cfg.eval.judge_timeout_s,
            environment=environment,
        )
    atomic.write_text(
        out / "verdicts.jsonl", "".join(json.dumps(row, allow_nan=False) + "\n" for row in samples), "the verdicts"
    )

    measured = {k.split("/", 1)[1]: v for k, v in summarize_eval(per_row).items()}
    summary = {
        "policy": policy_src,
        "opponent": opponent_src or "reference",
        "judge": None
        if judge is None
        else {"name": judge.name, "repr": repr(judge), "seed": getattr(judge, "seed", None)},
        "num_prompts": len(rows),
        "sampling": {
            "greedy": cfg.eval.greedy,
            "max_new_tokens": cfg.eval.max_new_tokens,
            "temperature": cfg.temperature,
        },
        **measured,
        **opponent_measured,
        "seconds": round(time.time() - started, 2),
        "output_dir": str(out),
    }
    for counter in ("requests_sent", "cache_hits"):
        if hasattr(judge, counter):
            summary[f"judge_{counter}"] = getattr(judge, counter)
    atomic.write_text(out / "summary.json", json.dumps(summary, indent=2), "the evaluation summary")
    print_summary(summary, log)
    return summary


def print_summary(summary: dict, log=print) -> None:
    log(f"\nrloo.evaluate: {summary['policy']} vs {summary['opponent']} on {summary['num_prompts']} held-out prompts")
    if "win_rate" in summary:
        log(
            f"  win rate {summary['win_rate']:.3f}  95% CI [{summary['win_rate_ci_low']:.3f}, "
            f"{summary['win_rate_ci_high']:.3f}]"
            f"  (wins {summary['wins']}, ties {summary['ties']}, losses {summary['losses']}, "
            f"invalid {summary['invalid']};"
            f" judge {summary['judge']['name']})"
        )
    if "score" in summary:
        log(f"  reward-model score {summary['score']:.3f}")
    if "reward/env" in summary:  # env=: the episodes' mean return, turns and the fraction cut short
        log(f"  return {summary['reward/env']:.3f}, {summary['turns']:.2f} turns, truncated {summary['truncated']:.3f}")
    log(f"  mean length {summary['mean_length']:.2f} tokens, EOS {summary['eos_frac']:.3f}")
    log(f"  outputs: {summary['output_dir']}  (verdicts.jsonl, summary.json)")


@hydra.main(version_base="1.3", config_path="../conf", config_name="evaluate")
def hydra_main(cfg: DictConfig) -> float | None:
    """One evaluation. verdicts.jsonl and summary.json are written whole at its end, so an evaluation stopped by
    SIGTERM (exit 143) or Ctrl-C (exit 130) leaves neither, nor a torn file; an API judge's cache keeps the verdicts
    it got, so the next run asks only for the rest."""
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        validate_eval_config(cfg)
        summary = run(cfg)
    except ConfigError as error:
        return exit_on_config_error(error)
    except (WriteError, JudgeFailed, EnvironmentFailed, RewardFunctionError) as error:
        return fail(error, 1)
    except (StoppedBySigterm, KeyboardInterrupt) as error:
        sigterm = isinstance(error, StoppedBySigterm)
        print(
            f"rloo.evaluate: stopped by {'SIGTERM' if sigterm else 'Ctrl-C'}; no verdicts.jsonl or summary.json "
            f"written in {cfg.paths.output_dir}",
            file=sys.stderr,
        )
        sys.exit(SIGTERM_EXIT_CODE if sigterm else CTRL_C_EXIT_CODE)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return summary.get("win_rate")


if __name__ == "__main__":
    run_entry_point(hydra_main, "evaluate")
