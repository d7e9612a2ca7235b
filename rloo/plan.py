"""python -m rloo.plan <overrides>: the memory each device needs for a training config, before anything loads.

    python -m rloo.plan model=pythia1b precision=bf16               # the published 1B recipe, per GPU
    python -m rloo.plan model=pythia6.9b precision=bf16 --gpu-gib 80
    python -m rloo.plan model=pythia1b model.lora=true trainer.devices=1 trainer.strategy=auto
    python -m rloo.plan experiment=arithmetic_smollm2                # a Llama-family model from its config

It reads only the config and the policy's architecture (rloo/run/memory_plan.py) and prints, per device: the sampler
and forwards the run will take, weights of each model, gradients, AdamW state, the activations of one micro-batch's
forward and backward, the decode's KV cache (float32 on CPU: and its reordered weights) and the LM head's logit
chunks, then the peak and whether it fits.
"""

from __future__ import annotations

import sys

from rloo.config.checks import world_size
from rloo.run.memory_plan import Architecture, Shape, plan_config, warnings_for


def render(
    arch: Architecture,
    shape: Shape,
    mib: dict[str, float],
    gpu_gib: float | None,
    paths: dict[str, tuple[str, str]] | None = None,
    episodes: str | None = None,
) -> str:
    gqa = (
        f", {arch.num_kv_heads} key/value heads of {arch.num_heads}"
        if arch.num_kv_heads not in (0, arch.num_heads)
        else ""
    )
    lines = warnings_for(arch) + [
        f"memory plan per device: {arch.model_type}, hidden {arch.hidden_size}, {arch.num_layers} layers{gqa}, "
        f"vocabulary {arch.vocab_size}{', tied head' if arch.tied_head else ''}; {shape.precision}, strategy "
        f"{shape.strategy} x {shape.world_size}"
        + (f", LoRA r={shape.lora_r} on {', '.join(shape.lora_targets)}" if shape.lora else "")
        + (", activation checkpointing" if shape.activation_checkpointing else "")
    ]
    if episodes:
        lines.append(f"  episodes: {episodes}")
    for name, (ran, why) in (paths or {}).items():
        lines.append(f"  {name.replace('_', ' ')}: {ran} ({why})")
    lines += [f"  {key:<22} {value:>10.0f} MiB" for key, value in mib.items() if key != "peak"]
    lines.append(f"  {'peak (estimate)':<22} {mib['peak']:>10.0f} MiB = {mib['peak'] / 1024:.1f} GiB")
    if gpu_gib is not None:
        gib, device = gpu_gib if isinstance(gpu_gib, tuple) else (gpu_gib, "--gpu-gib")
        verdict = "fits" if mib["peak"] <= gib * 1024 * 0.9 else "does not fit"
        lines.append(f"  {verdict} in {gib:.3g} GiB per device ({device}; 10% kept for the context and fragmentation)")
    return "\n".join(lines)


ASSUMED_GPU_GIB = 80  # an 80 GB A100 or H100: the card of the published TL;DR recipes


def device_memory(accelerator: str) -> tuple[float, str]:
    """GiB per device where --gpu-gib is not given: the GPU this machine has, else the card the recipes ran on for a
    GPU config; a CPU run's is this machine's memory."""
    import os

    if accelerator != "cpu":
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            return props.total_memory / 2**30, f"this machine's {props.name}"
        return (
            ASSUMED_GPU_GIB,
            f"no GPU here: assumed the recipes' {ASSUMED_GPU_GIB} GB A100/H100; --gpu-gib sets it",
        )
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return total, "trainer=cpu: this machine's memory"


def main(argv: list[str] | None = None) -> int:
    from rloo.config.checks import ConfigError, validate_train_config
    from rloo.run.cli import OneLineParser, compose_train_config
    from rloo.run.command_line import CommandLine

    parser = OneLineParser(
        prog="python -m rloo.plan",
        description="Memory per device of a training config, before "
        "anything loads: python -m rloo.plan model=pythia1b precision=bf16 --gpu-gib 80",
    )
    parser.add_argument("overrides", nargs="*", help="rloo.train overrides (key=value, group=option)")
    parser.add_argument(
        "--gpu-gib", type=float, default=None, help="GiB per device (default: the GPU here, else 80 for a GPU config)"
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    argv, gpu_gib = args.overrides, args.gpu_gib
    try:
        CommandLine.parse(argv)
    except ConfigError as problem:
        parser.error(str(problem))
    try:
        cfg = compose_train_config(argv + ["judge=none"])  # judging takes no training memory (nor an API key)
        validate_train_config(cfg, world_size=world_size(dict(cfg.trainer)))
        arch, shape, mib, paths = plan_config(cfg)
    except (ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    device = (gpu_gib, "--gpu-gib") if gpu_gib is not None else device_memory(str(cfg.trainer.accelerator))
    print(render(arch, shape, mib, device, paths, episodes_line(cfg)))
    return 0


def episodes_line(cfg) -> str | None:
    """What env= adds to every sequence, said beside the memory it takes (None without an environment)."""
    env = cfg.get("env")
    if not env:
        return None
    return (
        f"env={env.name}: up to {env.max_turns} turns and {env.max_episode_tokens} tokens after the prompt, the "
        f"model's turns (at most {cfg.response_length} tokens each) and the environment's replies; the update, the "
        "reference and the reward model run over whole episodes, so activations and the KV cache count "
        f"{env.max_episode_tokens} tokens where a single turn counts {cfg.response_length}"
    )


if __name__ == "__main__":
    sys.exit(main())
