"""Building a run's pieces from a checked config, shared by the entry points (rloo.train, rloo.evaluate) and the
benchmark worker: model and data locations, Lightning's precision arguments, the number of processes, and the
LightningModule of the chosen algorithm."""

from __future__ import annotations

import logging
import os
import warnings
from datetime import timedelta
from functools import partial

from omegaconf import DictConfig, OmegaConf

from rloo.algorithms.registry import ALGORITHMS
from rloo.config.checks import algorithm_config, autocast_dtype
from rloo.utils.errors import ConfigError


def resolve_sources(cfg: DictConfig, log=print) -> tuple[dict, dict, dict]:
    """Model and data locations, with the embedded task's bootstrap filling whatever is null."""
    model = OmegaConf.to_container(cfg.model, resolve=True)
    data = OmegaConf.to_container(cfg.data, resolve=True)
    report: dict = {}
    if cfg.get("bootstrap") is not None:
        from rloo.toy.bootstrap import ensure_artifacts

        artifacts = ensure_artifacts(OmegaConf.to_container(cfg.bootstrap, resolve=True), cfg.paths.cache_dir, log=log)
        model["policy"] = model["policy"] or artifacts.policy
        model["reward_model"] = model["reward_model"] or artifacts.reward_model
        model["tokenizer"] = model["tokenizer"] or artifacts.tokenizer
        data["train"]["path"] = data["train"]["path"] or artifacts.data["train"]
        data["validation"]["path"] = data["validation"]["path"] or artifacts.data["validation"]
        report = {"dir": str(artifacts.root), **artifacts.report}
    from rloo.models.packaged import converted_dir, is_packaged

    for key in ("policy", "reference", "tokenizer"):  # package:<module>/<file>: a plain directory in the cache
        if is_packaged(model[key]):
            model[key] = converted_dir(model[key], cfg.paths.cache_dir, log=log)
    model["tokenizer"] = model["tokenizer"] or model["policy"]
    return model, data, report


# Other packages' warnings that rloo's own calls cannot avoid, each filtered by its exact text, here only; never one of
# rloo's own. (What rloo's calls caused is fixed at the call: fit's checkpoint hints, W&B's `anonymous` setting.)
THIRD_PARTY_WARNINGS = (
    # Lightning's pytree helper builds torch's LeafSpec, which torch 2.13 deprecates (lightning/pytorch/utilities/
    # _pytree.py): nothing a caller of Lightning can change
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # Lightning's advice to train modules in train mode: the policy, reference and reward model stay in eval mode on
    # purpose (no dropout in sampling, scoring or the loss)
    r".*module\(s\) in eval mode",
    # DeepSpeed's ZeRO calls torch's collectives by the names torch 2.13 deprecates (all_gather_into_tensor,
    # reduce_scatter_tensor): nothing a caller of DeepSpeed can change
    r"`torch.distributed.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
)


def name_deepspeed_accelerator() -> None:
    """Where DeepSpeed is installed, transformers imports it as it loads a model, and DeepSpeed then warns that it
    found no GPU and falls back to its CPU accelerator. On a machine without CUDA that is the only choice: it is named
    (DS_ACCELERATOR=cpu, unless one is set), and nothing is warned."""
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


LIGHTNING_NOISE = (
    "litlogger",  # advertising
    "GPU available:",  # the device lines: rloo's own lines name the device each fast path runs on
    "TPU available:",
    "HPU available:",
    "IPU available:",
    "to estimate number of stepping batches",  # Lightning reads the loader's length: nothing to act on
    "`Trainer.fit` stopped:",  # rloo's own lines say how many rollouts ran and why a run stopped
)


def quiet_lightning_logs() -> None:
    """One copy of each Lightning message (Hydra's handler prints it), no advertising or device lines
    (LIGHTNING_NOISE), and THIRD_PARTY_WARNINGS filtered."""
    name_deepspeed_accelerator()
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    for message in THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
    import datasets
    import transformers

    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars, one per model
    datasets.disable_progress_bars()  # "Generating train split" bars, one per data file read
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(
            lambda record: not any(noise in record.getMessage() for noise in LIGHTNING_NOISE)
        )


def precision_arguments(precision: str, accelerator: str, fabric: bool = False) -> dict:
    """Trainer (or Fabric) arguments for `precision`. Lightning turns 16-mixed on CPU into bf16-mixed
    without asking; fp16 with loss scaling is the alternative to bf16 worth comparing, so on CPU it gets a
    real fp16 autocast plugin with a loss scaler."""
    if precision == "16-mixed" and accelerator == "cpu":
        import torch

        if fabric:
            from lightning.fabric.plugins.precision import MixedPrecision
        else:
            from lightning.pytorch.plugins.precision import MixedPrecision
        return {"plugins": [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))]}
    return {"precision": precision}


