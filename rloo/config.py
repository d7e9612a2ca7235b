"""Config checks that run before any model loads, the typed settings built from a checked config, and the
OmegaConf resolvers the YAML uses.

Every default lives in the YAML (conf/); the dataclasses built here have none. Every error is one line naming
the key and what is allowed (`ConfigError`).
"""

from __future__ import annotations

import netrc
import os
import re
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rloo.errors import ConfigError
from rloo.objectives import IS_CORRECTIONS, KL_ESTIMATORS
from rloo.sampling import SAMPLERS, SamplingConfig

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CHOICE_GROUPS = ("model", "data", "judge", "precision", "trainer", "logger", "algo", "experiment", "debug", "bootstrap")
LOSSES = ("ppo_clip", "reinforce")
LR_SCHEDULES = ("linear", "constant", "cosine")
FROZEN_DTYPES = ("float32", "bfloat16", "float16")
OLD_LOGPROBS = ("recompute", "generation")
SEQUENCE_RATIOS = ("sum", "mean")


def group_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def check_group_choices(argv: list[str]) -> None:
    """Name the allowed options for `group=value` overrides before Hydra prints its multi-line error."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in CHOICE_GROUPS:
            continue
        allowed = group_options(key)
        for choice in value.split(","):  # multirun: model=a,b
            if choice not in allowed:
                raise ConfigError(f"{key}={choice!r} is not a config in conf/{key}/: choose one of {', '.join(allowed)}")


def wandb_offline() -> bool:
    """Offline unless the user has set W&B up, so that a run never waits on a network that is not there."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode:
        return mode in ("offline", "dryrun", "disabled")
    if os.environ.get("WANDB_API_KEY"):
        return False
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is None
    except (FileNotFoundError, netrc.NetrcParseError):
        return True


def sweep_group() -> str | None:
    """The W&B group of a multirun job: the sweep's config name and start time (k_clip-2026-12-03-08-30-00),
    shared by all its jobs; None for a single run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    hydra_cfg = HydraConfig.get()
    sweep_dir = Path(hydra_cfg.sweep.dir)
    return f"{hydra_cfg.job.config_name}-{sweep_dir.parent.name}-{sweep_dir.name}"


def sweep_job_name() -> str | None:
    """The W&B run name of a multirun job: its number and overrides, as its dir; None for a single run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    job = HydraConfig.get().job
    return f"{job.num}_{job.override_dirname}"


def unique_dir(path: str) -> str:
    """`path`, or `path_2`, `path_3`, ... : the first that did not exist, created here so that two runs started in
    the same second (or on two machines sharing the disk) never share a dir. Cached: resolved once per run."""
    for n in range(1, 10_000):
        candidate = Path(path if n == 1 else f"{path}_{n}")
        try:
            candidate.mkdir(parents=True)
            return str(candidate)
        except FileExistsError:
            continue
    raise ConfigError(f"hydra.run.dir: {path} and 9999 variants exist already")


def run_dir(resume: str | None, fresh: str) -> str:
    """hydra.run.dir: the run dir `resume=` continues, else a new unique one."""
    from rloo.resume import run_dir_of

    return run_dir_of(resume) or unique_dir(fresh)


def hydra_subdir(resume: str | None, now: str) -> str:
    """hydra.output_subdir: .hydra, or for a resumed run .hydra/resumed-HH-MM-SS, so the first run's is kept."""
    return ".hydra" if resume is None else f".hydra/resumed-{now}"


def register_resolvers() -> None:
    for name, resolver in (("wandb_offline", wandb_offline), ("sweep_group", sweep_group),
                           ("sweep_job_name", sweep_job_name), ("unique_dir", unique_dir), ("run_dir", run_dir),
                           ("hydra_subdir", hydra_subdir)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver, use_cache=name in ("unique_dir", "run_dir"))


def _require(cond: bool, key: str, allowed: str, value) -> None:
    if not cond:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


def _positive_int(cfg: DictConfig, key: str) -> int:
    value = OmegaConf.select(cfg, key)
    _require(isinstance(value, int) and not isinstance(value, bool) and value > 0, key, "a positive integer", value)
    return value


