"""What a model family tells the rest of rloo: the `Family` record each module under rloo/families/ exports, the
plan's `Architecture` it reads from a config.json, and the pieces the lean decode's layer code is written in.

Plain torch; no transformers model class is named here (each family module names its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# (q `[B, H, T, hd]`, new k|v `[B, kv_heads, T, 2*hd]`) -> `[B, H, T, hd]`: attention over the decode's cache,
# which the loop (rloo/generation/decode.py) reads and extends
Attend = Callable[[Tensor, Tensor], Tensor]


class MLPForm(NamedTuple):
    """How a block's MLP computes, by the names of its submodules, for rloo.models.mlp_recompute.

    gated: down(act(gate(x)) * up(x)), names (gate, up, down, act); else down(act(up(x))), names (up, act, down)."""

    gated: bool
    names: tuple[str, ...]


GATED_MLP = MLPForm(True, ("gate_proj", "up_proj", "down_proj", "act_fn"))
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class Architecture:
    """The shapes that set the memory of a decoder-only causal LM, as its family reads them from a config.json
    (`Family.architecture`). `linear_shapes`: a block's linear layers by the model's own names (the names LoRA
    targets), each (in, out, has a bias); `norm_params`: the body's normalisation weights in all."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    linear_shapes: dict[str, tuple[int, int, bool]]
    norm_params: int
    gated_mlp: bool
    num_heads: int = 0  # 0: unknown (k and v are then as wide as the hidden state)
    num_kv_heads: int = 0  # 0: one per query head
    head_dim: int = 0  # 0: hidden_size // num_heads
    tied_head: bool = False
    config: dict | None = field(default=None, compare=False)  # the config.json it was read from, if any

    @property
    def heads(self) -> int:
        """Query heads: the config's, or one per 128 dims where it does not say."""
        return self.num_heads or max(self.hidden_size // 128, 1)

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // max(self.num_heads, 1)

    @property
    def kv_width(self) -> int:
        """Keys plus values per token and layer (elements): what the decode's cache holds."""
        if not self.num_heads:
            return 2 * self.hidden_size
        return 2 * (self.num_kv_heads or self.num_heads) * self.head_size

    def block_linear_params(self) -> int:
        return sum(n_in * n_out + (n_out if bias else 0) for n_in, n_out, bias in self.linear_shapes.values())

    def body_params(self) -> tuple[int, int]:
        """(linear-layer parameters, the rest: embedding and norms) of the transformer body."""
        return self.num_layers * self.block_linear_params(), self.vocab_size * self.hidden_size + self.norm_params

    def head_params(self) -> int:
        """The LM head's own parameters: none when it is the embedding (tied)."""
        return 0 if self.tied_head else self.vocab_size * self.hidden_size

    def saved_per_token(self, mlp_recompute: bool = False) -> int:
        """Values one block keeps per token for the backward: the norms' inputs, q, k and v, the attention output,
        the MLP's input (about 8 D + the k|v width) and its wide activations (GELU: h and act(h); gated: gate, up,
        act(gate), product). With rloo.models.mlp_recompute, the up-projections only (GELU: h; gated: gate and up)."""
        wide = (2 if self.gated_mlp else 1) if mlp_recompute else (4 if self.gated_mlp else 2)
        return 8 * self.hidden_size + self.kv_width + wide * self.intermediate_size


class Proj(NamedTuple):
    """One linear layer's weights and the product that applies them (rloo.generation.decode chooses the product)."""

    weight: Tensor  # the module's own, or a copy in oneDNN's blocked layout
    bias: Tensor | None
    product: Callable

    def __call__(self, x: Tensor) -> Tensor:
        return self.product(x, self.weight, self.bias)


LinearFor = Callable[[nn.Module], Proj]  # a linear module -> the product the decode applies it with


class AttentionShape(NamedTuple):
    heads: int
    kv_heads: int  # = heads without grouped-query attention
    head_dim: int
    rotary_dims: int
    scale: float  # scores = q.k * scale (head_dim**-0.5 but for Gemma's query_pre_attn_scalar)
    softcap: float | None = None  # scores = softcap * tanh(scores / softcap) before the mask (Gemma 2)


class DecodeBody(NamedTuple):
    """What the lean decode needs of one model, made by its family (`Family.decode_body`): its weights per layer,
    shapes, embedding, rotary module and final norm, and the family's layer forward over them."""

    layers: list
    shape: AttentionShape
    embed: Tensor  # [V, D]
    rotary: nn.Module  # holds inv_freq and attention_scaling
    final_norm: Callable[[Tensor], Tensor]
    # (x `[B, T, D]`, one entry of `layers`, shape, cos, sin `[B, T, rot]`, attend) -> `[B, T, D]`
    layer_forward: Callable
    embed_scale: Tensor | None = None  # hidden = embedding * sqrt(D), the scale cast to the weights' dtype (Gemma)
    logit_softcap: float | None = None  # logits = softcap * tanh(logits / softcap) (Gemma 2)


def layer_types_window(config) -> int | None:
    """The sliding window where any layer of `config.layer_types` attends through one (Qwen2, Qwen3, Gemma 2)."""
    if any(kind == "sliding_attention" for kind in getattr(config, "layer_types", None) or ()):
        return config.sliding_window
    return None


@dataclass(frozen=True)
class Family:
    """Everything rloo knows of one model family, in one record; rloo/families/__init__.py lists them.

    model_types: config.json's `model_type` values it claims; causal_lm: its transformers causal-LM class (the lean
    decode samples from that class only); projections: a block's linear layers in the model's names, which LoRA's
    `auto` adapts and the decode reads; mlp: its MLP form (rloo.models.mlp_recompute); architecture: config.json -> the
    memory plan's Architecture; decode_body: (model, linear) -> the lean decode's weights and layer code;
    attention_window: the sliding window of a config (None: full attention everywhere)."""

    name: str
    model_types: tuple[str, ...]
    causal_lm: type
    projections: tuple[str, ...]
    mlp: MLPForm
    architecture: Callable[[dict], Architecture]
    decode_body: Callable[[nn.Module, LinearFor], DecodeBody]
    attention_window: Callable[[object], int | None] = layer_types_window


def llama_like_architecture(values: dict, biased: tuple[str, ...], norms_per_layer: int, qk_norm: bool = False):
    """The Architecture of a Llama-style config.json: separate q/k/v/o projections, grouped-query attention, a gated
    MLP, RMSNorm (`norms_per_layer` of width D per block, and q/k norms of one head's width where `qk_norm`)."""
    d, inner = values["hidden_size"], values["intermediate_size"]
    heads = values.get("num_attention_heads", 0)
    kv_heads = values.get("num_key_value_heads") or heads
    head_dim = values.get("head_dim") or d // heads
    queries, kv = heads * head_dim, kv_heads * head_dim
    shapes = dict(zip(LLAMA_PROJECTIONS, [(d, queries), (d, kv), (d, kv), (queries, d), (d, inner), (d, inner)]))
    shapes["down_proj"] = (inner, d)
    layers = values["num_hidden_layers"]
    norms = layers * (norms_per_layer * d + (2 * head_dim if qk_norm else 0)) + d
    return Architecture(
        values.get("model_type", ""),
        values["vocab_size"],
        d,
        layers,
        inner,
        {name: (n_in, n_out, name in biased) for name, (n_in, n_out) in shapes.items()},
        norms,
        gated_mlp=True,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        tied_head=bool(values.get("tie_word_embeddings", True)),
        config=values,
    )


def rotate(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """x*cos + rotate_half(x)*sin over the last dim (the rotary dims); the sin table carries rotate_half's sign."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + swapped * sin_signed


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """LlamaRMSNorm (Qwen2's, Qwen3's, Mistral's): normalised in float32, cast back, then scaled."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def layer_norm(x: Tensor, norm: tuple[Tensor, Tensor, float]) -> Tensor:
    """nn.LayerNorm over the last dim from (weight, bias, eps)."""
    return F.layer_norm(x, x.shape[-1:], *norm)