def policy_and_reference(cfg: DictConfig, policy, reference_path: str | None):
    """The policy as trained (its fp32 LM head, LoRA adapters) and its frozen reference: a stored copy of the initial
    policy or of `reference_path`, or None with LoRA and no reference path, where the reference is the policy's
    base with its adapters switched off (rloo.models.lora)."""
    from rloo.models.loading import reference_from, use_fp32_lm_head
    from rloo.models.lora import add_adapters, resolve_targets

    if cfg.fp32_lm_head:
        use_fp32_lm_head(policy)
    reference = (
        None
        if cfg.model.lora and reference_path is None
        else reference_from(policy, reference_path, cfg.model.frozen_dtype, autocast_dtype(cfg.precision.trainer))
    )
    if cfg.model.lora:
        targets = resolve_targets(cfg.lora.target_modules, policy.config)
        add_adapters(policy, cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, targets)
    return policy, reference


def check_lora_targets(cfg: DictConfig, policy_path: str) -> None:
    """model.lora=true: the targets match layers of the policy, checked on its config.json and an empty (meta)
    model, before any weight loads; one line naming the layers there are where none match."""
    if not cfg.model.lora:
        return
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from rloo.models.lora import resolve_targets, unmatched_targets

    config = AutoConfig.from_pretrained(policy_path)
    with torch.device("meta"):
        names = [
            name
            for name, module in AutoModelForCausalLM.from_config(config).named_modules()
            if isinstance(module, torch.nn.Linear)
        ]
    targets = resolve_targets(cfg.lora.target_modules, config)
    if missing := unmatched_targets(targets, names):
        layer_names = sorted({name.rsplit(".", 1)[-1] for name in names})
        raise ConfigError(
            f"lora.target_modules: {', '.join(missing)} name no layer of this {config.model_type} policy; its linear "
            f"layers are {', '.join(layer_names)} (or use auto | all-linear)"
        )


def lightning_strategy(cfg: DictConfig, trainer_args: dict, processes: int):
    """trainer.strategy as the Trainer takes it. Built here:
    - fsdp2: Lightning's ModelParallelStrategy, data parallel over all `processes` (the module shards the policy in
      configure_model), saving whole checkpoints through the run's atomic checkpoint writer;
    - deepspeed_*: Lightning's DeepSpeedStrategy of that name, with deepspeed_settings(cfg) in its config (DeepSpeed
      clips inside its own step; the Trainer's clipping cannot reach it under manual optimisation); on CPU
      processes the same strategy allowed there (rloo.run.deepspeed_cpu);
    - any other strategy Lightning registers (ddp, ddp_spawn, fsdp, ...; auto over several processes is Lightning's
      ddp).
    Each with the run's start-up bound (trainer.startup_timeout_s) as its process group's timeout; the bound on a
    rank that hangs mid-run (trainer.collective_timeout_s) replaces it once every rank has joined.
    A strategy given as an object goes to Lightning as it is."""
    strategy = trainer_args.get("strategy", "auto")
    if not isinstance(strategy, str) or (processes < 2 and not strategy.startswith("deepspeed")):
        return strategy  # one process: no collective to time (DeepSpeed on one still takes rloo's settings)
    # the process group's bound at start-up, while every rank loads its models and joins; once all have joined,
    # the groups take trainer.collective_timeout_s (rloo.run.callbacks.CollectiveTimeout)
    timeout = {"timeout": timedelta(seconds=float(cfg.trainer.startup_timeout_s))}
    if strategy == "fsdp2":
        from lightning.pytorch.strategies import ModelParallelStrategy

        return ModelParallelStrategy(
            data_parallel_size=processes, tensor_parallel_size=1, save_distributed_checkpoint=False, **timeout
        )
    from lightning.pytorch.strategies import StrategyRegistry

    name = "ddp" if strategy == "auto" else strategy  # Lightning's choice for several processes outside a notebook
    if name not in StrategyRegistry:
        return strategy  # Lightning names what it does not know
    entry = StrategyRegistry[name]
    strategy_class = entry["strategy"]
    if name.startswith("deepspeed") and cfg.trainer.accelerator == "cpu":  # on CPU processes, over gloo
        from rloo.run.deepspeed_cpu import CPUDeepSpeedStrategy

        os.environ["DS_ACCELERATOR"] = "cpu"  # before DeepSpeed is imported, here and in the ranks launched
        strategy_class = CPUDeepSpeedStrategy
    built = strategy_class(**entry["init_params"], **timeout)
    if name.startswith("deepspeed"):
        built.config.update(deepspeed_settings(cfg))
    return built


def deepspeed_settings(cfg: DictConfig) -> dict:
    """What a DeepSpeed engine must know of the run: the gradient norm it clips to (max_grad_norm; 0 turns clipping
    off) and the micro-batch each backward sees. Gradient accumulation is not counted by DeepSpeed: the module marks
    the last micro-batch of each mini-batch as the boundary (OnlineRLModule.accumulate_gradients)."""
    return {
        "gradient_clipping": float(cfg.max_grad_norm) if cfg.max_grad_norm is not None else 0.0,
        "train_micro_batch_size_per_gpu": int(cfg.micro_batch_size),
    }


