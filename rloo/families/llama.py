"""Llama (and SmolLM2, which is a Llama): separate q/k/v projections, grouped-query attention (fewer key/value
heads than query heads), full rotary, RMSNorm in float32, a SwiGLU MLP, a tied or untied head (transformers'
`modeling_llama`). Its layer code here also serves the families that are Llama plus a detail (Qwen2's biases,
Qwen3's per-head q/k norms, Mistral's sliding window)."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from transformers import LlamaForCausalLM

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
    rms_norm,
    rotate,
)


class LlamaLayer(NamedTuple):
    """One LlamaDecoderLayer's weights (or Qwen2's, Qwen3's, Mistral's)."""

    ln_attn: tuple[Tensor, float]  # input_layernorm (RMSNorm weight, eps)
    ln_mlp: tuple[Tensor, float]  # post_attention_layernorm
    q: Proj
    k: Proj
    v: Proj
    o: Proj
    gate: Proj
    up: Proj
    down: Proj
    act: object  # mlp.act_fn
    q_norm: tuple[Tensor, float] | None = None  # Qwen3: RMSNorm over each head's query before the rotary
    k_norm: tuple[Tensor, float] | None = None


def attention(x: Tensor, layer, shape: AttentionShape, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
    """LlamaAttention of x `[B, T, D]` over the cache (Qwen2's, Qwen3's with its q/k norms, Mistral's and Gemma 2's
    where the window covers the sequence); each group of heads // kv_heads query heads shares one key/value head."""
    batch, length, _ = x.shape
    hd = shape.head_dim
    q = layer.q(x).view(batch, length, shape.heads, hd)
    k = layer.k(x).view(batch, length, shape.kv_heads, hd)
    if getattr(layer, "q_norm", None) is not None:
        q, k = rms_norm(q, *layer.q_norm), rms_norm(k, *layer.k_norm)
    q, k = rotate(q, cos[:, :, None], sin[:, :, None]), rotate(k, cos[:, :, None], sin[:, :, None])
    v = layer.v(x).view(batch, length, shape.kv_heads, hd)
    out = attend(q.transpose(1, 2), torch.cat((k, v), dim=-1).transpose(1, 2))  # [B, H, T, hd]
    return layer.o(out.transpose(1, 2).reshape(batch, length, -1))


def layer_forward(x: Tensor, layer: LlamaLayer, shape: AttentionShape, cos: Tensor, sin: Tensor, attend: Attend):
    """LlamaDecoderLayer.forward: pre-norm attention and SwiGLU MLP, each added to its residual."""
    x = x + attention(rms_norm(x, *layer.ln_attn), layer, shape, cos, sin, attend)
    normed = rms_norm(x, *layer.ln_mlp)
    return x + layer.down(layer.act(layer.gate(normed)) * layer.up(normed))


def _norm(module) -> tuple[Tensor, float]:
    return module.weight, module.variance_epsilon


def projections(layer, linear: LinearFor) -> list[Proj]:
    """A Llama-style block's q, k, v, o, gate, up and down projections, each through the decode's product."""
    attn, mlp = layer.self_attn, layer.mlp
    return [
        linear(m)
        for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    ]


def decode_body(model, linear: LinearFor) -> DecodeBody:
    """The body of a Llama-style causal LM (`model.model`), with Qwen3's q/k norms where its attention has them."""
    body = model.model
    layers = []
    for layer in body.layers:
        attn = layer.self_attn
        qk_norms = (_norm(attn.q_norm), _norm(attn.k_norm)) if hasattr(attn, "q_norm") else (None, None)
        norms = (_norm(layer.input_layernorm), _norm(layer.post_attention_layernorm))
        layers.append(LlamaLayer(*norms, *projections(layer, linear), layer.mlp.act_fn, *qk_norms))
    head_dim = body.layers[0].self_attn.head_dim
    config = model.config
    rotary = 2 * len(body.rotary_emb.inv_freq)
    shape = AttentionShape(config.num_attention_heads, config.num_key_value_heads, head_dim, rotary, head_dim**-0.5)
    final = _norm(body.norm)
    return DecodeBody(
        layers, shape, body.embed_tokens.weight, body.rotary_emb, lambda x: rms_norm(x, *final), layer_forward
    )


def architecture(values: dict):
    biased = LLAMA_PROJECTIONS[:4] if values.get("attention_bias") else ()
    return llama_like_architecture(values, biased + (LLAMA_PROJECTIONS[4:] if values.get("mlp_bias") else ()), 2)


FAMILY = Family(
    name="llama",
    model_types=("llama",),
    causal_lm=LlamaForCausalLM,
    projections=LLAMA_PROJECTIONS,
    mlp=GATED_MLP,
    architecture=architecture,
    decode_body=decode_body,
)
