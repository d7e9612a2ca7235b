"""One benchmark configuration of `rloo` in its own process: W warm-up + N timed training steps, then JSON.

    python -m rloo.bench.worker --algorithm rloo --preset small --steps 5 --warmup 2 --out result.json

The step is the real one: PolicyGradientModule / PPOModule in a Lightning Trainer, on the preset's random-weight models.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import lightning as L  # noqa: E402
import torch  # noqa: E402

import rloo.algorithms.policy_gradient  # noqa: E402,F401
import rloo.algorithms.ppo  # noqa: E402,F401  (imported before the baseline is read: imports are not the step's memory)
from rloo.bench.measure import (  # noqa: E402
    SUM_BYTES,
    current_rss_mb,
    median,
    model_state_mb,
    peak_rss_mb,
    sum_read_rate,
)
from rloo.bench.presets import GRPO_FAMILY, build_models, build_tokenizer, get_preset, random_prompts  # noqa: E402

PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed")
# compared with GRPOTrainer's settings (rloo.bench.peers.grpo_settings) before a ratio is reported
COMPARED_SETTINGS = ("loss_aggregation", "advantage", "kl_coef", "clip_range", "clip_range_high", "ratio_level")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rloo.bench.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=("rloo", "ppo", *GRPO_FAMILY), required=True)
    parser.add_argument("--preset", required=True)
    parser.add_argument("--steps", type=int, default=5, help="timed steps after the warm-up")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--ppo-epochs", type=int, default=4, help="PPO passes over each rollout")
    parser.add_argument("--precision", choices=PRECISIONS, default="32-true")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a train.yaml key of the algorithm (e.g. old_logprobs=generation, num_ppo_epochs=2), "
        "or fp32_lm_head=true|false; repeatable",
    )
    parser.add_argument("--out", required=True, help="where the JSON result goes")
    return parser.parse_args(argv)


class StepClock:
    """Wall time of every Lightning step (one rollout + its updates), the module's phase split and its metrics."""

    def __init__(self):
        self.steps: list[dict[str, float]] = []
        self.metrics: list[dict[str, float]] = []
        self._started = 0.0

    def callback(self):
        from lightning import Callback

        clock = self

        class _Clock(Callback):
            def on_train_batch_start(self, trainer, module, batch, batch_idx):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                clock._started = time.perf_counter()

            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                tokens = float(module.last_rollout.completion_mask.sum())
                clock.steps.append(dict(module.last_timings, wall=time.perf_counter() - clock._started, tokens=tokens))
                clock.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1})

        return _Clock()


def build_module(args, preset, tokenizer, policy, reward_model):
    """The module of `args.algorithm` with conf/train.yaml's settings, the preset's shape and `--set` on top."""
    from rloo.config.checks import ConfigError, validate_train_config
    from rloo.models.loading import DTYPES, freeze
    from rloo.run.assemble import build_module as build
    from rloo.run.assemble import policy_and_reference
    from rloo.run.cli import compose_train_config

    completions, steps = preset.completions_per_step, args.steps + args.warmup
    shape = {
        "kl_coef": preset.kl_coef,
        "response_length": preset.response_length,
        "temperature": 0.7,
        "rollout_batch_size": completions,
        "micro_batch_size": completions,
        "generation_batch_size": completions,
        "total_episodes": completions * steps,
        "lr": 1e-6,
        "warmup_ratio": 0.0,
        "lr_schedule": "constant",
        "k": preset.k,
    }
    if args.algorithm == "ppo":
        shape |= {"k": 1, "num_ppo_epochs": args.ppo_epochs}
    if args.algorithm in GRPO_FAMILY:  # the algorithm's own KL coefficient; no resampling (GRPOTrainer has none)
        del shape["kl_coef"]
        shape |= {"dynamic_sampling": False} if args.algorithm == "dapo" else {}
    overrides = [f"algo={args.algorithm}", "judge=none", "logger=none"]
    overrides += [f"{key}={value}" for key, value in shape.items()] + list(args.settings)
    try:
        cfg = compose_train_config(overrides)
        validate_train_config(cfg)
    except ConfigError as error:
        raise SystemExit(f"error: {error}") from None
    except Exception as error:  # Hydra's own: an unknown key
        raise SystemExit(f"error: --set: {str(error).splitlines()[0]}") from None
    policy, reference = policy_and_reference(cfg, policy, None)  # as rloo.train builds them
    freeze(reward_model.to(DTYPES[cfg.model.frozen_dtype]))  # stored as rloo.train loads it (load_reward_model)
    # PPO's value model: initialised from the reward model and trained in float32, as rloo.train's load_value_model
    value_model = lambda: copy.deepcopy(reward_model).float().requires_grad_(True)  # noqa: E731
    module = build(cfg, policy, reference, reward_model, tokenizer, steps, value_model)
    return module, module.config


