"""The memory plan of a training config, before anything loads: each model's weights, gradients, AdamW state, one
micro-batch's activations, the LM head's logit chunks and the rollout's KV cache (and, float32 on CPU, the decode's
reordered weights), per device, from the config and the policy's architecture alone. `python -m rloo.plan` prints
it; rloo.train writes its peak into summary.json beside the measured one. An estimate: allocator overhead and
framework buffers come on top (on CPU, a few hundred MiB).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from rloo.config.checks import SHARDED_STRATEGIES, autocast_dtype, world_size
from rloo.families import architecture_from_config, family_named, gpt_neox, known_model_types, llama
from rloo.families.base import Architecture
from rloo.generation.fast_paths import GATHERING_STRATEGIES
from rloo.generation.forward import LOGIT_CHUNK_ELEMENTS

MIB = 2**20
SHARD_STATE = ("deepspeed_stage_2", "deepspeed_stage_2_offload")  # gradients and AdamW state only
# ZeRO-3 partitions every module of the engine's model, the LightningModule: the frozen reference and reward model
# too. Its working buffers, at Lightning's DeepSpeedStrategy settings (reduce_bucket_size 2e8 elements) and
# DeepSpeed's own (stage3_prefetch_bucket_size 5e7): the parameters of the module being gathered, those prefetched
# for the next, and the gradient bucket being reduced.
ZERO3 = ("deepspeed_stage_3", "deepspeed_stage_3_offload")
ZERO3_PREFETCH_ELEMENTS = 50_000_000
ZERO3_REDUCE_BUCKET_ELEMENTS = 200_000_000


# Pythia sizes (Biderman et al. 2023): vocabulary (padded), hidden, layers, MLP width
PYTHIA = {
    "70m": (50304, 512, 6, 2048),
    "160m": (50304, 768, 12, 3072),
    "410m": (50304, 1024, 24, 4096),
    "1b": (50304, 2048, 16, 8192),
    "1.4b": (50304, 2048, 24, 8192),
    "2.8b": (50304, 2560, 32, 10240),
    "6.9b": (50432, 4096, 32, 16384),
    "12b": (50688, 5120, 36, 20480),
}


def _hf_config(policy: str) -> dict | None:
    """The policy's config as a dict, read without loading weights: a local dir's config.json, a packaged GGUF
    file's metadata, or a hub id already in the local cache (no download); None where there is none."""
    from rloo.models.packaged import is_packaged, packaged_file

    if is_packaged(policy):
        from transformers import AutoConfig

        source = packaged_file(policy)
        return AutoConfig.from_pretrained(source.parent, gguf_file=source.name).to_dict()
    config = Path(policy).expanduser() / "config.json"
    if config.is_file():
        return json.loads(config.read_text())
    if not policy.startswith((".", "/", "~")):
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(policy, "config.json")
        except Exception:  # not a repo id
            cached = None
        if isinstance(cached, str):
            return json.loads(Path(cached).read_text())
    return None


def _pythia(vocab_size: int, hidden_size: int, num_layers: int, intermediate_size: int, heads: int = 0):
    """A GPT-NeoX layout from its sizes alone (no config.json to plan from)."""
    values = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        intermediate_size=intermediate_size,
        num_attention_heads=heads,
    )
    return replace(gpt_neox.architecture(values), config=None)


def architecture_of(policy: str | None, bootstrap: dict | None) -> Architecture:
    """From the policy's config (local dir, packaged file, hub cache), read by its family (rloo/families/), a
    Pythia size in a hub id, or the embedded task's bootstrap settings."""
    if policy is None:
        if bootstrap is None:
            raise ValueError("model.policy is null and there is no bootstrap: no architecture to plan for")
        arch = bootstrap["architecture"]
        sizes = (arch["hidden_size"], arch["num_layers"], arch["intermediate_size"], arch.get("num_heads", 0))
        return _pythia(bootstrap["tokenizer"]["vocab_size"], *sizes)
    values = _hf_config(str(policy))
    if values is not None:
        # a model_type of no family: planned with the Llama layout (warnings_for says so)
        return architecture_from_config(values) or llama.architecture(_standard_sizes(values))
    size = re.search(r"pythia-(\d+(?:\.\d+)?[mb])", policy.lower())
    if size and size.group(1) in PYTHIA:
        return _pythia(*PYTHIA[size.group(1)])
    raise ValueError(
        f"model.policy={policy!r}: no local config.json and not a known Pythia size; "
        "give a local save_pretrained dir to plan for it"
    )


def _config_object(values: dict):
    """The transformers config (its model_type's own class) of a config.json's values."""
    from transformers import AutoConfig

    skip = ("model_type", "transformers_version", "architectures", "quantization_config")
    return AutoConfig.for_model(values["model_type"], **{k: v for k, v in values.items() if k not in skip})


