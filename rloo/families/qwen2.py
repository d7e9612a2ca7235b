"""Qwen2: a Llama body with biases on the q/k/v projections, usually a tied head, and sliding-window attention on
the layers from `max_window_layers` on where `use_sliding_window` is set (transformers' `modeling_qwen2`)."""

from __future__ import annotations

from transformers import Qwen2ForCausalLM

from rloo.families import llama
from rloo.families.base import GATED_MLP, LLAMA_PROJECTIONS, Family, llama_like_architecture


def architecture(values: dict):
    return llama_like_architecture(values, LLAMA_PROJECTIONS[:3], 2)


FAMILY = Family(
    name="qwen2",
    model_types=("qwen2",),
    causal_lm=Qwen2ForCausalLM,
    projections=LLAMA_PROJECTIONS,
    mlp=GATED_MLP,
    architecture=architecture,
    decode_body=llama.decode_body,
)
