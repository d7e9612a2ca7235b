"""Config checks that run before any model loads, and the typed settings built from a checked config.

Types, ranges and the keys each algorithm reads are the schema's (rloo.config.schema: the run's keys, and each
algorithm's config class, found through rloo/algorithms/registry.py); the checks here span keys or groups (batch
divisibility, k per algorithm, strategies, LoRA, rewards, judges, model and data locations). Every default lives in
the YAML (conf/); the dataclasses built here have none. Every error is one line naming the key and what is allowed
(`ConfigError`).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rloo.algorithms.registry import ALGORITHMS
from rloo.config.schema import check_config, check_keys
from rloo.generation.settings import SamplingConfig
from rloo.utils.errors import ConfigError
from rloo.utils.keys import looks_local, refuse_inert, settings


def _require(cond: bool, key: str, allowed: str, value) -> None:
    if not cond:
        raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")


AUTOCAST_DTYPES = {"bf16-mixed": "bfloat16", "16-mixed": "float16"}


def autocast_dtype(precision: str) -> str | None:
    """The dtype a Lightning precision autocasts compute to over float32 weights; None where it does not."""
    return AUTOCAST_DTYPES.get(str(precision))


def world_size(trainer_args: dict) -> int:
    """The processes a Trainer with these arguments will run (devices x num_nodes), known before it is built, so
    that max_steps can be set up front. rloo.train checks it against the Trainer's own count."""
    devices, nodes = trainer_args.get("devices", "auto"), int(trainer_args.get("num_nodes", 1))
    if isinstance(devices, (list, tuple)):
        return len(devices) * nodes
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()]) * nodes
    if devices in ("auto", -1, "-1"):
        import torch

        gpu = trainer_args.get("accelerator") in ("gpu", "cuda", "auto") and torch.cuda.is_available()
        return (torch.cuda.device_count() if gpu else 1) * nodes
    try:
        return int(devices) * nodes
    except ValueError:
        raise ConfigError(
            f"trainer.devices={devices!r} is not allowed: a count, a list of device ids, or auto"
        ) from None


def updates_per_rollout(cfg: DictConfig) -> int:
    return cfg.num_ppo_epochs * cfg.num_mini_batches


def num_rollouts(cfg: DictConfig, world_size: int) -> int:
    """Rollouts (train-loop batches) of a run: total_episodes over the completions of one rollout on every device."""
    return cfg.total_episodes // (cfg.rollout_batch_size * world_size)


def episodes_note(cfg: DictConfig, world_size: int) -> str | None:
    """A line for a total_episodes that whole rollouts do not reach exactly (legitimate: the published 1,000,000
    over 512-completion rollouts): how many rollouts and episodes the run trains instead. None when it divides."""
    per_rollout = cfg.rollout_batch_size * world_size
    if cfg.total_episodes % per_rollout == 0:
        return None
    rollouts = num_rollouts(cfg, world_size)
    return (
        f"total_episodes={cfg.total_episodes} is not a multiple of a rollout ({per_rollout} completions): "
        f"the run trains {rollouts} rollouts, {rollouts * per_rollout} episodes"
    )


def rollout_sampling(cfg: DictConfig) -> SamplingConfig:
    """How rollouts sample (conf/sampling.yaml): each setting its key's, up to response_length."""
    return settings(
        SamplingConfig, cfg, max_new_tokens=cfg.response_length, greedy=False, stop_at_eos=cfg.stop_token == "eos"
    )


def eval_sampling(cfg: DictConfig) -> SamplingConfig:
    """How held-out evaluation samples: greedy unless eval.greedy=false, up to eval.max_new_tokens."""
    return settings(
        SamplingConfig,
        cfg,
        max_new_tokens=cfg.eval.max_new_tokens,
        greedy=cfg.eval.greedy,
        stop_at_eos=cfg.stop_token == "eos",
        rollout_precision="same",  # evaluation samples at the training precision, whatever the rollout's
    )


def verifiable_eval(cfg: DictConfig):
    """The sampled evaluation for verifiable rewards (eval.samples_per_prompt and the keys below it), or None where it
    is off."""
    if cfg.eval.samples_per_prompt == 0:
        return None
    from rloo.evaluation.heldout import VerifiableEval
    from rloo.rewards.scoring import load_function

    answer = load_function(cfg.eval.answer, key="eval.answer") if cfg.eval.answer is not None else None
    sampling = dataclasses.replace(rollout_sampling(cfg), rollout_precision="same")  # as eval_sampling
    return settings(VerifiableEval, cfg.eval, pass_k=tuple(cfg.eval.pass_k), sampling=sampling, answer=answer)


