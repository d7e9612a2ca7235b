"""python -m rloo.plan <overrides>: the memory each device needs for a training config, before anything loads.

    python -m rloo.plan model=pythia1b precision=bf16               # the published 1B recipe, per GPU
    python -m rloo.plan model=pythia6.9b precision=bf16 --gpu-gib 80
    python -m rloo.plan model=pythia1b model.lora=true trainer.devices=1 trainer.strategy=auto

It reads only the config and the policy's architecture (a local config.json, a known Pythia size, or the embedded
task's bootstrap settings) and prints, per device: weights of each model, gradients, AdamW state, the activations
of one micro-batch's forward and backward, the decode's KV cache and the LM head's logit chunks, then the peak
and whether it fits. An estimate: allocator overhead and framework buffers come on top (on CPU, a few hundred MiB).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from rloo.assemble import autocast_dtype, world_size
from rloo.config import SHARDED_STRATEGIES
from rloo.forward import LOGIT_CHUNK_ELEMENTS

MIB = 2**20
SHARD_STATE = ("deepspeed_stage_2", "deepspeed_stage_2_offload")  # gradients and AdamW state only


@dataclass(frozen=True)
class Architecture:
    """A GPT-NeoX (Pythia) body: untied embedding and LM head."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    intermediate_size: int

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one block, by its GPT-NeoX name."""
        d, i = self.hidden_size, self.intermediate_size
        return {"query_key_value": (d, 3 * d), "dense": (d, d), "dense_h_to_4h": (d, i), "dense_4h_to_h": (i, d)}

    def block_linear_params(self) -> int:
        return sum(n_in * n_out + n_out for n_in, n_out in self.linear_shapes().values())

    def body_params(self) -> tuple[int, int]:
        """(linear-layer parameters, the rest: embedding and norms) of the transformer body."""
        d = self.hidden_size
        return self.num_layers * self.block_linear_params(), self.vocab_size * d + self.num_layers * 4 * d + 2 * d

    def head_params(self) -> int:
        return self.vocab_size * self.hidden_size


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


def architecture_of(policy: str | None, bootstrap: dict | None) -> Architecture:
    """From a local config.json, a Pythia size in a hub id, or the embedded task's bootstrap settings."""
    if policy is None:
        if bootstrap is None:
            raise ValueError("model.policy is null and there is no bootstrap: no architecture to plan for")
        arch = bootstrap["architecture"]
        return Architecture(
            bootstrap["tokenizer"]["vocab_size"], arch["hidden_size"], arch["num_layers"], arch["intermediate_size"]
        )
    config = Path(policy) / "config.json"
    if config.is_file():
        values = json.loads(config.read_text())
        return Architecture(
            values["vocab_size"], values["hidden_size"], values["num_hidden_layers"], values["intermediate_size"]
        )
    size = re.search(r"pythia-(\d+(?:\.\d+)?[mb])", policy.lower())
    if size and size.group(1) in PYTHIA:
        return Architecture(*PYTHIA[size.group(1)])
    raise ValueError(
        f"model.policy={policy!r}: no local config.json and not a known Pythia size; "
        "give a local save_pretrained dir to plan for it"
    )


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
    shared_prefix: bool
    activation_checkpointing: bool = False


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
            for name, (n_in, n_out) in arch.linear_shapes().items()
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
    elif shape.frozen_dtype == autocast:  # rloo.models.store_frozen: linear layers cast, the rest float32
        reference = (linear + head) * frozen + rest * 4
    else:
        reference = policy_params * frozen
    reward = (linear + rest + arch.hidden_size) * frozen if shape.has_reward_model else 0

    world = max(shape.world_size, 1)
    shard_weights = world if shape.strategy in SHARDED_STRATEGIES else 1  # weights, gradients and AdamW state
    shard_state = world if shape.strategy in SHARDED_STRATEGIES + SHARD_STATE else 1
    items = {
        "policy weights": policy_params * weight / (1 if shape.lora else shard_weights) + adapters * weight,
        "reference weights": reference,
        "reward model weights": reward,
        "gradients": trained * weight / shard_state,
        "AdamW state": 2 * trained * weight / shard_state,
    }
    # the update: one micro-batch's forward kept for its backward; per token and block the inputs of the norms,
    # qkv, attention output, MLP input, its two wide activations and the residual (about 10 D + 2 I values)
    rows, prompt, response = shape.micro_batch_size, shape.prompt_length, shape.response_length
    groups = max(rows // shape.k, 1)
    tokens = groups * (prompt + shape.k * response) if shape.shared_prefix else rows * (prompt + response)
    per_token = (10 * arch.hidden_size + 2 * arch.intermediate_size) * compute
    if shape.activation_checkpointing:  # each block's input is kept; one block's activations live at a time
        items["activations"] = tokens * arch.hidden_size * compute * arch.num_layers + tokens * per_token
    else:
        items["activations"] = tokens * per_token * arch.num_layers
    # the LM head: a chunk of float32 logits, its softmax-gradient and the head's weight gradient before it is added
    chunk = min(LOGIT_CHUNK_ELEMENTS, rows * response * arch.vocab_size)
    items["logit chunks"] = 2 * chunk * 4 + (head * 4 if not shape.lora else 0)
    if shape.strategy in SHARDED_STRATEGIES:  # partitioned weights: the model's own forward, every logit at once
        items["logit chunks"] = 3 * rows * (response + 1) * arch.vocab_size * 4  # logits, log-softmax, its gradient
    # the rollout: the decode's cache, k|v per layer for every row over prompt + response
    cache = shape.generation_batch_size * (prompt + response) * arch.num_layers * 2 * arch.hidden_size * compute
    items["KV cache"] = cache
    mib = {key: value / MIB for key, value in items.items()}
    static = sum(mib[key] for key in ("policy weights", "reference weights", "reward model weights", "AdamW state"))
    update = mib["gradients"] + mib["activations"] + mib["logit chunks"]
    mib["peak"] = static + max(update, mib["KV cache"])
    return mib


def lora_targets(cfg) -> list[str]:
    """The layers LoRA adapts, as the plan's GPT-NeoX layout names them (auto and all-linear: all four)."""
    from rloo.lora import TARGETS_BY_MODEL_TYPE, resolve_targets

    targets = resolve_targets(cfg.lora.target_modules, "gpt_neox")
    return list(TARGETS_BY_MODEL_TYPE["gpt_neox"]) if isinstance(targets, str) else targets


def shape_from_config(cfg) -> Shape:
    from rloo.scoring import MODEL, parse_reward

    trainer = dict(cfg.trainer)
    return Shape(
        precision=str(cfg.precision.trainer),
        frozen_dtype=str(cfg.model.frozen_dtype),
        strategy=str(trainer.get("strategy", "auto")),
        world_size=world_size(trainer),
        lora=bool(cfg.model.lora),
        lora_r=int(cfg.lora.r),
        lora_targets=tuple(lora_targets(cfg)),
        separate_reference=not cfg.model.lora or cfg.model.reference is not None,
        has_reward_model=any(term.name == MODEL for term in parse_reward(str(cfg.reward))),
        k=int(cfg.k),
        micro_batch_size=int(cfg.micro_batch_size),
        generation_batch_size=int(cfg.generation_batch_size),
        prompt_length=int(cfg.data.max_prompt_length),
        response_length=int(cfg.response_length),
        shared_prefix=bool(cfg.shared_prefix),
        activation_checkpointing=bool(cfg.activation_checkpointing),
    )


def render(arch: Architecture, shape: Shape, mib: dict[str, float], gpu_gib: float | None) -> str:
    lines = [
        f"memory plan per device: hidden {arch.hidden_size}, {arch.num_layers} layers, vocabulary "
        f"{arch.vocab_size}; {shape.precision}, strategy {shape.strategy} x {shape.world_size}"
        + (f", LoRA r={shape.lora_r}" if shape.lora else "")
        + (", activation checkpointing" if shape.activation_checkpointing else "")
    ]
    lines += [f"  {key:<22} {value:>10.0f} MiB" for key, value in mib.items() if key != "peak"]
    lines.append(f"  {'peak (estimate)':<22} {mib['peak']:>10.0f} MiB = {mib['peak'] / 1024:.1f} GiB")
    if gpu_gib is not None:
        verdict = "fits" if mib["peak"] <= gpu_gib * 1024 * 0.9 else "does not fit"
        lines.append(f"  {verdict} in {gpu_gib:g} GiB (keeping 10% for the CUDA context and fragmentation)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from omegaconf import OmegaConf

    from rloo.cli import OneLineParser, compose_train_config, hydra_argument_error
    from rloo.config import ConfigError, validate_train_config

    parser = OneLineParser(
        prog="python -m rloo.plan",
        description="Memory per device of a training config, before "
        "anything loads: python -m rloo.plan model=pythia1b precision=bf16 --gpu-gib 80",
    )
    parser.add_argument("overrides", nargs="*", help="rloo.train overrides (key=value, group=option)")
    parser.add_argument("--gpu-gib", type=float, default=None, help="GiB per device: say whether the plan fits")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    argv, gpu_gib = args.overrides, args.gpu_gib
    if (problem := hydra_argument_error(argv)) is not None:
        parser.error(problem)
    try:
        cfg = compose_train_config(argv + ["judge=none"])  # judging takes no training memory (nor an API key)
        validate_train_config(cfg, world_size=shape_from_config(cfg).world_size)
        bootstrap = OmegaConf.to_container(cfg.bootstrap, resolve=True) if cfg.get("bootstrap") is not None else None
        arch = architecture_of(cfg.model.policy, bootstrap)
    except (ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    shape = shape_from_config(cfg)
    print(render(arch, shape, estimate(arch, shape), gpu_gib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
