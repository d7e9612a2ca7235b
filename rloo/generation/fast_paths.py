"""Which sampler and forward passes a run takes, and why: the lean decode or HF generate, the shared-prefix forward or
the plain one, and what the policy's backward keeps. The run logs the answer and writes it to summary.json; the
memory plan (rloo.run.memory_plan) asks the same question of an empty model before anything loads, so the two never
disagree. Nothing switches off silently: each answer carries its reason.
"""

from __future__ import annotations

from omegaconf import DictConfig

# strategies whose partitioned policy the rollout gathers whole for the lean decode (rloo.models.sharding.whole_weights)
GATHERING_STRATEGIES = ("fsdp2", "deepspeed_stage_3", "deepspeed_stage_3_offload")


def decode_reorders_weights(cfg: DictConfig) -> bool:
    """Whether the lean decode runs its linear layers through oneDNN from reordered float32 weights
    (`rloo.generation.decode._linear`): a 32-true run on CPU, with a torch that has oneDNN's product and reorder."""
    import torch

    from rloo.generation.decode import onednn_applies

    float32_on_cpu = cfg.precision.trainer == "32-true" and cfg.trainer.accelerator == "cpu"
    return float32_on_cpu and onednn_applies(torch.empty(0))


def rollout_bf16_products(cfg: DictConfig) -> str:
    """How rollout_precision=bf16 runs the rollout's products, with why (the held-out evaluation stays float32)."""
    import torch

    from rloo.generation.decode import onednn_bf16_applies

    where = "linear layers and LM head from bfloat16 copies of the weights, made once per rollout"
    if cfg.trainer.accelerator != "cpu":
        return f"{where}, through F.linear; held-out evaluation in float32"
    if onednn_bf16_applies(torch.empty(0)):
        return f"{where} and reordered for oneDNN; held-out evaluation in float32"
    return (
        f"{where}, through F.linear (oneDNN has no bfloat16 kernels for this CPU: no AVX-512 BF16 or AMX); "
        "held-out evaluation in float32"
    )


def decode_copies_weights(policy, sampling) -> bool:
    """Whether the lean decode samples from its own copy of the policy's linear weights: bfloat16 copies
    (rollout_precision=bf16), or float32 weights reordered for oneDNN (on CPU)."""
    from rloo.generation.decode import onednn_applies

    return sampling.rollout_precision == "bf16" or onednn_applies(next(iter(policy.parameters())).detach())


def decode_replays_graphs(cfg: DictConfig) -> bool:
    """Whether the lean decode's steps run at static shapes, replayed as CUDA graphs (rloo.generation.static_decode)."""
    return bool(cfg.cuda_graph) and cfg.trainer.accelerator == "gpu"


def decode_steps(cfg: DictConfig) -> str:
    """How the lean decode steps (rloo.generation.static_decode where CUDA graphs serve, else the eager loop), with
    why."""
    if decode_replays_graphs(cfg):
        return "static-shape steps replayed as CUDA graphs (finished rows wait for a smaller row bucket)"
    eager = "eager steps that drop finished rows"
    if not cfg.cuda_graph:
        return f"{eager} (cuda_graph=false)"
    return f"{eager} (CUDA graphs need a GPU; this run is on {cfg.trainer.accelerator})"


def fast_paths(cfg: DictConfig, policy, reward_model) -> dict[str, tuple[str, str]]:
    """What samples and what runs the forward passes of this run, each with why: the lean decode or HF generate,
    the packed shared-prefix forward or the plain one (for the policy and reference, and for the reward model), and what
    the policy's backward keeps (rloo.models.mlp_recompute, or activation checkpointing). A fast path that cannot serve
    the model says so here; the run logs this and writes it to summary.json."""
    from rloo.generation.decode import why_not_lean_decode
    from rloo.generation.forward import packing_pays, why_not_shared_prefix

    env = cfg.get("env")
    length = cfg.data.max_prompt_length + (env.max_episode_tokens if env else cfg.response_length)
    episodes = "; each turn of an episode sampled from the whole episode so far, prefilled anew" if env else ""
    if not cfg.lean_decode:
        sampler = ("hf_generate", f"lean_decode=false{episodes}")
    elif reason := why_not_lean_decode(policy, length):
        sampler = ("hf_generate", f"lean_decode=true, but the lean decode cannot serve this policy: {reason}{episodes}")
    else:
        if cfg.get("rollout_precision") == "bf16":
            products = rollout_bf16_products(cfg)
        elif decode_reorders_weights(cfg):
            products = "float32 linear layers through oneDNN, from weights reordered once per rollout"
        else:
            products = (
                f"linear layers through F.linear (oneDNN's reordered weights serve float32 on CPU only; this run is "
                f"{cfg.precision.trainer} on {cfg.trainer.accelerator})"
            )
        sampler = ("lean_decode", f"KV-cache loop, {decode_steps(cfg)}; {products}")
        strategy = str(cfg.trainer.get("strategy", "auto"))
        gathered = (
            f"; under {strategy} the policy's weights gathered whole once per rollout for it, partitioned again "
            "before the update"
            if strategy in GATHERING_STRATEGIES
            else ""
        )
        if env:  # rloo.generation.lean_sampler: the turns of an episode continue its cache
            steps = "eager steps that drop finished rows"
            if decode_replays_graphs(cfg):
                steps += " (CUDA graphs serve plain completions only: an episode's rows differ in length)"
            sampler = (
                "lean_decode",
                f"KV-cache loop, one cache per episode continued across the environment's replies, {steps}; {products}",
            )
        sampler = (sampler[0], sampler[1] + gathered)

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
        from rloo.models.mlp_recompute import why_not_recompute_mlp

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