def algorithm_config(cfg: DictConfig, total_rollouts: int):
    """The typed settings of `cfg.algorithm`'s config class (rloo/algorithms/registry.py) from a checked config: each
    key by its field's name, the derived fields made here."""
    return settings(
        ALGORITHMS[cfg.algorithm].config(), cfg, sampling=rollout_sampling(cfg), total_rollouts=total_rollouts
    )


# parameters partitioned across ranks. fsdp2: Lightning's ModelParallelStrategy with the policy sharded block by
# block (rloo.models.sharding), on GPUs or on CPU (gloo); the others are Lightning's own and need GPUs
SHARDED_STRATEGIES = ("fsdp2", "fsdp", "deepspeed_stage_3", "deepspeed_stage_3_offload")
CPU_STRATEGIES = ("auto", "ddp", "ddp_spawn", "fsdp2", "deepspeed_stage_2", "deepspeed_stage_3")


def validate_strategy(cfg: DictConfig) -> None:
    """What Lightning would refuse with a traceback after the models load, refused here in one line: Lightning's
    FSDP and DeepSpeed on CPU, the lean decode under partitioned parameters, LoRA with them."""
    strategy = str(OmegaConf.select(cfg, "trainer.strategy", default="auto"))
    accelerator = str(OmegaConf.select(cfg, "trainer.accelerator", default="auto"))
    if strategy.startswith(("fsdp", "deepspeed")) and strategy not in CPU_STRATEGIES and accelerator == "cpu":
        raise ConfigError(
            f"trainer.strategy={strategy} needs GPUs (trainer=gpu); on CPU use trainer.strategy=ddp, fsdp2, "
            "deepspeed_stage_2 or deepspeed_stage_3"
        )
    if strategy == "fsdp" and cfg.lean_decode:
        raise ConfigError(
            "lean_decode=true cannot run under trainer.strategy=fsdp: the lean decode reads whole weights, which "
            "Lightning's FSDP partitions and rloo does not gather; set lean_decode=false (HF generate) or use "
            "trainer.strategy=fsdp2"
        )
    if strategy in SHARDED_STRATEGIES and OmegaConf.select(cfg, "model.lora"):
        raise ConfigError(
            f"model.lora=true cannot run under trainer.strategy={strategy}: LoRA keeps one whole base "
            "on each rank (it is also the reference); use trainer.strategy=ddp"
        )


def check_strategy_installed(cfg: DictConfig) -> None:
    """This machine, not the config: a DeepSpeed strategy needs the deepspeed package (asked before any model loads)."""
    import importlib.util

    strategy = str(OmegaConf.select(cfg, "trainer.strategy", default="auto"))
    if strategy.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(
            f"trainer.strategy={strategy} needs DeepSpeed, which is not installed: "
            "pip install -e '.[deepspeed]', or use trainer.strategy=ddp | fsdp2"
        )