def _standard_sizes(values: dict) -> dict:
    """config.json of a model_type of no family, with the sizes under transformers' standard names (GPT-2 writes its
    hidden size as n_embd), read through the model's own config class; its MLP is taken as 4 x hidden where it
    names no width."""
    config = _config_object(values)
    hidden = config.hidden_size
    inner = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    sizes = ("vocab_size", "num_hidden_layers", "num_attention_heads")
    return (
        values | {name: getattr(config, name) for name in sizes} | {"hidden_size": hidden, "intermediate_size": inner}
    )


def warnings_for(arch: Architecture) -> list[str]:
    if family_named(arch.model_type) is not None:
        return []
    return [
        f"warning: model_type {arch.model_type!r} is not one this plan knows ({known_model_types()}); planned "
        "with the Llama layout from its config.json (q/k/v/o, SwiGLU, RMSNorm): treat the figures as rough"
    ]


@dataclass(frozen=True)
class Shape:
    """What sets the memory besides the architecture."""

    precision: str  # Lightning precision: 32-true | bf16-mixed | bf16-true | 16-mixed
    frozen_dtype: str  # float32 | bfloat16 | float16
    strategy: str
    world_size: int
    lora: bool
    lora_r: int
    lora_targets: tuple[str, ...]
    separate_reference: bool  # model.reference given, or no LoRA: a second copy of the weights
    has_reward_model: bool
    k: int
    micro_batch_size: int  # completions per forward/backward in the update
    generation_batch_size: int  # completions per generate call and rollout-time forward
    prompt_length: int
    response_length: int
    shared_prefix: bool  # the shared-prefix forward runs (rloo.generation.fast_paths says so for the real model)
    activation_checkpointing: bool = False
    mlp_recompute: bool = False  # the MLPs' activations are recomputed in the backward (rloo.models.mlp_recompute)
    sampler: str = "lean_decode"  # lean_decode | hf_generate (which keeps every step's logits, [B, T, V])
    # bytes per element of the lean decode's copy of the linear weights: 4 (float32, reordered for oneDNN on CPU),
    # 2 (rollout_precision=bf16), 0 (none: it reads the model's own)
    decode_weight_copy: int = 0
    decode_graph: bool = False  # the lean decode's steps as CUDA graphs (rloo.generation.static_decode), on GPUs
    # a producer process beside the learner (max_staleness, producer=process): its max_staleness + 1 shared copies of
    # the policy (rloo.service.weights), and its rollout running while the learner updates
    producer_copies: int = 0