def _number(cfg: DictConfig, key: str, low: float, high: float = float("inf"), low_open: bool = False) -> float:
    value = OmegaConf.select(cfg, key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = ok and (value > low if low_open else value >= low) and value <= high
    bracket = "(" if low_open else "["
    _require(ok, key, f"a number in {bracket}{low}, {high}]", value)
    return float(value)


def updates_per_rollout(cfg: DictConfig) -> int:
    return cfg.num_ppo_epochs * cfg.num_mini_batches


def num_rollouts(cfg: DictConfig, world_size: int) -> int:
    """Rollouts (train-loop batches) of a run: total_episodes over the completions of one rollout on every device."""
    return cfg.total_episodes // (cfg.rollout_batch_size * world_size)


def compose_train_config(overrides: list[str]) -> DictConfig:
    """conf/train.yaml with command-line style overrides, outside a Hydra run (the benchmark worker, tests)."""
    from hydra import compose, initialize_config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=overrides)


def rollout_sampling(cfg: DictConfig) -> SamplingConfig:
    """How rollouts sample (conf/sampling.yaml)."""
    return SamplingConfig(cfg.response_length, cfg.temperature, cfg.top_k, cfg.top_p, greedy=False,
                          stop_at_eos=cfg.stop_token == "eos", lean_decode=cfg.lean_decode, sampler=cfg.sampler)


def eval_sampling(cfg: DictConfig) -> SamplingConfig:
    """How held-out evaluation samples: greedy unless eval.greedy=false, up to eval.max_new_tokens."""
    return SamplingConfig(cfg.eval.max_new_tokens, cfg.temperature, cfg.top_k, cfg.top_p, greedy=cfg.eval.greedy,
                          stop_at_eos=cfg.stop_token == "eos", lean_decode=cfg.lean_decode, sampler=cfg.sampler)


def algorithm_config(config_class, cfg: DictConfig, total_rollouts: int):
    """The typed settings of `config_class` (RLOOConfig, PPOConfig) from a checked config: every field by name."""
    from dataclasses import fields

    given = {"sampling": rollout_sampling(cfg), "total_rollouts": total_rollouts}
    return config_class(**{f.name: given[f.name] if f.name in given else cfg[f.name] for f in fields(config_class)})


# parameters partitioned across ranks. fsdp2: Lightning's ModelParallelStrategy with the policy sharded block by
# block (rloo.sharding), on GPUs or on CPU (gloo); the others are Lightning's own and need GPUs
SHARDED_STRATEGIES = ("fsdp2", "fsdp", "deepspeed_stage_3", "deepspeed_stage_3_offload")
CPU_STRATEGIES = ("auto", "ddp", "ddp_spawn", "fsdp2")


def validate_strategy(cfg: DictConfig) -> None:
    """What Lightning would refuse with a traceback after the models load, refused here in one line: Lightning's
    FSDP and DeepSpeed on CPU, the lean decode under partitioned parameters, LoRA with them."""
    strategy = str(OmegaConf.select(cfg, "trainer.strategy", default="auto"))
    accelerator = str(OmegaConf.select(cfg, "trainer.accelerator", default="auto"))
    if strategy.startswith(("fsdp", "deepspeed")) and strategy not in CPU_STRATEGIES and accelerator == "cpu":
        raise ConfigError(f"trainer.strategy={strategy} needs GPUs (trainer=gpu); on CPU use trainer.strategy=ddp "
                          "or fsdp2")
    if strategy in SHARDED_STRATEGIES and cfg.lean_decode:
        raise ConfigError(f"lean_decode=true cannot run under trainer.strategy={strategy}: the lean decode reads whole "
                          "weights, which this strategy partitions across ranks; set lean_decode=false (HF generate)")
    if strategy in SHARDED_STRATEGIES and OmegaConf.select(cfg, "model.lora"):
        raise ConfigError(f"model.lora=true cannot run under trainer.strategy={strategy}: LoRA keeps one whole base "
                          "on each rank (it is also the reference); use trainer.strategy=ddp")


def check_strategy_installed(cfg: DictConfig) -> None:
    """This machine, not the config: a DeepSpeed strategy needs the deepspeed package (asked before any model loads)."""
    import importlib.util

    strategy = str(OmegaConf.select(cfg, "trainer.strategy", default="auto"))
    if strategy.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(f"trainer.strategy={strategy} needs DeepSpeed, which is not installed: "
                          "pip install -e '.[deepspeed]' on a GPU machine, or use trainer.strategy=ddp | fsdp2")


