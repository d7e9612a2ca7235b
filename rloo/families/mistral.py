"""Mistral: a Llama body whose every layer attends through a sliding window of `sliding_window` tokens (None: full
attention) (transformers' `modeling_mistral`). rloo's fast paths compute full attention, so they serve a Mistral
model only where the window covers the whole padded prompt + completion, and say so where it does not."""

from __future__ import annotations

from transformers import MistralForCausalLM

from rloo.families import llama
from rloo.families.base import GATED_MLP, LLAMA_PROJECTIONS, Family


def attention_window(config) -> int | None:
    return getattr(config, "sliding_window", None)


FAMILY = Family(
    name="mistral",
    model_types=("mistral",),
    causal_lm=MistralForCausalLM,
    projections=LLAMA_PROJECTIONS,
    mlp=GATED_MLP,
    architecture=llama.architecture,
    decode_body=llama.decode_body,
    attention_window=attention_window,
)