def _bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def estimate(arch: Architecture, shape: Shape) -> dict[str, float]:
    """MiB per device, by item; `peak` is the static state plus the larger of the rollout's and the update's."""
    weight = 2 if shape.precision == "bf16-true" else 4  # policy weights, gradients, AdamW state
    compute = 4 if shape.precision == "32-true" else 2  # activations and KV cache
    linear, rest = arch.body_params()
    head = arch.head_params()
    policy_params = linear + rest + head
    adapters = (
        sum(
            shape.lora_r * (n_in + n_out)
            for name, (n_in, n_out, _) in arch.linear_shapes.items()
            if name in shape.lora_targets
        )
        * arch.num_layers
        if shape.lora
        else 0
    )
    trained = adapters if shape.lora else policy_params

    frozen = _bytes(shape.frozen_dtype)
    autocast = autocast_dtype(shape.precision)
    if not shape.separate_reference:
        reference = 0
    elif shape.frozen_dtype == autocast:  # rloo.models.loading.store_frozen: linear layers cast, the rest float32
        reference = (linear + head) * frozen + rest * 4
    else:
        reference = policy_params * frozen
    reward = (linear + rest + arch.hidden_size) * frozen if shape.has_reward_model else 0

    world = max(shape.world_size, 1)
    shard_weights = world if shape.strategy in SHARDED_STRATEGIES else 1  # weights, gradients and AdamW state
    shard_state = world if shape.strategy in SHARDED_STRATEGIES + SHARD_STATE else 1
    shard_frozen = world if shape.strategy in ZERO3 else 1  # rloo's FSDP2 shards the policy alone
    items = {
        "policy weights": policy_params * weight / (1 if shape.lora else shard_weights) + adapters * weight,
        "reference weights": reference / shard_frozen,
        "reward model weights": reward / shard_frozen,
        "gradients": trained * weight / shard_state,
        "AdamW state": 2 * trained * weight / shard_state,
    }
    # the update: one micro-batch's forward kept for its backward; per token and block the inputs of the norms,
    # qkv, attention output, MLP input, its two wide activations and the residual (about 10 D + 2 I values)
    rows, prompt, response = shape.micro_batch_size, shape.prompt_length, shape.response_length
    groups = max(rows // shape.k, 1)
    packs = shape.shared_prefix and rows >= shape.k  # a micro-batch of fewer rows than k holds no whole group
    tokens = groups * (prompt + shape.k * response) if packs else rows * (prompt + response)
    per_token = arch.saved_per_token(shape.mlp_recompute) * compute
    if shape.activation_checkpointing:  # each block's input is kept; one block's activations live at a time
        items["activations"] = tokens * arch.hidden_size * compute * arch.num_layers + tokens * per_token
    else:
        items["activations"] = tokens * per_token * arch.num_layers
    # the LM head: a chunk of float32 logits, its softmax-gradient and the head's weight gradient before it is added
    chunk = min(LOGIT_CHUNK_ELEMENTS, rows * response * arch.vocab_size)
    embedding_gradient = arch.vocab_size * arch.hidden_size * 4  # the head's (or, tied, the embedding's)
    items["logit chunks"] = 2 * chunk * 4 + (embedding_gradient if not shape.lora else 0)
    if shape.strategy in SHARDED_STRATEGIES:  # partitioned weights: the model's own forward, every logit at once
        items["logit chunks"] = 3 * rows * (response + 1) * arch.vocab_size * 4  # logits, log-softmax, its gradient
    # the rollout: the decode's cache, k|v per layer for every row over prompt + response; HF generate also keeps
    # each step's logits [B, V] (stacked, cast to float32, divided by the temperature and log-softmaxed after)
    batch = shape.generation_batch_size
    cache = batch * (prompt + response) * arch.num_layers * arch.kv_width * compute
    if shape.sampler == "hf_generate":
        cache += 4 * batch * response * arch.vocab_size * 4
    items["KV cache"] = cache
    if shape.decode_weight_copy:  # rloo.generation.decode._linear: every linear weight and the head, while sampling
        items["decode weights"] = (linear + arch.vocab_size * arch.hidden_size) * shape.decode_weight_copy
    if shape.sampler == "lean_decode" and shape.strategy in GATHERING_STRATEGIES and world > 1:
        # rloo.models.sharding.whole_weights: the partitioned policy gathered whole on each rank for the rollout
        items["gathered policy"] = policy_params * weight
    if shape.producer_copies:
        items["producer policy copies"] = shape.producer_copies * policy_params * weight
    if shape.decode_graph:  # the graphs' memory pool: one step's buffers at the largest bucket, kept between replays
        step_values = arch.vocab_size + 8 * arch.hidden_size + 2 * arch.intermediate_size + arch.kv_width
        scores = 3 * arch.heads * (prompt + response) * 4  # float32 scores, probabilities and their copy, per row
        items["decode graph pool"] = batch * (step_values * compute + scores)
    if shape.strategy in ZERO3:  # the largest module gathered whole (a block, or the embedding), the next prefetched
        gathered = max(arch.block_linear_params(), arch.vocab_size * arch.hidden_size) + ZERO3_PREFETCH_ELEMENTS
        items["ZeRO-3 buffers"] = (gathered + ZERO3_REDUCE_BUCKET_ELEMENTS) * compute  # in the compute dtype
    mib = {key: value / MIB for key, value in items.items()}
    static = sum(
        mib.get(key, 0.0)
        for key in ("policy weights", "reference weights", "reward model weights", "AdamW state", "ZeRO-3 buffers")
    )
    update = mib["gradients"] + mib["activations"] + mib["logit chunks"]
    rollout = sum(mib.get(key, 0.0) for key in ("KV cache", "decode weights", "decode graph pool", "gathered policy"))
    if shape.producer_copies:  # the producer samples while the learner updates: both at once, on one host
        mib["peak"] = static + mib["producer policy copies"] + update + rollout
    else:
        mib["peak"] = static + max(update, rollout)
    return mib


def lora_targets(cfg, arch: Architecture) -> list[str]:
    """The layers LoRA adapts, by the model's own names (auto: the family's projections; all-linear: every one)."""
    from rloo.models.lora import resolve_targets

    targets = resolve_targets(cfg.lora.target_modules, arch.config or {"model_type": arch.model_type})
    return list(arch.linear_shapes) if isinstance(targets, str) else targets


def planned_fast_paths(cfg, arch: Architecture) -> dict[str, tuple[str, str]]:
    """The sampler and forwards rloo.train will run, each with why: rloo.generation.fast_paths itself, asked about an
    empty (meta-device) model built from the policy's config, so the plan and the run decide alike."""
    import torch
    from transformers import AutoModelForCausalLM, GPTNeoXConfig

    from rloo.generation.fast_paths import fast_paths

    try:
        if arch.config is not None:
            config = _config_object(arch.config)
        else:
            config = GPTNeoXConfig(
                vocab_size=arch.vocab_size,
                hidden_size=arch.hidden_size,
                num_hidden_layers=arch.num_layers,
                num_attention_heads=arch.heads,
                intermediate_size=arch.intermediate_size,
            )
        with torch.device("meta"):
            policy = AutoModelForCausalLM.from_config(config)
    except Exception as error:  # a model_type this transformers does not know
        why = f"model_type {arch.model_type!r} could not be built here ({type(error).__name__})"
        return {"sampler": ("hf_generate", why), "policy_forward": ("plain", why)}
    if cfg.model.lora:  # the run's policy carries its adapters: ask about that model
        from rloo.models.lora import add_adapters

        with torch.device("meta"):
            add_adapters(policy, cfg.lora.r, cfg.lora.alpha, cfg.lora.dropout, lora_targets(cfg, arch))
    return fast_paths(cfg, policy, None)


def shape_from_config(cfg, arch: Architecture, paths: dict[str, tuple[str, str]] | None = None) -> Shape:
    from rloo.generation.fast_paths import decode_replays_graphs
    from rloo.rewards.scoring import MODEL, parse_reward
    from rloo.utils.keys import settings

    paths = paths if paths is not None else planned_fast_paths(cfg, arch)
    trainer = dict(cfg.trainer)
    return settings(  # k, micro_batch_size, generation_batch_size, response_length, activation_checkpointing: by name
        Shape,
        cfg,
        precision=str(cfg.precision.trainer),
        frozen_dtype=str(cfg.model.frozen_dtype),
        strategy=str(trainer.get("strategy", "auto")),
        world_size=world_size(trainer),
        lora=bool(cfg.model.lora),
        lora_r=int(cfg.lora.r),
        lora_targets=tuple(lora_targets(cfg, arch)),
        separate_reference=not cfg.model.lora or cfg.model.reference is not None,
        has_reward_model=any(term.name == MODEL for term in parse_reward(str(cfg.reward))),
        prompt_length=int(cfg.data.max_prompt_length),
        # a multi-turn episode: every token after the prompt, the environment's replies too (the forwards see them)
        response_length=int(cfg.env.max_episode_tokens) if cfg.get("env") else int(cfg.response_length),
        shared_prefix=paths["policy_forward"][0] == "shared_prefix",
        mlp_recompute=paths.get("policy_activations", ("kept", ""))[0] == "mlp_recompute",
        sampler=paths["sampler"][0],
        decode_weight_copy=decode_copy_bytes(cfg) if paths["sampler"][0] == "lean_decode" else 0,
        decode_graph=paths["sampler"][0] == "lean_decode" and decode_replays_graphs(cfg),
        producer_copies=producer_copies(cfg),
    )


def producer_copies(cfg) -> int:
    """The policy copies a producer process holds under `cfg` (0: rollouts sampled inline)."""
    from rloo.algorithms.configs import produced_in_a_process

    if cfg.get("producer") is None or not produced_in_a_process(cfg):
        return 0
    return int(cfg.max_staleness) + 1


def decode_copy_bytes(cfg) -> int:
    """Bytes per element of the lean decode's weight copy under `cfg` (Shape.decode_weight_copy)."""
    from rloo.generation.fast_paths import decode_reorders_weights

    if cfg.get("rollout_precision") == "bf16":
        return 2
    return 4 if decode_reorders_weights(cfg) else 0


def plan_config(cfg, policy: str | None = None) -> tuple[Architecture, Shape, dict[str, float], dict]:
    """Everything the plan says of a composed training config: the architecture, the shape, MiB by item, and the
    sampler and forwards that will run. `policy`: where the policy's config is, when known better than the config
    says (rloo.train passes the bootstrap's or the converted package's directory)."""
    from omegaconf import OmegaConf

    bootstrap = OmegaConf.to_container(cfg.bootstrap, resolve=True) if cfg.get("bootstrap") is not None else None
    arch = architecture_of(policy or cfg.model.policy, bootstrap)
    paths = planned_fast_paths(cfg, arch)
    shape = shape_from_config(cfg, arch, paths)
    return arch, shape, estimate(arch, shape), paths


def planned_peak(cfg, policy: str | None = None) -> dict:
    """For a run's summary: the planned peak MiB, or why there is none (planning never stops a run)."""
    try:
        arch, _, mib, _ = plan_config(cfg, policy)
    except Exception as error:  # noqa: BLE001 (an estimate only)
        return {"planned_peak_mb": None, "why_no_plan": f"{type(error).__name__}: {error}"}
    return {"planned_peak_mb": round(mib["peak"], 1), "warnings": warnings_for(arch)}