def validate_lora(cfg: DictConfig) -> None:
    """model.lora and the lora: block; LoRA needs peft, asked for here, before any model loads."""
    lora = OmegaConf.select(cfg, "model.lora")
    _require(isinstance(lora, bool), "model.lora", "true or false", lora)
    if not lora:
        return
    _positive_int(cfg, "lora.r")
    _number(cfg, "lora.alpha", 0.0, low_open=True)
    _number(cfg, "lora.dropout", 0.0, 1.0)
    targets = OmegaConf.select(cfg, "lora.target_modules")
    _require(OmegaConf.is_list(targets) and len(targets) > 0 and all(isinstance(t, str) for t in targets),
             "lora.target_modules", "a non-empty list of linear-layer names", targets)
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise ConfigError("model.lora=true needs peft, which is not installed: pip install -e '.[lora]'")


POLICY_GRADIENTS = ("rloo", "raft", "reinforce", "vanilla_pg")  # RLOO's step, each with its own baseline
OFFLINE = ("dpo",)  # trained on pairs sampled from the frozen reference


def validate_train_config(cfg: DictConfig, world_size: int = 1) -> None:
    """Check every key `rloo.train` reads; raises ConfigError with a one-line message."""
    ppo = cfg.get("algorithm") == "ppo"
    k = OmegaConf.select(cfg, "k")
    if ppo:
        _require(isinstance(k, int) and not isinstance(k, bool) and k >= 1, "k", "an integer >= 1 (completions per prompt)", k)
        _require(cfg.loss == "ppo_clip", "loss", "ppo_clip with algo=ppo (its token-level clip; reinforce is RLOO's)", cfg.loss)
        _require(cfg.sequence_ratio == "sum", "sequence_ratio",
                 "sum with algo=ppo (its ratio is per token; mean is RLOO's length-normalised sequence ratio)", cfg.sequence_ratio)
        _number(cfg, "vf_coef", 0.0)
        _number(cfg, "value_clip_range", 0.0, low_open=True)
        _number(cfg, "gamma", 0.0, 1.0)
        _number(cfg, "lam", 0.0, 1.0)
        value_model = cfg.get("value_model")
        if value_model is not None and _looks_local(str(value_model)) and not Path(str(value_model)).exists():
            raise ConfigError(f"value_model={value_model!r} does not exist: a sequence classifier dir, a hub id, or null (the reward model)")
    else:
        algorithm = cfg.get("algorithm")
        _require(algorithm in POLICY_GRADIENTS + OFFLINE, "algorithm",
                 f"one of ppo, {', '.join(POLICY_GRADIENTS + OFFLINE)} (choose with algo=)", algorithm)
        if algorithm in ("rloo", "raft", "dpo"):
            _require(isinstance(k, int) and not isinstance(k, bool) and k >= 2, "k",
                     f"an integer >= 2 with algo={algorithm} (it compares each completion with the others of its prompt)", k)
        else:
            _require(isinstance(k, int) and not isinstance(k, bool) and k >= 1, "k", "an integer >= 1 (completions per prompt)", k)
        if algorithm == "reinforce":
            _number(cfg, "baseline_decay", 0.0, 1.0)
        if algorithm == "dpo":
            _number(cfg, "dpo_beta", 0.0, low_open=True)
            if OmegaConf.select(cfg, "model.lora"):
                raise ConfigError("model.lora=true is not allowed with algo=dpo: its pairs are sampled from the "
                                  "reference, which LoRA makes the policy itself; use model.lora=false")
    validate_sampling(cfg)
    for key in ("rollout_batch_size", "micro_batch_size", "generation_batch_size", "total_episodes", "num_ppo_epochs",
                "num_mini_batches", "log_every"):
        _positive_int(cfg, key)
    for key in ("sample_every", "checkpoint_every", "eval_every", "checkpoint_minutes"):
        value = OmegaConf.select(cfg, key)
        _require(isinstance(value, int) and not isinstance(value, bool) and value >= 0, key, "an integer >= 0", value)
    keep = OmegaConf.select(cfg, "keep_checkpoints")
    _require(isinstance(keep, int) and not isinstance(keep, bool) and keep >= -1, "keep_checkpoints",
             "an integer >= 0, or -1 (all)", keep)
    _positive_int(cfg, "max_bad_steps")
    validate_reward(cfg, ppo)
    validate_lora(cfg)
    validate_strategy(cfg)
    from rloo.resume import check_resume_argument

    check_resume_argument(cfg.get("resume"))
    _number(cfg, "lr", 0.0, low_open=True)
    _number(cfg, "kl_coef", 0.0)
    _number(cfg, "clip_range", 0.0, low_open=True)
    _number(cfg, "warmup_ratio", 0.0, 1.0)
    _number(cfg, "weight_decay", 0.0)
    if cfg.max_grad_norm is not None:
        _number(cfg, "max_grad_norm", 0.0, low_open=True)
    if cfg.missing_eos_penalty is not None:
        _number(cfg, "missing_eos_penalty", 0.0)
    _require(cfg.loss in LOSSES, "loss", f"one of {', '.join(LOSSES)}", cfg.loss)
    _require(cfg.kl_estimator in KL_ESTIMATORS, "kl_estimator", f"one of {', '.join(KL_ESTIMATORS)}", cfg.kl_estimator)
    _require(cfg.lr_schedule in LR_SCHEDULES, "lr_schedule", f"one of {', '.join(LR_SCHEDULES)}", cfg.lr_schedule)
    _require(cfg.old_logprobs in OLD_LOGPROBS, "old_logprobs", f"one of {', '.join(OLD_LOGPROBS)}", cfg.old_logprobs)
    _require(cfg.sequence_ratio in SEQUENCE_RATIOS, "sequence_ratio", f"one of {', '.join(SEQUENCE_RATIOS)}", cfg.sequence_ratio)
    _require(cfg.is_correction in IS_CORRECTIONS, "is_correction", f"one of {', '.join(IS_CORRECTIONS)}", cfg.is_correction)
    for key in ("fp32_lm_head", "log_histograms", "shared_prefix", "activation_checkpointing"):
        _require(isinstance(cfg[key], bool), key, "true or false", cfg[key])
    _number(cfg, "is_cap", 0.0, low_open=True)
    _number(cfg, "is_low", 0.0, 1.0, low_open=True)
    _number(cfg, "is_high", 1.0)

    rollout, micro, minis = cfg.rollout_batch_size, cfg.micro_batch_size, cfg.num_mini_batches
    _require(rollout % k == 0, "rollout_batch_size", f"a multiple of k={k} (it is prompts per rollout times k)", rollout)
    _require(rollout % minis == 0, "rollout_batch_size", f"a multiple of num_mini_batches={minis}", rollout)
    _require((rollout // minis) % micro == 0, "micro_batch_size",
             f"a divisor of the mini-batch rollout_batch_size/num_mini_batches={rollout // minis}", micro)
    _require(rollout % cfg.generation_batch_size == 0 or cfg.generation_batch_size >= rollout, "generation_batch_size",
             f"a divisor of rollout_batch_size={rollout}", cfg.generation_batch_size)
    if cfg.get("algorithm") in OFFLINE:  # a micro-batch holds whole pairs (each prompt's k rows)
        _require(micro % k == 0, "micro_batch_size", f"a multiple of k={k} with algo=dpo", micro)
    elif updates_per_rollout(cfg) == 1 and not ppo:
        # on-policy path: advantages come from the same forward as the loss, one micro-batch of whole groups at a time
        _require(micro % k == 0, "micro_batch_size", f"a multiple of k={k} when each rollout is used once", micro)
    elif cfg.loss == "reinforce":
        raise ConfigError(f"loss='reinforce' is exactly on-policy: it needs num_ppo_epochs=1 and num_mini_batches=1, "
                          f"got {cfg.num_ppo_epochs} and {minis}; use loss=ppo_clip to reuse a rollout")
    validate_judge_config(cfg)
    per_step = rollout * world_size
    _require(cfg.total_episodes >= per_step, "total_episodes",
             f"at least one rollout, rollout_batch_size * devices = {per_step}", cfg.total_episodes)
    if cfg.model.policy is None and cfg.get("bootstrap") is None:
        raise ConfigError("model.policy=None is not allowed: a save_pretrained dir or hub id (null only with the embedded bootstrap, model=tiny)")
    for split in ("train", "validation"):
        path = OmegaConf.select(cfg, f"data.{split}.path")
        if path is None and cfg.get("bootstrap") is None:
            raise ConfigError(f"data.{split}.path=None is not allowed: a hub id, a local file or a dataset dir")
        if path is not None and _looks_local(path) and not Path(path).exists():
            raise ConfigError(f"data.{split}.path={path!r} does not exist: give an existing file or dir, or a hub id")


def validate_reward(cfg: DictConfig, ppo: bool) -> None:
    """`reward=` parses and its functions import (nothing loads a model); reward_errors is known."""
    from rloo.rewards import MODEL, REWARD_ERRORS, load_function, parse_reward

    _require(cfg.reward_errors in REWARD_ERRORS, "reward_errors", f"one of {', '.join(REWARD_ERRORS)}", cfg.reward_errors)
    if ppo and cfg.reward_errors == "mask":
        raise ConfigError("reward_errors='mask' is not allowed with algo=ppo: it masks completions out of RLOO's "
                          "leave-one-out baseline; use reward_errors=raise")
    terms = parse_reward(cfg.reward)
    for term in terms:
        if term.name != MODEL:
            load_function(term.name)
    if any(t.name == MODEL for t in terms) and cfg.model.reward_model is None and cfg.get("bootstrap") is None:
        raise ConfigError(f"reward={cfg.reward!r} uses the reward model but model.reward_model is null: give one, "
                          "or score with functions only")


JUDGE_NEEDS = {"rloo.judges.oracle.OracleJudge": "data=toy (the oracle scores the embedded task only)"}


def validate_judge_config(cfg: DictConfig) -> None:
    """The `judge` group: a known judge whose settings construct (nothing loads), usable on this data."""
    judge_cfg = cfg.get("judge")
    if not judge_cfg or judge_cfg.get("_target_") is None:
        return
    target = judge_cfg._target_
    if target in JUDGE_NEEDS and cfg.data.name != "toy":
        raise ConfigError(f"judge={target.rsplit('.', 1)[1]} needs {JUDGE_NEEDS[target]}, got data={cfg.data.name}: "
                          "use judge=reward_model, openai, hf or none")
    if "path" in judge_cfg.keys() and OmegaConf.is_missing(judge_cfg, "path"):
        raise ConfigError("judge.path is required for this judge: a save_pretrained dir or hub id")
    from hydra.errors import InstantiationException

    from rloo.judges import build_judge

    try:
        judge = build_judge(judge_cfg)
    except InstantiationException as error:
        raise ConfigError(f"judge: {str(error).splitlines()[-1].strip()}") from None
    if hasattr(judge, "check"):
        judge.check()


HUB_ID = re.compile(r"^[\w.-]+(/[\w.-]+)?$")
MODEL_FILES = {"tokenizer": ("tokenizer.json", "tokenizer_config.json", "vocab.json")}  # any one of; models: config.json


def check_model_sources(cfg: DictConfig) -> None:
    """The model keys that are set: an existing save_pretrained dir, or a hub id (in the local cache when offline);
    the reward model a sequence classifier with one score. Read from config.json alone, before anything loads."""
    import json

    for key in ("policy", "reference", "reward_model", "tokenizer"):
        spec = cfg.model.get(key)
        if spec is None:
            continue
        spec, where = str(spec), f"model.{key}={spec!r}"
        path, wanted = Path(spec).expanduser(), MODEL_FILES.get(key, ("config.json",))
        if path.exists():
            if not path.is_dir() or not any((path / name).exists() for name in wanted):
                raise ConfigError(f"{where} is not a save_pretrained dir (it has no {' or '.join(wanted)})")
        elif _looks_local(spec) or not HUB_ID.match(spec):
            raise ConfigError(f"{where} does not exist: give a save_pretrained dir or a hub id")
        else:
            _check_hub_cache(spec, where, wanted)
            continue
        if key == "reward_model":
            config = json.loads((path / "config.json").read_text())
            architectures = config.get("architectures") or ["an unknown architecture"]
            labels = len(config.get("id2label") or {}) or config.get("num_labels", 1)
            if not any(a.endswith("ForSequenceClassification") for a in architectures):
                raise ConfigError(f"{where} is a {architectures[0]}, not a sequence classifier: a reward model has a "
                                  "score head with one output")
            if labels != 1:
                raise ConfigError(f"{where} has a score head with {labels} outputs: a reward model has one")


def _check_hub_cache(repo_id: str, where: str, wanted: tuple[str, ...]) -> None:
    """Offline (HF_HUB_OFFLINE=1), a hub id must be in the local cache already."""
    from huggingface_hub import constants, try_to_load_from_cache

    if not constants.HF_HUB_OFFLINE:
        return
    if not any(isinstance(try_to_load_from_cache(repo_id, name), str) for name in wanted):
        raise ConfigError(f"{where} is a hub id that is not in the local cache ({constants.HF_HUB_CACHE}), and "
                          "HF_HUB_OFFLINE=1: download it first or give a local dir")


def policy_location(spec: str, key: str) -> str:
    """A run dir's policy/, a save_pretrained dir, or a hub id (org/name that is not a local path)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        for candidate in (path / "policy", path):
            if (candidate / "config.json").exists():
                return str(candidate)
        raise ConfigError(f"{key}={spec!r} is a dir with neither a run's policy/ nor a save_pretrained model (config.json)")
    if spec.startswith((".", "/", "~")) or not HUB_ID.match(spec):
        raise ConfigError(f"{key}={spec!r} does not exist: give a run dir, a save_pretrained dir or a hub id")
    return spec


def validate_sampling(cfg: DictConfig) -> None:
    """The keys of conf/sampling.yaml, the prompt length and the frozen models' dtype: what train and evaluate share."""
    for key in ("response_length", "eval.num_prompts", "eval.batch_size", "eval.max_new_tokens", "data.max_prompt_length"):
        _positive_int(cfg, key)
    top_k = OmegaConf.select(cfg, "top_k")
    _require(isinstance(top_k, int) and not isinstance(top_k, bool) and top_k >= 0, "top_k", "an integer >= 0", top_k)
    _number(cfg, "temperature", 0.0, low_open=True)
    _number(cfg, "top_p", 0.0, 1.0, low_open=True)
    _require(cfg.stop_token in ("eos", None), "stop_token", "eos or null", cfg.stop_token)
    for key in ("lean_decode", "eval.greedy"):
        value = OmegaConf.select(cfg, key)
        _require(isinstance(value, bool), key, "true or false", value)
    _require(OmegaConf.select(cfg, "sampler") in SAMPLERS, "sampler", f"one of {', '.join(SAMPLERS)}",
             OmegaConf.select(cfg, "sampler"))
    _require(cfg.model.frozen_dtype in FROZEN_DTYPES, "model.frozen_dtype", f"one of {', '.join(FROZEN_DTYPES)}", cfg.model.frozen_dtype)


def validate_eval_config(cfg: DictConfig) -> None:
    """Check every key `rloo.evaluate` reads; raises ConfigError with a one-line message."""
    validate_sampling(cfg)
    for key in ("policy", "opponent"):
        if cfg.get(key) is not None:
            policy_location(str(cfg[key]), key)
    if cfg.policy is None and cfg.model.policy is None and cfg.get("bootstrap") is None:
        raise ConfigError("policy=None is not allowed here: a run dir, a save_pretrained dir or a hub id (or set model.policy)")
    path = OmegaConf.select(cfg, "data.validation.path")
    if path is None and cfg.get("bootstrap") is None:
        raise ConfigError("data.validation.path=None is not allowed: a hub id, a local file or a dataset dir")
    if path is not None and _looks_local(path) and not Path(path).exists():
        raise ConfigError(f"data.validation.path={path!r} does not exist: give an existing file or dir, or a hub id")
    validate_judge_config(cfg)


def _looks_local(path: str) -> bool:
    return path.startswith((".", "/", "~")) or Path(path).suffix in (".jsonl", ".json", ".parquet", ".csv", ".arrow")


def run_entry_point(hydra_main) -> None:
    """Shared by the `python -m rloo.X` entry points: one-line errors for unknown group options, then Hydra."""
    try:
        check_group_choices(sys.argv[1:])
        from rloo.resume import check_resume_argument

        for arg in sys.argv[1:]:  # before Hydra makes the run dir from it
            if arg.startswith("resume="):
                check_resume_argument(arg.partition("=")[2])
    except ConfigError as error:
        exit_on_config_error(error)
    register_resolvers()
    hydra_main()


class JobFailed(RuntimeError):
    """A multirun job's failure: raised (not exited) so that Hydra records this job as failed, runs the others,
    and ends the sweep with a non-zero status."""


def in_multirun() -> bool:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def fail(error: Exception, code: int) -> None:
    """End the job on a one-line error: exit with `code` (2 for config errors, 1 for the rest), or in a multirun
    fail this job only."""
    print(f"error: {error}", file=sys.stderr)
    if in_multirun():
        raise JobFailed(str(error)) from None
    sys.exit(code)


def exit_on_config_error(error: ConfigError) -> None:
    fail(error, 2)
