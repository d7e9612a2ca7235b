"""TRL's trainers at our benchmark settings, one configuration per process: W warm-up + N timed steps, then JSON.

    PYTHONPATH=. <venv with TRL 1.16>/bin/python -m rloo.bench.peers --algorithm rloo --preset small --out r.json
    PYTHONPATH=. <venv with TRL 1.12>/bin/python -m rloo.bench.peers --algorithm ppo --preset small \
        --ppo-epochs 4 --out p.json

`rloo` runs TRL's RLOOTrainer (1.16); `ppo` runs `trl.experimental.ppo.PPOTrainer` (1.12, the last release with it),
so the two need two interpreters. The models, prompts and batch are the ones our worker uses (rloo.bench.presets).
Only presets.py and measure.py are imported from this project: TRL's interpreter need not have lightning or hydra,
and `import rloo.bench.peers` works without TRL (the orchestrator only calls `trl_version`).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import subprocess
import tempfile

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # PPOTrainer lives in trl.experimental in 1.12
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402

from rloo.bench.measure import (  # noqa: E402
    SUM_BYTES,
    current_rss_mb,
    median,
    model_state_mb,
    peak_rss_mb,
    sum_read_rate,
)
from rloo.bench.presets import GRPO_FAMILY, build_models, build_tokenizer, get_preset, random_prompts  # noqa: E402
from rloo.generation.rollout import clock  # noqa: E402  (waits for queued CUDA work before reading the clock)

TEMPERATURE, LEARNING_RATE, MISSING_EOS_PENALTY = 0.7, 1e-6, 1.0


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rloo.bench.peers", description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", choices=("rloo", "ppo", *GRPO_FAMILY), required=True)
    parser.add_argument("--preset", required=True)
    parser.add_argument("--steps", type=int, default=5, help="timed steps after the warm-up")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument("--ppo-epochs", type=int, default=4, help="PPO passes over each rollout (TRL's default: 4)")
    parser.add_argument(
        "--rloo-schedule",
        default="1x1",
        help="RLOO: EPOCHSxMINI_BATCHES per rollout, as TRL's "
        "num_iterations x steps_per_generation (the published recipe: 2x2)",
    )
    parser.add_argument(
        "--lm-head",
        choices=("compact", "as-shipped"),
        default="compact",
        help="RLOO: compact scores only the completion positions, as TRL does where Triton runs; "
        "as-shipped keeps TRL's CPU fallback, which scores every position, prompts included",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--precision",
        choices=("32-true", "bf16-true"),
        default="32-true",
        help="the models' dtype (bf16-true: bfloat16 weights, as rloo's worker; TRL's autocast flags stay off)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="where the JSON result goes")
    return parser.parse_args(argv)


def trl_version(python_exe: str) -> str | None:
    """The TRL version installed for `python_exe`, or None (no TRL, or no such interpreter)."""
    probe = "from importlib.metadata import version; print(version('trl'))"
    try:
        proc = subprocess.run([python_exe, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


class Recorder:
    """Per-step wall time, rollout time and generated tokens, plus the checks that the peer ran what we asked.

    Tokens are counted on the sequences the trainer's own `generate` returned (neither trainer hands them out after
    the step; RLOOTrainer's `completions/mean_length` metric agrees), not assumed to be full length.
    """

    def __init__(self, eos_token_id: int):
        self.eos_token_id = eos_token_id
        self.steps: list[dict] = []
        self.optimizer_steps = 0
        self.rollouts = 0
        self.generation_config: dict | None = None  # as `generate` resolved it, first call
        self.generated_widths: list[int] = []  # new tokens per generate call (<= response_length)
        self.distinct_fractions: list[float] = []  # distinct completions / completions, per generate call
        self._started = self._rollout = None
        self._tokens = 0
        self.algorithm_settings: dict | None = None  # GRPOTrainer: its loss settings in our keys

    def start(self):
        self._started, self._rollout, self._tokens = clock(), None, 0

    def stop(self):
        wall = clock() - self._started
        self.steps.append({"wall": wall, "rollout": self._rollout, "tokens": self._tokens})

    def rollout_seconds(self, seconds: float):
        self._rollout = seconds

    def rollout_ended(self):
        """First update forward of the step: everything since the step began was the rollout."""
        if self._rollout is None:
            self._rollout = clock() - self._started

    def count_completions(self, sequences: torch.Tensor, prompt_length: int):
        """[B, prompt_length + T] -> real tokens: up to and including the first EOS, as both trainers mask them."""
        completions = sequences[:, prompt_length:]  # [B, T]
        is_eos = completions == self.eos_token_id
        width = completions.shape[1]
        lengths = torch.where(is_eos.any(1), is_eos.int().argmax(1) + 1, width)  # [B]
        self._tokens += int(lengths.sum())
        self.rollouts += 1
        self.generated_widths.append(width)
        self.distinct_fractions.append(len({tuple(row) for row in completions.tolist()}) / len(completions))


def watch_generation(policy, recorder: Recorder):
    """Wrap the policy's `generate` (tokens, width) and `_prepare_generation_config` (the settings it really used).

    The second answers whether a model's own generation_config overrode the trainer's sampling settings, a bug users
    reported in the peer: we read the config `generate` resolved, not the one the trainer meant to pass.
    """
    generate, prepare = policy.generate, policy._prepare_generation_config

    def counting_generate(*args, **kwargs):
        output = generate(*args, **kwargs)
        sequences = output.sequences if hasattr(output, "sequences") else output  # PPO asks for a dict output
        recorder.count_completions(sequences, kwargs["input_ids"].shape[1])
        return output

    def recording_prepare(*args, **kwargs):
        config, model_kwargs = prepare(*args, **kwargs)
        if recorder.generation_config is None:
            keys = (
                "do_sample",
                "temperature",
                "top_k",
                "top_p",
                "min_p",
                "max_new_tokens",
                "min_new_tokens",
                "eos_token_id",
                "pad_token_id",
                "repetition_penalty",
            )
            recorder.generation_config = {key: getattr(config, key, None) for key in keys}
        return config, model_kwargs

    policy.generate, policy._prepare_generation_config = counting_generate, recording_prepare


def clock_callback(recorder: Recorder, begin_event: str):
    """A TrainerCallback: each step runs from `begin_event` (or the previous step's end) to on_step_end.

    It also counts real optimiser steps with a hook on the torch optimiser, which TRL creates only at train().
    """
    from transformers import TrainerCallback

    def count_step(optimizer, args, kwargs):
        recorder.optimizer_steps += 1

    class Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
            getattr(optimizer, "optimizer", optimizer).register_step_post_hook(count_step)  # unwrap accelerate's
            if begin_event == "on_train_begin":
                recorder.start()

        def on_step_begin(self, args, state, control, **kwargs):
            if begin_event == "on_step_begin":
                recorder.start()

        def on_step_end(self, args, state, control, **kwargs):
            recorder.stop()
            if begin_event == "on_train_begin":
                recorder.start()  # the next step begins where this one ended

    return Clock()


def common_args(args, workdir: str) -> dict:
    """TrainingArguments shared by both trainers: no autocast (the models' own dtype), nothing saved, evaluated,
    reported or printed."""
    from transformers import TrainingArguments

    # TRL defaults bf16 and activation checkpointing to True; our worker has neither. transformers 5.x renamed
    # gradient_checkpointing (now a deprecated alias) to activation_checkpointing.
    fields = TrainingArguments.__dataclass_fields__
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    return {
        "output_dir": workdir,
        "use_cpu": args.device == "cpu",
        "bf16": False,
        "fp16": False,
        checkpointing: False,
        "seed": args.seed,
        "learning_rate": LEARNING_RATE,
        "lr_scheduler_type": "constant",
        "gradient_accumulation_steps": 1,
        "dataloader_num_workers": 0,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
    }


def silence(trainer):
    """Drop the callbacks that print every log: printing is not the trainer's work."""
    from transformers import PrinterCallback, ProgressCallback

    for printer in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(printer)


def activation_checkpointing(model) -> bool:
    """Whether the policy really recomputes activations (transformers < 5.x names it gradient checkpointing)."""
    name = (
        "is_activation_checkpointing"
        if hasattr(type(model), "is_activation_checkpointing")
        else "is_gradient_checkpointing"
    )
    return bool(getattr(model, name, False))


def prompt_texts(preset, num_prompts: int, seed: int, tokenizer) -> list[str]:
    """Our prompt ids as text. The trailing space matters: RLOOTrainer scores `prompt + completion` as one string,
    and without it the last prompt word and the first completion word would fuse into one unknown token."""
    ids = random_prompts(preset, num_prompts, seed)  # [num_prompts, prompt_length]
    texts = [text + " " for text in tokenizer.batch_decode(ids)]
    if tokenizer(texts, add_special_tokens=True)["input_ids"] != ids.tolist():
        raise RuntimeError(f"preset {preset.name!r}: prompts do not round-trip through the tokenizer")
    return texts


def use_compact_lm_head():
    """TRL 1.16's fused LM head scores only the completion positions where Triton runs (`_use_triton(device)`), and
    every position, prompt included, elsewhere: on CPU that is the LM head over the whole sequence. The compact path
    is plain torch, and the tile kernels decide for themselves (they keep their own `_use_triton`), so answering
    True to the head's question alone runs TRL on CPU as it runs on a GPU."""
    import trl.trainer.utils as trl_utils

    if not hasattr(trl_utils, "_use_triton"):
        raise RuntimeError("this TRL has no trl.trainer.utils._use_triton; run with --lm-head as-shipped")
    trl_utils._use_triton = lambda device: True


# the GRPO family as TRL's GRPOTrainer runs it, in our names: the loss's aggregation, the advantage's scale, the KL
# coefficient and the clip range, each as conf/algo/<name>.yaml sets it (rloo.bench.__main__ compares the two sides)
GRPO_LOSS_TYPES = {
    "grpo": dict(loss_type="grpo", scale_rewards="group", beta=0.04, epsilon=0.2, epsilon_high=None),
    "dr_grpo": dict(loss_type="dr_grpo", scale_rewards="none", beta=0.0, epsilon=0.2, epsilon_high=None),
    "dapo": dict(loss_type="dapo", scale_rewards="group", beta=0.0, epsilon=0.2, epsilon_high=0.28),
}
LOSS_AGGREGATION = {"grpo": "seq_mean_token_mean", "dr_grpo": "token_sum_norm", "dapo": "token_mean"}
ADVANTAGE = {"group": "group_std", "none": "group_mean"}


def grpo_settings(config) -> dict:
    """What a GRPOConfig sets, in the keys of our algorithm configs (the fairness check compares these)."""
    return {
        "loss_aggregation": LOSS_AGGREGATION.get(config.loss_type, config.loss_type),
        "advantage": ADVANTAGE.get(str(config.scale_rewards), str(config.scale_rewards)),
        "kl_coef": float(config.beta),
        "clip_range": float(config.epsilon),
        "clip_range_high": float(config.epsilon_high if config.epsilon_high is not None else config.epsilon),
        "ratio_level": config.importance_sampling_level,
    }


def build_group(args, preset, tokenizer, policy, reward_model, workdir: str, recorder: Recorder):
    """TRL's RLOOTrainer (`--algorithm rloo`) or GRPOTrainer (`grpo`, `dr_grpo`, `dapo`: its loss_type), which share
    their loop: k completions per prompt, generated and scored in `_generate_and_score_completions`."""
    from datasets import Dataset

    if args.algorithm == "rloo":
        from trl import RLOOConfig as Config
        from trl import RLOOTrainer as Trainer

        extra = dict(beta=preset.kl_coef)
    else:
        from trl import GRPOConfig as Config
        from trl import GRPOTrainer as Trainer

        extra = GRPO_LOSS_TYPES[args.algorithm]
    # TRL builds its reference by loading the policy's checkpoint path, so the initial policy goes to disk first:
    # the reference is then an exact, frozen copy of it.
    if args.lm_head == "compact":
        use_compact_lm_head()
    policy.save_pretrained(os.path.join(workdir, "policy"))
    policy.config._name_or_path = os.path.join(workdir, "policy")
    reward_model.config._name_or_path = "reward_model"  # names its metrics
    reward_model.requires_grad_(False)
    completions = preset.completions_per_step
    epochs, minis = schedule(args)
    # one generation of `completions` serves minis optimiser steps of completions/minis each, num_iterations times
    config = Config(
        **common_args(args, workdir),
        max_steps=(args.warmup + args.steps) * epochs * minis,
        per_device_train_batch_size=completions // minis,
        steps_per_generation=minis,
        num_iterations=epochs,
        num_generations=preset.k,
        max_completion_length=preset.response_length,
        temperature=TEMPERATURE,
        logging_strategy="no",
        log_completions=False,
        **extra,
    )
    prompts = prompt_texts(preset, preset.prompts_per_step * (args.warmup + args.steps), args.seed, tokenizer)
    trainer = Trainer(
        model=policy,
        reward_funcs=reward_model,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        reward_processing_classes=tokenizer,
        callbacks=[clock_callback(recorder, "on_step_begin")],
    )
    silence(trainer)
    if trainer.ref_model is not None:  # GRPOTrainer loads none at beta 0
        trainer.ref_model.requires_grad_(False)  # it only runs under no_grad; frozen, it counts no gradient bytes

    # In TRL 1.16 on transformers 5.24, Trainer._run_epoch calls on_step_begin before training_step, whose
    # _prepare_inputs generates and scores the rollout (`_generate_and_score_completions`), and on_step_end after
    # optimizer.step: begin -> end is the whole step (what falls outside, the next batch of prompt strings and the
    # skipped logging, measured under 1 ms). The rollout is timed around that method.
    generate_and_score = trainer._generate_and_score_completions

    def timed_generate_and_score(*a, **kw):
        started = clock()
        out = generate_and_score(*a, **kw)
        recorder.rollout_seconds(clock() - started)
        return out

    trainer._generate_and_score_completions = timed_generate_and_score
    watch_generation(trainer.model, recorder)
    if args.algorithm != "rloo":
        recorder.algorithm_settings = grpo_settings(config)
    models = [trainer.model, *([trainer.ref_model] if trainer.ref_model is not None else []), *trainer.reward_funcs]
    return trainer, lambda: models, preset.k


def build_ppo(args, preset, tokenizer, policy, reward_model, workdir: str, recorder: Recorder):
    from datasets import Dataset
    from trl.experimental.ppo import PPOConfig, PPOTrainer

    reference = copy.deepcopy(policy).requires_grad_(False)
    reward_model.requires_grad_(False)
    value_model = copy.deepcopy(reward_model).requires_grad_(True)  # initialised from the reward model, as ours
    completions = preset.completions_per_step  # one completion per prompt: equal completions per update
    steps = args.warmup + args.steps
    config = PPOConfig(
        **common_args(args, workdir),
        per_device_train_batch_size=completions,
        num_mini_batches=1,
        total_episodes=completions * steps,
        num_ppo_epochs=args.ppo_epochs,
        local_rollout_forward_batch_size=completions,
        response_length=preset.response_length,
        temperature=TEMPERATURE,
        kl_coef=preset.kl_coef,
        stop_token="eos",
        missing_eos_penalty=MISSING_EOS_PENALTY,
        num_sample_generations=0,
    )
    prompts = prompt_texts(preset, completions * steps, args.seed, tokenizer)
    dataset = Dataset.from_dict({"input_ids": tokenizer(prompts)["input_ids"]})
    trainer = PPOTrainer(
        args=config,
        processing_class=tokenizer,
        model=policy,
        ref_model=reference,
        reward_model=reward_model,
        value_model=value_model,
        train_dataset=dataset,
        callbacks=[clock_callback(recorder, "on_train_begin")],
    )
    silence(trainer)  # PPOTrainer logs every update, whatever logging_strategy says

    # TRL 1.12's PPOTrainer.train is its own loop: it fires on_train_begin, then only on_step_end after each
    # rollout + its PPO epochs (no on_step_begin), so a step runs from the previous on_step_end. The first
    # forward of the policy+value wrapper in a step is the first update (the rollout calls the parts directly).
    trainer.model.register_forward_pre_hook(lambda module, inputs: recorder.rollout_ended())
    watch_generation(policy, recorder)
    return trainer, lambda: [policy, reference, reward_model, value_model], 1


def schedule(args) -> tuple[int, int]:
    """(epochs, mini-batches) per rollout: --rloo-schedule for RLOO, (--ppo-epochs, 1) for PPO."""
    if args.algorithm == "ppo":
        return args.ppo_epochs, 1
    epochs, _, minis = args.rloo_schedule.partition("x")
    return int(epochs), int(minis or 1)


def per_rollout(steps: list[dict], updates: int) -> list[dict]:
    """The trainer's steps (one optimiser step each) summed into rollouts of `updates` steps: the first generates."""
    grouped = []
    for start in range(0, len(steps), updates):
        part = steps[start : start + updates]
        rollouts = [s["rollout"] for s in part if s["rollout"] is not None]
        grouped.append(
            {
                "wall": sum(s["wall"] for s in part),
                "tokens": sum(s["tokens"] for s in part),
                "rollout": sum(rollouts) if rollouts else None,
            }
        )
    return grouped


def reference_dtype(trainer) -> str | None:
    reference = getattr(trainer, "ref_model", None)
    return None if reference is None else str(next(reference.parameters()).dtype).removeprefix("torch.")


def run(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    import trl  # noqa: F401  (imported before the baseline is read: imports are not the step's memory)
    from transformers import logging as hf_logging

    if args.algorithm == "rloo":
        from trl import RLOOTrainer  # noqa: F401
    elif args.algorithm == "ppo":
        from trl.experimental.ppo import PPOTrainer  # noqa: F401
    else:
        from trl import GRPOTrainer  # noqa: F401
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    baseline_rss = current_rss_mb()  # after the imports, before any model: the framework's own cost, not the step's
    preset = get_preset(args.preset)
    tokenizer = build_tokenizer(preset.vocab_size)
    policy, reward_model = build_models(preset, args.seed)
    if args.precision == "bf16-true":  # saved in bfloat16, so TRL's reference (loaded from the policy's path) is too
        policy, reward_model = policy.bfloat16(), reward_model.bfloat16()
    recorder = Recorder(tokenizer.eos_token_id)
    build = build_ppo if args.algorithm == "ppo" else build_group
    with tempfile.TemporaryDirectory(prefix="rloo-bench-peer-") as workdir:
        trainer, models, k = build(args, preset, tokenizer, policy, reward_model, workdir, recorder)
        trainer.train()
    peak_rss = peak_rss_mb()  # before torch.sum's buffer
    check_run(args, preset, recorder)
    sum_rate = sum_read_rate(SUM_BYTES, torch.device(args.device), torch.float32)  # this process's read rate

    epochs, minis = schedule(args)
    # PPOTrainer's step is a whole rollout with its epochs; RLOOTrainer's is one optimiser step
    timed = per_rollout(recorder.steps, 1 if args.algorithm == "ppo" else epochs * minis)[args.warmup :]
    walls = [s["wall"] for s in timed]
    rollouts = [s["rollout"] for s in timed if s["rollout"] is not None]
    return {
        "implementation": f"trl-{trl.__version__}",
        "algorithm": args.algorithm,
        "preset": preset.name,
        "settings": preset.as_dict()
        | {
            "num_ppo_epochs": epochs,
            "num_mini_batches": minis,
            "completions_per_prompt": k,
            "prompts_per_step": preset.completions_per_step // k,
            "precision": "fp32" if args.precision == "32-true" else "bf16-true",
            "reference_dtype": reference_dtype(trainer),
            "temperature": TEMPERATURE,
            "learning_rate": LEARNING_RATE,
            "activation_checkpointing": activation_checkpointing(policy),
            **({"lm_head": args.lm_head} if args.algorithm != "ppo" else {}),
            **({"missing_eos_penalty": MISSING_EOS_PENALTY} if args.algorithm == "ppo" else {}),
        },
        "algorithm_settings": recorder.algorithm_settings,
        "device": args.device,
        "threads": torch.get_num_threads(),
        "steps": len(timed),
        "warmup": args.warmup,
        "step_seconds": walls,
        "step_seconds_median": median(walls),
        "rollout_seconds_median": median(rollouts) if len(rollouts) == len(timed) else None,
        "update_seconds_median": median([s["wall"] - s["rollout"] for s in timed])
        if len(rollouts) == len(timed)
        else None,
        "tokens_per_step": median([s["tokens"] for s in timed]),
        "tokens_per_step_nominal": preset.completions_per_step * preset.response_length,
        "tokens_per_second": median([s["tokens"] / s["wall"] for s in timed]),
        "optimizer_steps": recorder.optimizer_steps,
        "rollouts": recorder.rollouts,
        "generation": {
            "resolved_config": recorder.generation_config,
            "new_tokens_min": min(recorder.generated_widths),
            "distinct_completions_min": min(recorder.distinct_fractions),
        },
        "sum_gb_per_s": sum_rate / 1e9,
        "baseline_rss_mb": baseline_rss,
        "peak_rss_mb": peak_rss,
        "peak_rss_above_baseline_mb": peak_rss - baseline_rss,
        "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if args.device == "cuda" else None,
        "model_state_mb": model_state_mb(models(), getattr(trainer.optimizer, "optimizer", trainer.optimizer)),
        "python": platform.python_version(),
        "versions": {
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "trl": trl.__version__,
            "accelerate": _version("accelerate"),
        },
    }


def check_run(args, preset, recorder: Recorder):
    """Fail loudly where the peer did not run what we compare against: the step count or the sampling settings."""
    steps = args.warmup + args.steps
    epochs, minis = schedule(args)
    trainer_steps = steps if args.algorithm == "ppo" else steps * epochs * minis
    expected = {"steps": trainer_steps, "rollouts": steps, "optimizer_steps": steps * epochs * minis}
    counted = {"steps": len(recorder.steps), "rollouts": recorder.rollouts, "optimizer_steps": recorder.optimizer_steps}
    if counted != expected:
        raise RuntimeError(f"the peer ran {counted}, expected {expected}")
    config = recorder.generation_config or {}
    if not (
        config.get("do_sample")
        and abs(config.get("temperature", 0) - TEMPERATURE) < 1e-4
        and config.get("max_new_tokens") == preset.response_length
        and not config.get("min_new_tokens")
        and config.get("top_k") in (0, None)
        and config.get("top_p") in (1.0, None)
    ):
        raise RuntimeError(
            f"the peer's generate resolved {config}, not sampling at temperature {TEMPERATURE} "
            f"for {preset.response_length} tokens"
        )


def main(argv=None) -> None:
    args = parse_args(argv)
    result = run(args)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
