"""GPT-NeoX (Pythia; the embedded task's models): fused qkv laid out per head as q|k|v, partial rotary on the first
`rotary_ndims` dims of each head, parallel or sequential residual, LayerNorms, a GELU MLP, an untied LM head
(transformers' `modeling_gpt_neox`)."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor
from transformers import GPTNeoXForCausalLM

from rloo.families.base import (
    Architecture,
    Attend,
    AttentionShape,
    DecodeBody,
    Family,
    LinearFor,
    MLPForm,
    Proj,
    layer_norm,
    rotate,
)

PROJECTIONS = ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")


class NeoXLayer(NamedTuple):
    """One GPTNeoXLayer's weights, read once per pass so the step loop does no module look-ups."""

    ln_attn: tuple[Tensor, Tensor, float]  # input_layernorm (weight, bias, eps)
    ln_mlp: tuple[Tensor, Tensor, float]  # post_attention_layernorm
    qkv: Proj  # query_key_value: hidden -> 3 * hidden, per head q|k|v
    dense: Proj
    up: Proj  # mlp.dense_h_to_4h
    down: Proj  # mlp.dense_4h_to_h
    act: object  # mlp.act (the config's hidden_act)
    parallel: bool  # use_parallel_residual


def _attention(x: Tensor, layer: NeoXLayer, shape: AttentionShape, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
    """Causal self-attention of x `[B, T, D]` over the cache; cos, sin `[B, T, rot]`. k|v are handed on side by side
    `[B, H, T, 2*hd]`, as they lie in the fused qkv output, so one copy stores both."""
    batch, length, _ = x.shape
    qkv = layer.qkv(x).view(batch, length, shape.heads, 3, shape.head_dim)  # [B, T, H, q|k|v, hd]
    if shape.rotary_dims:
        qk = qkv[..., :2, : shape.rotary_dims]  # q and k rotated in one op
        qk.copy_(rotate(qk, cos[:, :, None, None], sin[:, :, None, None]))
    out = attend(qkv[..., 0, :].transpose(1, 2), qkv[..., 1:, :].flatten(-2).transpose(1, 2))  # [B, H, T, hd]
    return layer.dense(out.transpose(1, 2).reshape(batch, length, -1))


def layer_forward(x: Tensor, layer: NeoXLayer, shape: AttentionShape, cos: Tensor, sin: Tensor, attend: Attend):
    """GPTNeoXLayer.forward, additions in its order (float addition is not associative)."""
    attn = _attention(layer_norm(x, layer.ln_attn), layer, shape, cos, sin, attend)
    if layer.parallel:
        mlp = layer.down(layer.act(layer.up(layer_norm(x, layer.ln_mlp))))
        return mlp + attn + x  # x + attn(ln1(x)) + mlp(ln2(x))
    attn = attn + x
    mlp = layer.down(layer.act(layer.up(layer_norm(attn, layer.ln_mlp))))
    return mlp + attn


def decode_body(model, linear: LinearFor) -> DecodeBody:
    neox = model.gpt_neox

    def norm(ln):
        return ln.weight, ln.bias, ln.eps

    layers = [
        NeoXLayer(
            norm(layer.input_layernorm),
            norm(layer.post_attention_layernorm),
            linear(layer.attention.query_key_value),
            linear(layer.attention.dense),
            linear(layer.mlp.dense_h_to_4h),
            linear(layer.mlp.dense_4h_to_h),
            layer.mlp.act,
            layer.use_parallel_residual,
        )
        for layer in neox.layers
    ]
    heads, head_dim = model.config.num_attention_heads, neox.layers[0].attention.head_size
    # HF rotates as many dims as its cos table is wide (2 * len(inv_freq)), even where rotary_ndims is odd
    shape = AttentionShape(heads, heads, head_dim, 2 * len(neox.rotary_emb.inv_freq), head_dim**-0.5)
    final = norm(neox.final_layer_norm)
    return DecodeBody(
        layers, shape, neox.embed_in.weight, neox.rotary_emb, lambda x: layer_norm(x, final), layer_forward
    )


def architecture(values: dict) -> Architecture:
    """GPT-NeoX's layout: fused qkv, a GELU MLP, two LayerNorms (weight and bias) per block and a final one, biases
    on every linear layer unless `attention_bias` is false, an untied head unless the config ties it."""
    d, inner = values["hidden_size"], values["intermediate_size"]
    biased = values.get("attention_bias", True)
    shapes = {"query_key_value": (d, 3 * d), "dense": (d, d), "dense_h_to_4h": (d, inner), "dense_4h_to_h": (inner, d)}
    layers = values["num_hidden_layers"]
    return Architecture(
        "gpt_neox",
        values["vocab_size"],
        d,
        layers,
        inner,
        {name: (n_in, n_out, biased) for name, (n_in, n_out) in shapes.items()},
        layers * 4 * d + 2 * d,
        gated_mlp=False,
        num_heads=values.get("num_attention_heads", 0),
        tied_head=bool(values.get("tie_word_embeddings", False)),
        config=values,
    )


FAMILY = Family(
    name="gpt_neox",
    model_types=("gpt_neox",),
    causal_lm=GPTNeoXForCausalLM,
    projections=PROJECTIONS,
    mlp=MLPForm(False, ("dense_h_to_4h", "act", "dense_4h_to_h")),
    architecture=architecture,
    decode_body=decode_body,
)