def run(args) -> dict:
    from rloo.run.assemble import quiet_lightning_logs

    quiet_lightning_logs()  # as rloo.train: Lightning's notices and the third-party warnings our calls cause, not shown
    if args.threads:
        torch.set_num_threads(args.threads)
    baseline_rss = current_rss_mb()  # after the imports, before any model: the framework's own cost, not the step's
    preset = get_preset(args.preset)
    tokenizer = build_tokenizer(preset.vocab_size)
    policy, reward_model = build_models(preset, args.seed)
    module, config = build_module(args, preset, tokenizer, policy, reward_model)
    k = config.k
    prompts_per_step = preset.completions_per_step // k
    num_steps = args.steps + args.warmup
    prompts = random_prompts(preset, prompts_per_step * num_steps, args.seed)
    batches = [
        {"prompt_ids": chunk, "prompt_mask": torch.ones_like(chunk)} for chunk in prompts.split(prompts_per_step)
    ]
    clock = StepClock()
    from rloo.run.assemble import precision_arguments

    accelerator = "gpu" if args.device == "cuda" else "cpu"
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=1,
        **precision_arguments(args.precision, accelerator),
        max_steps=num_steps * config.updates_per_rollout,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[clock.callback()],
        num_sanity_val_steps=0,
    )
    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))

    if trainer.global_step != num_steps * config.updates_per_rollout or len(clock.steps) != num_steps:
        raise SystemExit(
            f"error: ran {len(clock.steps)} rollouts and {trainer.global_step} optimiser steps, expected "
            f"{num_steps} and {num_steps * config.updates_per_rollout}"
        )
    timed = clock.steps[args.warmup :]
    phases = sorted({key for step in timed for key in step} - {"wall", "tokens", "step"})
    models = [
        m
        for m in (module.policy, module.reference, module.reward_model, getattr(module, "value_model", None))
        if m is not None
    ]
    peak_rss = peak_rss_mb()  # before torch.sum's buffer
    step_median = median([s["wall"] for s in timed])
    bf16 = config.sampling.rollout_precision == "bf16"  # the decode reads bfloat16 copies: 2 bytes a weight
    read_rate = read_rates(args, preset, module.policy, median([s["generate"] for s in timed]), bf16)
    result = {
        "implementation": "rloo",
        "algorithm": args.algorithm,
        "preset": preset.name,
        "settings": preset.as_dict()
        | {
            "num_ppo_epochs": config.num_ppo_epochs,
            "num_mini_batches": config.num_mini_batches,
            "completions_per_prompt": k,
            "prompts_per_step": prompts_per_step,
            "precision": args.precision,
            "overrides": args.settings,
        },
        "algorithm_settings": algorithm_settings(config) if args.algorithm in GRPO_FAMILY else None,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "steps": len(timed),
        "warmup": args.warmup,
        "optimizer_steps": trainer.global_step,
        "rollouts": len(clock.steps),
        "step_seconds": [s["wall"] for s in timed],
        "step_seconds_median": step_median,
        "rollout_seconds_median": median([s["rollout"] for s in timed]),
        "update_seconds_median": median([s["update"] for s in timed]),
        "phase_seconds_median": {phase: median([s.get(phase, 0.0) for s in timed]) for phase in phases},
        "tokens_per_step": median([s["tokens"] for s in timed]),
        "tokens_per_second": median([s["tokens"] / s["wall"] for s in timed]),
        **read_rate,
        "baseline_rss_mb": baseline_rss,
        "peak_rss_mb": peak_rss,
        "peak_rss_above_baseline_mb": peak_rss - baseline_rss,
        "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None,
        "model_state_mb": model_state_mb(models, module.optimizers().optimizer),
        "metrics_mean": {
            key: sum(m[key] for m in clock.metrics[args.warmup :]) / len(timed)
            for key in clock.metrics[-1]
            if all(key in m for m in clock.metrics[args.warmup :])
        },
        "python": platform.python_version(),
        "versions": {"torch": torch.__version__, "lightning": L.__version__, "transformers": _version("transformers")},
    }
    return result


def read_rates(args, preset, policy, generate_seconds: float, bf16_weights: bool) -> dict[str, float]:
    """`torch.sum`'s read rate in this process, after the steps, and the rollout's decode against it: the bytes the
    decode's steps read (rloo.bench.decode.step_bytes, every row to its last token) over the generate phase's time,
    which also holds the prefill and the draws, so the fraction is a lower bound on the decode's own."""
    from rloo.bench.decode import step_bytes

    sum_rate = sum_read_rate(SUM_BYTES, torch.device(args.device), torch.float32)
    rows, steps = preset.completions_per_step, preset.response_length - 1
    shape = (rows // preset.k, rows, preset.prompt_length, preset.response_length)
    decode_bytes = step_bytes(policy, *shape, bf16_weights)["total"]
    generate_rate = decode_bytes * steps / generate_seconds
    return {
        "sum_gb_per_s": sum_rate / 1e9,
        "generate_read_gb_per_s": generate_rate / 1e9,
        "generate_read_fraction": generate_rate / sum_rate,
    }


def algorithm_settings(config) -> dict:
    """The estimator's settings that GRPOTrainer's loss types fix, as the run resolved them (an upper clip of None
    is the symmetric clip)."""
    values = {name: getattr(config, name) for name in COMPARED_SETTINGS}
    values["clip_range_high"] = (
        values["clip_range_high"] if values["clip_range_high"] is not None else config.clip_range
    )
    return {
        name: float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for name, v in values.items()
    }


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def main(argv=None) -> None:
    args = parse_args(argv)
    result = run(args)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
