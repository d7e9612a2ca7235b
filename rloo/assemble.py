"""Building a run's pieces from a checked config, shared by the entry points (rloo.train, rloo.evaluate) and the
benchmark worker: model and data locations, Lightning's precision arguments, the number of processes, and the
LightningModule of the chosen algorithm."""

from __future__ import annotations

import logging
import warnings

from omegaconf import DictConfig, OmegaConf

from rloo.algorithms.registry import ALGORITHMS
from rloo.config import algorithm_config
from rloo.errors import ConfigError


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
    from rloo.packaged import converted_dir, is_packaged

    for key in ("policy", "reference", "tokenizer"):  # package:<module>/<file>: a plain directory in the cache
        if is_packaged(model[key]):
            model[key] = converted_dir(model[key], cfg.paths.cache_dir, log=log)
    model["tokenizer"] = model["tokenizer"] or model["policy"]
    return model, data, report


def quiet_lightning_logs() -> None:
    """One copy of each Lightning message (Hydra's handler prints it), and no advertising."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    warnings.filterwarnings(
        "ignore", message=r".*module\(s\) in eval mode.*"
    )  # the three models stay in eval on purpose
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    import transformers

    transformers.utils.logging.disable_progress_bar()  # "Loading weights" bars, one per model
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(
        lambda record: "litlogger" not in record.getMessage()
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


AUTOCAST_DTYPES = {"bf16-mixed": "bfloat16", "16-mixed": "float16"}


def autocast_dtype(precision: str) -> str | None:
    """The dtype a Lightning precision autocasts compute to over float32 weights; None where it does not."""
    return AUTOCAST_DTYPES.get(str(precision))


def policy_and_reference(cfg: DictConfig, policy, reference_path: str | None):
    """The policy as trained (its fp32 LM head, LoRA adapters) and its frozen reference: a stored copy of the initial
    policy or of `reference_path`, or None with LoRA and no reference path, where the reference is the policy's
    base with its adapters switched off (rloo.lora)."""
    from rloo.lora import add_adapters, resolve_targets
    from rloo.models import reference_from, use_fp32_lm_head

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

    from rloo.lora import resolve_targets, unmatched_targets

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


def lightning_strategy(cfg: DictConfig, trainer_args: dict, processes: int):
    """trainer.strategy as the Trainer takes it. Built here:
    - fsdp2: Lightning's ModelParallelStrategy, data parallel over all `processes` (the module shards the policy in
      configure_model), saving whole checkpoints through the run's atomic checkpoint writer;
    - deepspeed_*: Lightning's DeepSpeedStrategy of that name, with deepspeed_settings(cfg) in its config (DeepSpeed
      clips inside its own step; the Trainer's clipping cannot reach it under manual optimisation).
    Other names go to Lightning as they are."""
    strategy = trainer_args.get("strategy", "auto")
    if strategy == "fsdp2":
        from lightning.pytorch.strategies import ModelParallelStrategy

        return ModelParallelStrategy(
            data_parallel_size=processes, tensor_parallel_size=1, save_distributed_checkpoint=False
        )
    if isinstance(strategy, str) and strategy.startswith("deepspeed"):
        from lightning.pytorch.strategies import StrategyRegistry

        entry = StrategyRegistry[strategy]
        built = entry["strategy"](**entry["init_params"])
        built.config.update(deepspeed_settings(cfg))
        return built
    return strategy


def deepspeed_settings(cfg: DictConfig) -> dict:
    """What a DeepSpeed engine must know of the run: the gradient norm it clips to (max_grad_norm; 0 turns clipping
    off) and the micro-batch each backward sees. Gradient accumulation is not counted by DeepSpeed: the module marks
    the last micro-batch of each mini-batch as the boundary (OnlineRLModule.accumulate_gradients)."""
    return {
        "gradient_clipping": float(cfg.max_grad_norm) if cfg.max_grad_norm is not None else 0.0,
        "train_micro_batch_size_per_gpu": int(cfg.micro_batch_size),
    }


def build_module(
    cfg: DictConfig, policy, reference, reward_model, tokenizer, total_rollouts: int, value_model, reward=None
):
    """The LightningModule of `cfg.algorithm` (rloo/algorithms/registry.py; `value_model`: a loader, called for an
    algorithm that trains one), scoring with `reward` (reward_from_config(cfg): None where the reward model alone
    scores)."""
    spec = ALGORITHMS[cfg.algorithm]
    module_class, _ = spec.load()
    models = (policy, reference, reward_model) + ((value_model(),) if spec.value_model else ())
    module = module_class(*models, tokenizer, algorithm_config(cfg, total_rollouts))
    module.reward = reward
    if cfg.activation_checkpointing:  # after the module put the policy in eval mode
        from rloo.models import use_activation_checkpointing

        use_activation_checkpointing(module.policy)
    elif cfg.mlp_recompute:
        from rloo.mlp_recompute import recompute_mlp_activations

        module.policy.rloo_activations = recompute_mlp_activations(module.policy)  # read by fast_paths
    return module


def decode_reorders_weights(cfg: DictConfig) -> bool:
    """Whether the lean decode runs its linear layers through oneDNN from reordered float32 weights
    (`rloo.decode._linear`): a 32-true run on CPU, with a torch that has oneDNN's product and reorder."""
    import torch

    from rloo.decode import onednn_applies

    float32_on_cpu = cfg.precision.trainer == "32-true" and cfg.trainer.accelerator == "cpu"
    return float32_on_cpu and onednn_applies(torch.empty(0))