def check_collective_timeout(cfg: DictConfig, world_size: int) -> None:
    """trainer.collective_timeout_s (a rank that hangs mid-run) and trainer.startup_timeout_s (the ranks joining at
    start-up): seconds, above 0; refused where one process runs (no collective to time)."""
    for key, what in (
        ("collective_timeout_s", "it times collectives"),
        ("startup_timeout_s", "it times the ranks' start"),
    ):
        value = OmegaConf.select(cfg, f"trainer.{key}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"trainer.{key}={value!r} is not allowed: seconds, a number above 0")
        if world_size < 2:
            refuse_inert(cfg, f"trainer.{key}", "one process", what)


def validate_lora(cfg: DictConfig) -> None:
    """LoRA needs peft, asked for here, before any model loads (the lora: keys are checked by the schema)."""
    if not cfg.model.lora:
        return
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise ConfigError("model.lora=true needs peft, which is not installed: pip install -e '.[lora]'")


def validate_rollout_precision(cfg: DictConfig) -> None:
    """rollout_precision=bf16 samples an fp32 run from bfloat16 copies of its weights, in the lean decode: under a
    bf16 or fp16 precision the rollout's products are already half precision, and HF generate has no such copies."""
    if cfg.rollout_precision == "same":
        return
    if cfg.precision.trainer != "32-true":
        raise ConfigError(
            f"rollout_precision={cfg.rollout_precision} needs precision=fp32: under precision.trainer="
            f"{cfg.precision.trainer} the rollout's products are half precision already; remove it"
        )
    if not cfg.lean_decode:
        raise ConfigError(
            f"rollout_precision={cfg.rollout_precision} needs lean_decode=true: the bfloat16 copies of the weights "
            "are the lean decode's (HF generate samples from the model's own)"
        )


def validate_train_config(cfg: DictConfig, world_size: int = 1) -> None:
    """Check every key `rloo.train` reads; raises ConfigError with a one-line message. Types, ranges and the keys
    an algorithm reads are the schema's (rloo.config.schema); what spans keys or groups is checked here."""
    algorithm = cfg.get("algorithm")
    check_config(cfg, algorithm)
    check_sources_given(cfg)
    spec, k = ALGORITHMS[algorithm], cfg.k
    if cfg.get("missing_eos_penalty") and cfg.get("missing_eos_score") is not None:
        raise ConfigError(
            f"missing_eos_penalty={cfg.missing_eos_penalty} and missing_eos_score={cfg.missing_eos_score}: one "
            "missing-EOS rule at a time (subtract the penalty, or replace the score); set the other to null"
        )
    spec.config().check(cfg, world_size)  # the algorithm's own rules (rloo/algorithms/configs.py)
    check_targets(cfg)
    validate_reward(cfg)
    validate_environment(cfg)
    validate_external_rollout(cfg)
    validate_verifiable_eval(cfg)
    validate_lora(cfg)
    validate_strategy(cfg)
    validate_rollout_precision(cfg)
    from rloo.utils.resume import check_resume_argument

    check_resume_argument(cfg.get("resume"))

    rollout, micro, minis = cfg.rollout_batch_size, cfg.micro_batch_size, cfg.num_mini_batches
    _require(
        rollout % k == 0, "rollout_batch_size", f"a multiple of k={k} (it is prompts per rollout times k)", rollout
    )
    _require(rollout % minis == 0, "rollout_batch_size", f"a multiple of num_mini_batches={minis}", rollout)
    _require(
        (rollout // minis) % micro == 0,
        "micro_batch_size",
        f"a divisor of the mini-batch rollout_batch_size/num_mini_batches={rollout // minis}",
        micro,
    )
    _require(
        rollout % cfg.generation_batch_size == 0 or cfg.generation_batch_size >= rollout,
        "generation_batch_size",
        f"a divisor of rollout_batch_size={rollout}",
        cfg.generation_batch_size,
    )
    if updates_per_rollout(cfg) == 1 and not spec.value_model:
        # on-policy path: advantages come from the same forward as the loss, one micro-batch of whole groups at a time
        _require(micro % k == 0, "micro_batch_size", f"a multiple of k={k} when each rollout is used once", micro)
    validate_judge_config(cfg)
    validate_environment(cfg)
    per_step = rollout * world_size
    _require(
        cfg.total_episodes >= per_step,
        "total_episodes",
        f"at least one rollout, rollout_batch_size * devices = {per_step}",
        cfg.total_episodes,
    )
    for split in ("train", "validation"):  # null without the bootstrap: check_sources_given
        path = OmegaConf.select(cfg, f"data.{split}.path")
        if path is not None and looks_local(path) and not Path(path).exists():
            raise ConfigError(f"data.{split}.path={path!r} does not exist: give an existing file or dir, or a hub id")


def check_targets(cfg: DictConfig) -> None:
    """Every `_target_` (a logger, a judge) that names a module rloo moved is one line naming the new path."""
    from rloo.utils.moved import moved_target

    def targets(raw: dict, path: str):  # the config as written (OmegaConf.to_container), each _target_'s value
        for name, value in raw.items():
            if name == "_target_" and value != "???":
                yield str(OmegaConf.select(cfg, f"{path}{name}") if "${" in str(value) else value)
            elif isinstance(value, dict):
                yield from targets(value, f"{path}{name}.")

    for target in targets(OmegaConf.to_container(cfg, resolve=False), ""):
        if (reason := moved_target(target)) is not None:
            raise ConfigError(reason)


def check_sources_given(cfg: DictConfig) -> None:
    """Your own model, data and reward (bootstrap=null, as experiment=own_model): every one still to be filled in
    (model.policy, the data paths, a reward model that reward= uses), in one line rather than one per try."""
    from rloo.rewards.scoring import MODEL, parse_reward

    if cfg.get("bootstrap") is not None:  # the embedded task fills whatever is null
        return
    data = [
        f"data.{split}.path" for split in ("train", "validation") if OmegaConf.select(cfg, f"data.{split}.path") is None
    ]
    missing = (
        ["model.policy (a model dir, a cached hub id or package:<module>/<file>)"] if cfg.model.policy is None else []
    )
    if data:
        missing.append(
            f"{' and '.join(data)} (a .jsonl/.json/.csv/.parquet/.arrow file, a dataset dir or a cached hub dataset)"
        )
    if any(term.name == MODEL for term in parse_reward(cfg.reward)) and cfg.model.reward_model is None:
        missing.append(f"reward (module:function; reward={cfg.reward!r} needs model.reward_model)")
    if missing:
        raise ConfigError("still null, give each: " + "; ".join(missing))


def validate_run(cfg: DictConfig, world_size: int) -> None:
    """The one validation entry of `rloo.train`, before anything heavy is imported, written or loaded: every key
    (validate_train_config), the strategy's package, and the model sources (config.json or the hub cache, read
    only)."""
    validate_train_config(cfg, world_size=world_size)
    check_strategy_installed(cfg)
    check_collective_timeout(cfg, world_size)
    check_model_sources(cfg)


def validate_reward(cfg: DictConfig) -> None:
    """`reward=` parses and its functions import (nothing loads a model); its `env` term has an environment."""
    from rloo.rewards.scoring import BUILT_IN, ENV, MODEL, load_function, parse_reward

    terms = parse_reward(cfg.reward)
    for term in terms:
        if term.name not in BUILT_IN:
            load_function(term.name)
    if all(t.name == MODEL for t in terms):
        refuse_inert(cfg, "reward_timeout_s", f"reward={cfg.reward!r}", "it times reward functions")
    if any(t.name == ENV for t in terms) and not cfg.get("env"):
        raise ConfigError(
            f"reward={cfg.reward!r} names env, the environment's return, and env= is none: choose an environment "
            "(env=<name>, conf/env/) or leave env out of reward="
        )


def validate_environment(cfg: DictConfig) -> None:
    """env=: its class imports, and the run can sample episodes (turns that stop at EOS, an algorithm of the shared
    policy-gradient step)."""
    env = cfg.get("env")
    if not env:
        return
    from rloo.environments.base import environment_class

    for name in ("_target_", "functions"):
        if isinstance(env.get("environment"), DictConfig) and OmegaConf.is_missing(env.environment, name):
            raise ConfigError(f"env={env.name}: give env.environment.{name} (see conf/env/{env.name}.yaml)")
    if not isinstance(env.get("environment"), DictConfig) or "_target_" not in env.environment:
        raise ConfigError(
            f"env={env.name}: env.environment needs _target_: the environment class (package.module.Class), which "
            "Hydra instantiates once per episode (_partial_: true), its keyword arguments beside _target_"
        )
    environment_class(env.environment._target_)
    if cfg.stop_token != "eos":
        raise ConfigError(f"env={env.name}: a model's turn ends at its stop token: set stop_token=eos")
    if cfg.get("algorithm") is not None and not samples_any_rollout(cfg.algorithm):  # (rloo.evaluate has none)
        raise ConfigError(
            f"env={env.name} runs with the algorithms of the shared policy-gradient step, not algo={cfg.algorithm}"
        )


def samples_any_rollout(algorithm: str) -> bool:
    """Whether `algorithm` takes any rollout the engine samples (its config class says: the shared step's do)."""
    from rloo.algorithms.registry import ALGORITHMS

    return ALGORITHMS[algorithm].config().samples_any_rollout


def validate_external_rollout(cfg: DictConfig) -> None:
    """rollout=module:function: it imports and is callable; it samples plain rollouts of the shared step (an
    environment's episodes are the engine's)."""
    target = cfg.get("rollout")
    if target is None:
        return
    from rloo.rewards.scoring import load_function

    load_function(str(target), "rollout")
    if cfg.get("env"):
        raise ConfigError(
            f"rollout={target} samples the rollouts itself, and env={cfg.env.name} has the engine "
            "sample episodes: choose one"
        )
    if not samples_any_rollout(cfg.algorithm):
        raise ConfigError(
            f"rollout={target} serves the algorithms of the shared policy-gradient step, not algo={cfg.algorithm}"
        )


def validate_verifiable_eval(cfg: DictConfig) -> None:
    """eval.samples_per_prompt and the keys that read its samples: reward functions to judge them, each k of pass_k
    at most n, an importable answer function; off (0), the other three are refused if set."""
    from rloo.rewards.scoring import MODEL, load_function, parse_reward

    n = cfg.eval.samples_per_prompt
    if n == 0:
        for name in ("pass_k", "correct_at", "answer"):
            refuse_inert(cfg, f"eval.{name}", "eval.samples_per_prompt=0", "it reads the sampled evaluation")
        return
    if all(term.name == MODEL for term in parse_reward(cfg.reward)):
        raise ConfigError(
            f"eval.samples_per_prompt={n} needs reward functions to judge each sample correct, but reward="
            f"{cfg.reward!r} has none; give reward=module:function or set eval.samples_per_prompt=0"
        )
    if max(cfg.eval.pass_k) > n or min(cfg.eval.pass_k) < 1:
        raise ConfigError(
            f"eval.pass_k={list(cfg.eval.pass_k)} is not allowed: each k in [1, eval.samples_per_prompt={n}]"
        )
    if cfg.eval.answer is not None:
        load_function(cfg.eval.answer, key="eval.answer")


JUDGE_NEEDS = {"rloo.toy.judge.OracleJudge": "data=toy (the oracle scores the embedded task only)"}


def validate_judge_config(cfg: DictConfig) -> None:
    """The `judge` group: a known judge whose settings construct (nothing loads), usable on this data."""
    judge_cfg = cfg.get("judge")
    if not judge_cfg or judge_cfg.get("_target_") is None:
        refuse_inert(cfg, "eval.judge_timeout_s", "judge=none", "it times the judge")
        return
    target = judge_cfg._target_
    if target in JUDGE_NEEDS and cfg.data.name != "toy":
        raise ConfigError(
            f"judge={target.rsplit('.', 1)[1]} needs {JUDGE_NEEDS[target]}, got data={cfg.data.name}: "
            "use judge=reward_model, openai, hf or none"
        )
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
MODEL_FILES = {
    "tokenizer": ("tokenizer.json", "tokenizer_config.json", "vocab.json")
}  # any one of; models: config.json


def check_model_sources(cfg: DictConfig) -> None:
    """The model keys that are set: an existing save_pretrained dir, or a hub id (in the local cache when offline);
    the reward model a sequence classifier with one score. Read from config.json alone, before anything loads."""
    import json

    from rloo.models.packaged import is_packaged, packaged_file

    for key in ("policy", "reference", "reward_model", "tokenizer"):
        spec = cfg.model.get(key)
        if spec is None:
            continue
        if is_packaged(spec):  # a model file inside an installed package: there, and readable (rloo.models.packaged)
            packaged_file(str(spec))
            continue
        spec, where = str(spec), f"model.{key}={spec!r}"
        path, wanted = Path(spec).expanduser(), MODEL_FILES.get(key, ("config.json",))
        if path.exists():
            if not path.is_dir() or not any((path / name).exists() for name in wanted):
                raise ConfigError(f"{where} is not a save_pretrained dir (it has no {' or '.join(wanted)})")
        elif looks_local(spec) or not HUB_ID.match(spec):
            raise ConfigError(f"{where} does not exist: give a save_pretrained dir or a hub id")
        else:
            _check_hub_cache(spec, where, wanted)
            continue
        if key in ("policy", "reference"):
            check_causal_lm(path, where)
        if key == "reward_model":
            config = json.loads((path / "config.json").read_text())
            architectures = config.get("architectures") or ["an unknown architecture"]
            labels = len(config.get("id2label") or {}) or config.get("num_labels", 1)
            if not any(a.endswith("ForSequenceClassification") for a in architectures):
                raise ConfigError(
                    f"{where} is a {architectures[0]}, not a sequence classifier: a reward model has a "
                    "score head with one output"
                )
            if labels != 1:
                raise ConfigError(f"{where} has a score head with {labels} outputs: a reward model has one")


GENERATIVE_HEADS = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


def check_causal_lm(path: Path, where: str) -> None:
    """A local model dir given as a policy is a causal LM by its config.json (a reward model's dir is not: loaded
    as a causal LM it gets a random LM head, and samples noise without a word). A config without `architectures`
    passes: transformers decides from model_type."""
    import json

    config = Path(path) / "config.json"
    if not config.is_file():
        return
    architectures = json.loads(config.read_text()).get("architectures") or []
    if architectures and not any(a.endswith(GENERATIVE_HEADS) for a in architectures):
        raise ConfigError(
            f"{where} is a {architectures[0]}, not a causal LM: a policy generates text (a reward model's dir belongs "
            "in model.reward_model)"
        )


def check_context(cfg: DictConfig, policy: str | None, longest_prompt: int, data: str) -> None:
    """The longest prompt of the data and a completion of response_length (with env=, an episode of
    env.max_episode_tokens) fit the policy's positions
    (max_position_embeddings of a local policy's config.json): beyond them its position embeddings or rotary tables
    run out. Checked once the prompts are tokenized, before any model loads."""
    import json

    config = Path(str(policy)).expanduser() / "config.json" if policy else None
    if config is None or not config.is_file():
        return
    context = json.loads(config.read_text()).get("max_position_embeddings")
    env = cfg.get("env")
    # an episode runs to its budget: the model's turns and the environment's replies
    key, after = ("env.max_episode_tokens", env.max_episode_tokens) if env else ("response_length", cfg.response_length)
    if isinstance(context, int) and longest_prompt + after > context:
        raise ConfigError(
            f"{key}={after} after the longest prompt of {data} ({longest_prompt} tokens) "
            f"needs {longest_prompt + after} positions; model.policy={str(policy)!r} has {context} "
            f"(max_position_embeddings): lower {key} or data.max_prompt_length"
        )


def _check_hub_cache(repo_id: str, where: str, wanted: tuple[str, ...]) -> None:
    """Offline (HF_HUB_OFFLINE=1), a hub id must be in the local cache already."""
    from huggingface_hub import constants, try_to_load_from_cache

    if not constants.HF_HUB_OFFLINE:
        return
    if not any(isinstance(try_to_load_from_cache(repo_id, name), str) for name in wanted):
        raise ConfigError(
            f"{where} is a hub id that is not in the local cache ({constants.HF_HUB_CACHE}), and "
            "HF_HUB_OFFLINE=1: download it first or give a local dir"
        )


def policy_location(spec: str, key: str) -> str:
    """A run dir's policy/, a save_pretrained dir, or a hub id (org/name that is not a local path)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        for candidate in (path / "policy", path):
            if (candidate / "config.json").exists():
                return str(candidate)
        raise ConfigError(
            f"{key}={spec!r} is a dir with neither a run's policy/ nor a save_pretrained model (config.json)"
        )
    if spec.startswith((".", "/", "~")) or not HUB_ID.match(spec):
        raise ConfigError(f"{key}={spec!r} does not exist: give a run dir, a save_pretrained dir or a hub id")
    return spec


SHARED_KEYS = (
    "response_length",
    "temperature",
    "top_k",
    "top_p",
    "stop_token",
    "lean_decode",
    "sampler",
    "cuda_graph",
    "eval.num_prompts",
    "eval.batch_size",
    "eval.greedy",
    "eval.max_new_tokens",
    "eval.judge_timeout_s",
    "data.max_prompt_length",
    "model.frozen_dtype",
)


def validate_sampling(cfg: DictConfig) -> None:
    """The keys of conf/sampling.yaml, the prompt length and the frozen models' dtype: what train and evaluate share
    (rloo.evaluate's config has keys of its own, so only these are checked against the schema)."""
    check_keys(cfg, SHARED_KEYS)


def validate_eval_config(cfg: DictConfig) -> None:
    """Check every key `rloo.evaluate` reads; raises ConfigError with a one-line message."""
    validate_sampling(cfg)
    for key in ("policy", "opponent"):
        if cfg.get(key) is not None:
            check_causal_lm(Path(policy_location(str(cfg[key]), key)), f"{key}={cfg[key]!r}")
    if cfg.policy is None and cfg.model.policy is None and cfg.get("bootstrap") is None:
        raise ConfigError(
            "policy=None is not allowed here: a run dir, a save_pretrained dir or a hub id (or set model.policy)"
        )
    path = OmegaConf.select(cfg, "data.validation.path")
    if path is None and cfg.get("bootstrap") is None:
        raise ConfigError("data.validation.path=None is not allowed: a hub id, a local file or a dataset dir")
    if path is not None and looks_local(path) and not Path(path).exists():
        raise ConfigError(f"data.validation.path={path!r} does not exist: give an existing file or dir, or a hub id")
    validate_judge_config(cfg)
