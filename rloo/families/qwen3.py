"""Qwen3: a Llama body with an RMSNorm over each head's queries and keys before the rotary (`q_norm`, `k_norm`, one
head wide), no q/k/v biases unless `attention_bias`, and sliding windows as Qwen2's (transformers'
`modeling_qwen3`)."""

from __future__ import annotations

from transformers import Qwen3ForCausalLM

from rloo.families import llama
from rloo.families.base import GATED_MLP, LLAMA_PROJECTIONS, Family, llama_like_architecture


def architecture(values: dict):
    biased = LLAMA_PROJECTIONS[:4] if values.get("attention_bias") else ()
    return llama_like_architecture(values, biased, 2, qk_norm=True)


FAMILY = Family(
    name="qwen3",
    model_types=("qwen3",),
    causal_lm=Qwen3ForCausalLM,
    projections=LLAMA_PROJECTIONS,
    mlp=GATED_MLP,
    architecture=architecture,
    decode_body=llama.decode_body,  # LlamaLayer carries the q/k norms
)