def fast_paths(cfg: DictConfig, policy, reward_model) -> dict[str, tuple[str, str]]:
    """What samples and what runs the forward passes of this run, each with why: the lean decode or HF generate,
    the packed shared-prefix forward or the plain one (for the policy and reference, and for the reward model), and what
    the policy's backward keeps (rloo.mlp_recompute, or activation checkpointing). A fast path that cannot serve
    the model says so here; the run logs this and writes it to summary.json."""
    from rloo.decode import why_not_lean_decode
    from rloo.forward import packing_pays, why_not_shared_prefix

    if not cfg.lean_decode:
        sampler = ("hf_generate", "lean_decode=false")
    elif reason := why_not_lean_decode(policy, cfg.data.max_prompt_length + cfg.response_length):
        sampler = ("hf_generate", f"lean_decode=true, but the lean decode cannot serve this policy: {reason}")
    else:
        if decode_reorders_weights(cfg):
            products = "float32 linear layers through oneDNN, from weights reordered once per rollout"
        else:
            products = (
                f"linear layers through F.linear (oneDNN's reordered weights serve float32 on CPU only; this run is "
                f"{cfg.precision.trainer} on {cfg.trainer.accelerator})"
            )
        sampler = ("lean_decode", f"KV-cache loop that drops finished rows; {products}")

    def forward(model) -> tuple[str, str]:
        if not cfg.shared_prefix:
            return "plain", "shared_prefix=false"
        if cfg.k < 2:
            return "plain", f"k={cfg.k}: no completions share a prompt"
        if reason := why_not_shared_prefix(model, cfg.data.max_prompt_length + cfg.response_length):
            return "plain", f"shared_prefix=true, but the shared-prefix forward cannot serve this model: {reason}"
        prompt, response = cfg.data.max_prompt_length, cfg.response_length
        if not packing_pays(model, prompt, response, cfg.k):
            return "plain", (
                f"one packed row [prompt | {cfg.k} completions] costs more than {cfg.k} plain rows at P={prompt}, "
                f"T={response} (its attention grows as (P + kT)^2); a batch whose completions end early still packs"
            )
        return "shared_prefix", (
            f"each prompt once for its k={cfg.k} completions (a batch packs where that costs less than plain rows)"
        )

    def activations() -> tuple[str, str]:
        from rloo.mlp_recompute import why_not_recompute_mlp

        if cfg.activation_checkpointing:
            return "checkpointed", "activation_checkpointing=true: each block is recomputed whole in the backward"
        if not cfg.mlp_recompute:
            return "kept", "mlp_recompute=false"
        if installed := getattr(policy, "rloo_activations", None):  # what build_module did to this very policy
            return installed
        if reason := why_not_recompute_mlp(policy):
            return "kept", f"mlp_recompute=true, but {reason}"
        return "mlp_recompute", "the MLPs keep their up-projections; the activation is recomputed in the backward"

    paths = {"sampler": sampler, "policy_forward": forward(policy), "policy_activations": activations()}
    if reward_model is not None:
        paths["reward_forward"] = forward(reward_model)
    return paths


def reward_from_config(cfg: DictConfig):
    """`reward=` as a Reward, or None when it is the reward model alone (scored inside the rollout, as always)."""
    from rloo.scoring import MODEL, Reward, RewardTerm, parse_reward

    terms = parse_reward(cfg.get("reward", MODEL))
    return None if terms == [RewardTerm(1.0, MODEL)] else Reward(terms, cfg.reward_errors, cfg.reward_timeout_s)
