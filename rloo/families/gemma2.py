"""Gemma 2: a Llama-style body with scaled embeddings (x sqrt(D)), RMSNorms that scale by (1 + weight) in float32,
a norm after attention and after the MLP as well as before each ("sandwich" norms), a GeGLU MLP (tanh GELU), scores
scaled by query_pre_attn_scalar**-0.5 and soft-capped (`attn_logit_softcapping`), final logits soft-capped
(`final_logit_softcapping`), and sliding-window attention on every other layer (transformers' `modeling_gemma2`).
rloo's fast paths serve it where the window covers the whole padded prompt + completion."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor
from transformers import Gemma2ForCausalLM

from rloo.families import llama
from rloo.families.base import (
    GATED_MLP,
    LLAMA_PROJECTIONS,
    Attend,
    AttentionShape,
    DecodeBody,
    Family,
    LinearFor,
    Proj,
    llama_like_architecture,
)


def gemma_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """Gemma2RMSNorm: normalised and scaled by (1 + weight) in float32, then cast back (Llama casts before scaling)."""
    x32 = x.float()
    normed = x32 * (x32.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    return (normed * (1.0 + weight.float())).type_as(x)


class GemmaLayer(NamedTuple):
    """One Gemma2DecoderLayer's weights."""

    ln_attn: tuple[Tensor, float]  # input_layernorm
    ln_post_attn: tuple[Tensor, float]  # post_attention_layernorm
    ln_mlp: tuple[Tensor, float]  # pre_feedforward_layernorm
    ln_post_mlp: tuple[Tensor, float]  # post_feedforward_layernorm
    q: Proj
    k: Proj
    v: Proj
    o: Proj
    gate: Proj
    up: Proj
    down: Proj
    act: object  # mlp.act_fn (tanh GELU)


def layer_forward(x: Tensor, layer: GemmaLayer, shape: AttentionShape, cos: Tensor, sin: Tensor, attend: Attend):
    """Gemma2DecoderLayer.forward: each sublayer normed before and after, then added to its residual."""
    attn = llama.attention(gemma_rms_norm(x, *layer.ln_attn), layer, shape, cos, sin, attend)
    x = x + gemma_rms_norm(attn, *layer.ln_post_attn)
    normed = gemma_rms_norm(x, *layer.ln_mlp)
    mlp = layer.down(layer.act(layer.gate(normed)) * layer.up(normed))
    return x + gemma_rms_norm(mlp, *layer.ln_post_mlp)


def _norm(module) -> tuple[Tensor, float]:
    return module.weight, module.eps


def decode_body(model, linear: LinearFor) -> DecodeBody:
    body, config = model.model, model.config
    layers = []
    for layer in body.layers:
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        norms += (layer.pre_feedforward_layernorm, layer.post_feedforward_layernorm)
        layers.append(GemmaLayer(*map(_norm, norms), *llama.projections(layer, linear), layer.mlp.act_fn))
    attention = body.layers[0].self_attn
    shape = AttentionShape(
        config.num_attention_heads,
        config.num_key_value_heads,
        attention.head_dim,
        2 * len(body.rotary_emb.inv_freq),
        attention.scaling,  # query_pre_attn_scalar**-0.5
        config.attn_logit_softcapping,
    )
    final = _norm(body.norm)
    return DecodeBody(
        layers,
        shape,
        body.embed_tokens.weight,
        body.rotary_emb,
        lambda x: gemma_rms_norm(x, *final),
        layer_forward,
        embed_scale=body.embed_tokens.embed_scale,
        logit_softcap=config.final_logit_softcapping,
    )


def architecture(values: dict):
    biased = LLAMA_PROJECTIONS[:4] if values.get("attention_bias") else ()
    return llama_like_architecture(values, biased, 4)


FAMILY = Family(
    name="gemma2",
    model_types=("gemma2",),
    causal_lm=Gemma2ForCausalLM,
    projections=LLAMA_PROJECTIONS,
    mlp=GATED_MLP,
    architecture=architecture,
    decode_body=decode_body,
)