def build_module(
    cfg: DictConfig,
    policy,
    reference,
    reward_model,
    tokenizer,
    total_rollouts: int,
    value_model,
    reward=None,
    environment=None,
):
    """The LightningModule of `cfg.algorithm` (rloo/algorithms/registry.py; `value_model`: a loader, called for an
    algorithm that trains one), scoring with `reward` (reward_from_config(cfg): None where the reward model alone
    scores), its episodes in `environment` (environment_from_config(cfg); None: plain completions)."""
    spec = ALGORITHMS[cfg.algorithm]
    module_class, _ = spec.load()
    models = (policy, reference, reward_model) + ((value_model(),) if spec.value_model else ())
    module = module_class(*models, tokenizer, algorithm_config(cfg, total_rollouts))
    service = module.episode_service  # what the module's rollouts are sampled and scored with
    service.reward, service.environment = reward, environment
    service.external_rollout = external_rollout_from_config(cfg)
    if getattr(module.config, "producer_process", False):  # the same parts are built again in the producer process
        module.producer_parts = partial(service_parts, OmegaConf.to_container(cfg, resolve=True))
        module.producer_threads = split_threads(cfg)
    if cfg.activation_checkpointing:  # after the module put the policy in eval mode
        from rloo.models.loading import use_activation_checkpointing

        use_activation_checkpointing(module.policy)
    elif cfg.mlp_recompute:
        from rloo.models.mlp_recompute import recompute_mlp_activations

        module.policy.rloo_activations = recompute_mlp_activations(module.policy)  # read by fast_paths
    return module


def service_parts(cfg: dict, tokenizer) -> tuple:
    """The episode service's reward functions, environment and external rollout of a resolved config, as the
    producer process builds them (rloo.service.producer)."""
    cfg = OmegaConf.create(cfg)
    return reward_from_config(cfg), environment_from_config(cfg, tokenizer), external_rollout_from_config(cfg)


def split_threads(cfg: DictConfig) -> int:
    """The producer process's torch threads (producer_threads; null: half the cores); the learner keeps the rest
    where trainer.num_threads does not say."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    producer = cfg.producer_threads or max(1, cores // 2)
    if not cfg.trainer.num_threads:
        torch.set_num_threads(max(1, cores - producer))
    return producer


def environment_from_config(cfg: DictConfig, tokenizer=None):
    """`env=` as an EnvironmentSpec (rloo.environments.base), or None for single-turn completions. The environment is
    Hydra's to build: `env.environment` instantiated as a `_partial_` factory, one instance per episode. A class
    written for TRL's environment_factory (reset and tool methods, no step) or FunctionTools (tools=[...]) runs
    through rloo's tool-calling adapter (rloo.environments.tools), its tools' schemas shown in the chat prompts."""
    env = cfg.get("env")
    if not env:
        return None
    from hydra.utils import instantiate

    from rloo.environments.base import EnvironmentSpec, environment_class
    from rloo.environments.tools import ToolCalling, is_tool_environment, tool_schemas
    from rloo.generation.settings import EpisodeSettings

    target = env.environment._target_
    made = instantiate(env.environment, _partial_=True)
    tools = None
    if is_tool_environment(environment_class(target)):
        probe = made()  # one instance, for its tools' schemas
        tools = tool_schemas(probe)
        close = getattr(probe, "close", None)
        if callable(close):
            close()

        def factory(made=made):
            return ToolCalling(made(), tokenizer)
    else:
        factory = made
    episode = EpisodeSettings(env.max_turns, env.max_episode_tokens, env.reply_role)
    return EnvironmentSpec(target, factory, env.timeout_s, episode, tools=tools)


def external_rollout_from_config(cfg: DictConfig):
    """rollout=module:function as the module's sampler: the function called on each rollout's prompts, its output
    checked and made the engine's record (rloo.generation.external); None where the policy samples."""
    if cfg.get("rollout") is None:
        return None
    from rloo.generation.external import sampled_from_external
    from rloo.rewards.scoring import load_function

    function, name = load_function(str(cfg.rollout), "rollout"), str(cfg.rollout)

    def external(prompts: list, module):
        tokenizer, device = module.tokenizer, module.device
        output = function(prompts, module)
        return sampled_from_external(output, len(prompts), tokenizer.eos_token_id, tokenizer.pad_token_id, device, name)

    return external


def reward_from_config(cfg: DictConfig):
    """`reward=` as a Reward, or None when it is the reward model alone (scored inside the rollout, as always)."""
    from rloo.rewards.scoring import MODEL, Reward, RewardTerm, parse_reward

    terms = parse_reward(cfg.get("reward", MODEL))
    return None if terms == [RewardTerm(1.0, MODEL)] else Reward(terms, cfg.reward_errors, cfg.reward_timeout_s)
