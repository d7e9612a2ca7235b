"""A lean KV-cache sampling loop for GPT-NeoX (Pythia) and Llama-family (Llama, Qwen2) causal LMs, in place of HF
`generate` in the rollout.

On small models HF `generate` spends about 30% of its time in framework code (cache objects, mask building,
logits processors, stopping criteria). This loop runs the model's own weights through the arithmetic of its
transformers implementation:
- GPT-NeoX (`modeling_gpt_neox`): fused qkv laid out per head as q|k|v, partial rotary on the first `rotary_ndims`
  dims, parallel or sequential residual, layer norms, untied LM head;
- Llama and Qwen2 (`modeling_llama`, `modeling_qwen2`): separate q/k/v projections (Qwen2's with biases), grouped-query
  attention (fewer key/value heads than query heads), full rotary, RMSNorm in float32, SwiGLU MLP, tied or untied head;
prefill each distinct left-padded prompt in one forward, then one token per step, dropping rows from the batch once
they end. Per layer the cache is in two parts, each holding a head's keys and then its values (so reading the keys
reads no value bytes): the prompt's (`[U, kv_heads, 2, P, head_dim]`, one per distinct prompt, read once per step by
all k rows of the prompt) and each row's own completion (`[B, kv_heads, 2, max_new, head_dim]`); one softmax spans
both. On CPU, float32 linear layers run through oneDNN, their weights reordered into its blocked layout once per
rollout or evaluation pass (`prepared_weights`).
Sampling follows HF's order: logits / temperature -> top-k -> top-p -> softmax -> a draw: torch.multinomial as
HF does (sampler=multinomial, the same random stream), or the cheaper inverse-CDF draw (sampler=inverse_cdf).
Plain torch + transformers; no Lightning or Hydra.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GPTNeoXForCausalLM, LlamaForCausalLM, Qwen2ForCausalLM

from rloo.models import FP32Head
from rloo.sampling import SamplingConfig, position_ids_for
from rloo.sharding import weights_partitioned

LEAN_DECODE_MODELS = ("gpt_neox", "llama", "qwen2")  # the bodies this loop is written for and tested on
# rotary types whose frequencies depend on the sequence length (HF recomputes them per call): not in this loop
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


Attend = Callable[[Tensor, Tensor], Tensor]  # (q `[B, H, T, hd]`, new k|v `[B, kv_heads, T, 2*hd]`) -> `[B, H, T, hd]`


class _Shape(NamedTuple):
    heads: int
    kv_heads: int  # = heads without grouped-query attention
    head_dim: int
    rotary_dims: int


class _NeoXLayer(NamedTuple):
    """One GPTNeoXLayer's weights, read once per call so the step loop does no module look-ups."""

    ln_attn: tuple[Tensor, Tensor, float]  # input_layernorm (weight, bias, eps)
    ln_mlp: tuple[Tensor, Tensor, float]  # post_attention_layernorm
    qkv: _Proj  # query_key_value: hidden -> 3 * hidden, per head q|k|v
    dense: _Proj
    up: _Proj  # mlp.dense_h_to_4h
    down: _Proj  # mlp.dense_4h_to_h
    act: object  # mlp.act (the config's hidden_act)
    parallel: bool  # use_parallel_residual


class _LlamaLayer(NamedTuple):
    """One LlamaDecoderLayer's (or Qwen2DecoderLayer's) weights."""

    ln_attn: tuple[Tensor, float]  # input_layernorm (RMSNorm weight, eps)
    ln_mlp: tuple[Tensor, float]  # post_attention_layernorm
    q: _Proj
    k: _Proj
    v: _Proj
    o: _Proj
    gate: _Proj
    up: _Proj
    down: _Proj
    act: object  # mlp.act_fn


class _Body(NamedTuple):
    """What the loop needs of one model: its weights per layer, shapes, embedding, rotary module and final norm."""

    layers: list
    shape: _Shape
    embed: Tensor  # [V, D]
    rotary: torch.nn.Module  # holds inv_freq and attention_scaling
    final_norm: Callable[[Tensor], Tensor]
    layer_forward: Callable
    cache_dtype: torch.dtype
    head: Callable[[Tensor], Tensor]  # final-normed hidden `[B, D]` -> logits `[B, V]` (`_head`)


def supports_lean_decode(model) -> bool:
    return why_not_lean_decode(model) is None


def _decoder(model):
    """The transformer body of a supported causal LM, or None."""
    if isinstance(model, GPTNeoXForCausalLM):
        return model.gpt_neox
    if isinstance(model, (LlamaForCausalLM, Qwen2ForCausalLM)):
        return model.model
    return None


def _linears(model) -> list[torch.nn.Module]:
    """Every linear layer of the body that the loop reads the weights of."""
    if isinstance(model, GPTNeoXForCausalLM):
        layers = model.gpt_neox.layers
        names = ("attention.query_key_value", "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h")
    else:
        layers = model.model.layers
        names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
        names += ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    return [layer.get_submodule(name) for layer in layers for name in names]


def why_not_lean_decode(model) -> str | None:
    """None for a GPT-NeoX, Llama or Qwen2 causal LM whose rotary frequencies do not depend on the length (dynamic
    and longrope scaling recompute them per call), without sliding-window attention, whose layers are plain linear
    layers: the loop reads their weights, so an adapter-wrapped layer (LoRA) would be sampled without its adapter,
    and a partitioned weight would be read as this rank's part. Else why not."""
    decoder = _decoder(model)
    if decoder is None:
        kinds = ", ".join(LEAN_DECODE_MODELS)
        return f"it is written for {kinds} causal LMs, not {type(model).__name__}"
    rope_type = decoder.rotary_emb.rope_type
    if any(kind in rope_type for kind in LENGTH_DEPENDENT_ROPE):
        return f"rope_type {rope_type} recomputes its frequencies per length, which it does not"
    if any(kind == "sliding_attention" for kind in getattr(model.config, "layer_types", None) or ()):
        return "sliding-window attention is not in it"
    if weights_partitioned(model):  # FSDP2 / ZeRO-3: each rank holds a part of each weight
        return "the weights are partitioned across ranks"
    if not all(type(module) is torch.nn.Linear for module in _linears(model)):
        return "its linear layers are wrapped (LoRA adapters), which it would read without them"
    return None


class _Proj(NamedTuple):
    """One linear layer's weights and the product that applies them (see `_linear`)."""

    weight: Tensor  # the module's own, or a copy in oneDNN's blocked layout
    bias: Tensor | None
    product: Callable

    def __call__(self, x: Tensor) -> Tensor:
        return self.product(x, self.weight, self.bias)


def _onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def onednn_applies(weight: Tensor) -> bool:
    """Whether the loop runs this weight's products through oneDNN: float32 on CPU, outside autocast, with a torch
    that has oneDNN's linear and its weight reorder."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def _linear(module, rows: int) -> _Proj:
    """The linear product the loop uses for a module: where `onednn_applies`, oneDNN's, with the weight reordered
    into oneDNN's blocked layout for products of about `rows` rows; else F.linear on the module's weight.

    oneDNN's float32 linear on a plain weight repacks it on every call: at 8 rows it read the 160m-class layers at
    about half the memory bandwidth (2 cores, AMD EPYC, torch 2.13: the 49 products of one decode step took 29-33 ms
    from plain weights, 18 ms from reordered ones, and F.linear (MKL) 53-63 ms). The reorder copies the weights once
    per rollout or evaluation pass (`prepared_weights`; they change with every update), 0.16-0.22 s for
    Pythia-160m's, and the copies are freed once it has sampled. Results are those of oneDNN's product on the plain
    weight (bit-identical at 3 rows and more) and differ from F.linear's in the last bits (about 2e-6 on unit-scale
    outputs). Sampling is no-grad, so autograd is not needed. Elsewhere (GPU, bfloat16, autocast, a torch without
    oneDNN) the loop keeps F.linear."""
    if onednn_applies(module.weight):
        packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), rows)
        return _Proj(packed, module.bias, _onednn_linear)
    return _Proj(module.weight, module.bias, F.linear)


def prepared_weights(model, rows: int) -> _Body:
    """The model's weights as the loop reads them, its linear products set up for batches of about `rows` rows
    (`_linear`: on CPU in float32, reordered copies). Made once for every `lean_generate` call of one rollout or
    evaluation pass; made again once the weights change."""
    if isinstance(model, GPTNeoXForCausalLM):
        neox = model.gpt_neox

        def norm(ln):
            return ln.weight, ln.bias, ln.eps

        layers = [
            _NeoXLayer(
                norm(layer.input_layernorm),
                norm(layer.post_attention_layernorm),
                _linear(layer.attention.query_key_value, rows),
                _linear(layer.attention.dense, rows),
                _linear(layer.mlp.dense_h_to_4h, rows),
                _linear(layer.mlp.dense_4h_to_h, rows),
                layer.mlp.act,
                layer.use_parallel_residual,
            )
            for layer in neox.layers
        ]
        heads = model.config.num_attention_heads
        # HF rotates as many dims as its cos table is wide (2 * len(inv_freq)), even where rotary_ndims is odd
        shape = _Shape(heads, heads, neox.layers[0].attention.head_size, 2 * len(neox.rotary_emb.inv_freq))
        final = neox.final_layer_norm

        def final_norm(x: Tensor) -> Tensor:
            return F.layer_norm(x, x.shape[-1:], final.weight, final.bias, final.eps)

        return _Body(
            layers,
            shape,
            neox.embed_in.weight,
            neox.rotary_emb,
            final_norm,
            _neox_layer_forward,
            _linear_dtype(neox.layers[0].attention.query_key_value.weight),
            _head(model, rows),
        )
    body = model.model
    layers = [
        _LlamaLayer(
            (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
            (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
            _linear(layer.self_attn.q_proj, rows),
            _linear(layer.self_attn.k_proj, rows),
            _linear(layer.self_attn.v_proj, rows),
            _linear(layer.self_attn.o_proj, rows),
            _linear(layer.mlp.gate_proj, rows),
            _linear(layer.mlp.up_proj, rows),
            _linear(layer.mlp.down_proj, rows),
            layer.mlp.act_fn,
        )
        for layer in body.layers
    ]
    attention = body.layers[0].self_attn
    shape = _Shape(
        model.config.num_attention_heads,
        model.config.num_key_value_heads,
        attention.head_dim,
        2 * len(body.rotary_emb.inv_freq),
    )
    final = (body.norm.weight, body.norm.variance_epsilon)
    return _Body(
        layers,
        shape,
        body.embed_tokens.weight,
        body.rotary_emb,
        lambda x: _rms_norm(x, *final),
        _llama_layer_forward,
        _linear_dtype(body.layers[0].self_attn.q_proj.weight),
        _head(model, rows),
    )


def rotary_tables(rotary: torch.nn.Module, length: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and signed sin `[length, rotary_dims]` for positions 0..length-1, as HF's rotary embeddings (GPT-NeoX's,
    Llama's, Qwen2's) make them from `inv_freq` and `attention_scaling`.

    The sin table carries rotate_half's sign (-sin on the first half), so that
    x*cos + swap_halves(x)*sin_signed == x*cos + rotate_half(x)*sin exactly ((-a)*b == a*(-b) in IEEE).
    """
    inv_freq = rotary.inv_freq.float()
    freqs = torch.arange(length, device=inv_freq.device).float()[:, None] * inv_freq  # [L, rot/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [L, rot]
    cos, sin = emb.cos() * rotary.attention_scaling, emb.sin() * rotary.attention_scaling
    half = sin.shape[-1] // 2
    sin_signed = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return cos.to(dtype), sin_signed.to(dtype)  # HF casts the tables to the hidden states' dtype


def _linear_dtype(weight: Tensor) -> torch.dtype:
    """The dtype F.linear returns here: autocast's when it is on (the cache then holds what SDPA would see)."""
    device_type = weight.device.type
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype


def _rotate(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """x*cos + rotate_half(x)*sin over the last dim (the rotary dims)."""
    half = x.shape[-1] // 2
    swapped = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    return x * cos + swapped * sin_signed


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """LlamaRMSNorm / Qwen2RMSNorm: normalised in float32, cast back, then scaled."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _neox_attention(x: Tensor, layer: _NeoXLayer, shape: _Shape, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
    """Causal self-attention of x `[B, T, D]` over the cache, which `attend` reads and extends.

    cos, sin: `[B, T, rot]`. k|v are handed on side by side `[B, H, T, 2*hd]`, as they lie in the fused qkv output,
    so one copy stores both.
    """
    batch, length, _ = x.shape
    qkv = layer.qkv(x).view(batch, length, shape.heads, 3, shape.head_dim)  # [B, T, H, q|k|v, hd]
    if shape.rotary_dims:
        qk = qkv[..., :2, : shape.rotary_dims]  # q and k rotated in one op
        qk.copy_(_rotate(qk, cos[:, :, None, None], sin[:, :, None, None]))
    out = attend(qkv[..., 0, :].transpose(1, 2), qkv[..., 1:, :].flatten(-2).transpose(1, 2))  # [B, H, T, hd]
    return layer.dense(out.transpose(1, 2).reshape(batch, length, -1))


def _neox_layer_forward(
    x: Tensor, layer: _NeoXLayer, shape: _Shape, cos: Tensor, sin: Tensor, attend: Attend
) -> Tensor:
    """GPTNeoXLayer.forward, additions in its order (float addition is not associative)."""
    attn = _neox_attention(F.layer_norm(x, x.shape[-1:], *layer.ln_attn), layer, shape, cos, sin, attend)
    if layer.parallel:
        mlp = layer.down(layer.act(layer.up(F.layer_norm(x, x.shape[-1:], *layer.ln_mlp))))
        return mlp + attn + x  # x + attn(ln1(x)) + mlp(ln2(x))
    attn = attn + x
    mlp = layer.down(layer.act(layer.up(F.layer_norm(attn, attn.shape[-1:], *layer.ln_mlp))))
    return mlp + attn


def _llama_attention(x: Tensor, layer: _LlamaLayer, shape: _Shape, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
    """LlamaAttention (and Qwen2Attention without a sliding window) of x `[B, T, D]` over the cache; each group of
    heads // kv_heads query heads shares one key/value head."""
    batch, length, _ = x.shape
    hd = shape.head_dim
    q = layer.q(x).view(batch, length, shape.heads, hd)
    k = layer.k(x).view(batch, length, shape.kv_heads, hd)
    q, k = _rotate(q, cos[:, :, None], sin[:, :, None]), _rotate(k, cos[:, :, None], sin[:, :, None])
    v = layer.v(x).view(batch, length, shape.kv_heads, hd)
    out = attend(q.transpose(1, 2), torch.cat((k, v), dim=-1).transpose(1, 2))  # [B, H, T, hd]
    return layer.o(out.transpose(1, 2).reshape(batch, length, -1))


def _llama_layer_forward(
    x: Tensor, layer: _LlamaLayer, shape: _Shape, cos: Tensor, sin: Tensor, attend: Attend
) -> Tensor:
    """LlamaDecoderLayer.forward: pre-norm attention and SwiGLU MLP, each added to its residual."""
    x = x + _llama_attention(_rms_norm(x, *layer.ln_attn), layer, shape, cos, sin, attend)
    normed = _rms_norm(x, *layer.ln_mlp)
    return x + layer.down(layer.act(layer.gate(normed)) * layer.up(normed))


def _head(model, rows: int) -> Callable[[Tensor], Tensor]:
    """The LM head, through the loop's product (`_linear`) where that is the head's own arithmetic: a plain linear
    head, or an FP32Head whose weights and input are float32 already (a float32 body), outside autocast. Any other
    head (FP32Head upcasting bfloat16) runs as is."""
    head = model.lm_head
    as_linear = type(head) is torch.nn.Linear or (
        isinstance(head, FP32Head)
        and head.weight.dtype == model.get_input_embeddings().weight.dtype == torch.float32
        and not torch.is_autocast_enabled(head.weight.device.type)
    )
    return _linear(head, rows) if as_linear else head


def _last_logits(body: _Body, hidden: Tensor) -> Tensor:
    """LM head on the last position only: `[B, T, D]` -> `[B, V]`."""
    return body.head(body.final_norm(hidden[:, -1]))


def filter_logits(scores: Tensor, top_k: int, top_p: float) -> Tensor:
    """HF's TopKLogitsWarper then TopPLogitsWarper (min_tokens_to_keep=1): removed tokens get -inf. `[B, V]`.

    top-k keeps every token tied with the k-th score; top-p removes, in ascending order, the tokens whose
    cumulative probability is <= 1 - top_p, and never the most likely one.
    """
    if top_k > 0:
        # the k-th largest score; the smallest of an unsorted top-k is the same value and skips the sort
        kth = torch.topk(scores, min(top_k, scores.shape[-1]), sorted=False).values.amin(-1, keepdim=True)  # [B, 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, descending=False)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        remove_sorted = cumulative <= 1 - top_p
        remove_sorted[..., -1:] = False
        scores = scores.masked_fill(remove_sorted.scatter(1, order, remove_sorted), float("-inf"))
    return scores


def inverse_cdf_draw(probs: Tensor) -> Tensor:
    """One token per row of `probs` `[B, V]` (rows need not sum to 1): the first token whose cumulative probability
    exceeds a uniform draw. The sum runs in float64, so no token's share is lost to rounding; a zero-probability
    token is never drawn (the cumulative sum does not rise there). On CPU about 20x cheaper than torch.multinomial,
    whose exponential noise costs a logarithm per vocabulary entry; one uniform per row instead."""
    cumulative = probs.cumsum(-1, dtype=torch.float64)  # [B, V]
    total = cumulative[:, -1:]
    draw = torch.rand(probs.shape[0], 1, dtype=torch.float64, device=probs.device) * total
    index = torch.searchsorted(cumulative, draw, right=True)  # first c_v > draw: p_v > 0
    last_nonzero = (cumulative < total).sum(-1, keepdim=True)  # where a draw rounded up to total lands
    return torch.minimum(index, last_nonzero).squeeze(1)


def sample_tokens(logits: Tensor, sampling: SamplingConfig) -> tuple[Tensor, Tensor]:
    """Next tokens `[B]` and their log-probs `[B]` (float32) under softmax(logits / temperature), unfiltered."""
    scores = logits.float()  # HF samples from float32 logits
    if sampling.greedy:
        tokens = scores.argmax(-1)
    else:
        scores = scores / sampling.temperature
        probs = filter_logits(scores, sampling.top_k, sampling.top_p).softmax(-1)
        if sampling.sampler == "multinomial":  # HF generate's draw, the same random stream
            tokens = torch.multinomial(probs, 1).squeeze(1)
        else:
            tokens = inverse_cdf_draw(probs)
    picked = scores.gather(1, tokens[:, None]).squeeze(1)
    return tokens, picked - scores.logsumexp(-1)  # log p(y) = z_y - log sum_v exp(z_v), as token_logprobs


def _prefill_mask(prompt_mask: Tensor) -> Tensor:
    """bool `[N, 1, P, P]`: causal, never onto left padding; a pad query sees itself, so no softmax row is empty
    (an all-masked row gives NaN, which would reach the real tokens through the pad's v in the next layer)."""
    length = prompt_mask.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=prompt_mask.device).tril()
    mask = (causal & prompt_mask.bool()[:, None, :]) | torch.eye(length, dtype=torch.bool, device=prompt_mask.device)
    return mask[:, None]


def _prompt_groups(prompt_ids: Tensor, prompt_mask: Tensor) -> tuple[Tensor, Tensor]:
    """first `[U]`, inverse `[N]`: the first row of each distinct prompt, and the group of every row.

    RLOO repeats every prompt k times, and rows that agree on the mask and on every real token have the same
    prefill (ids under padding are never attended), so U = N / k prefills serve all N rows.
    """
    key = prompt_ids.masked_fill(prompt_mask == 0, -1)  # -1 is no token id: the mask is part of the key
    _, inverse = torch.unique(key, dim=0, return_inverse=True)  # [N]
    rows = torch.arange(len(inverse), device=inverse.device)
    first = torch.full((int(inverse.max()) + 1,), len(inverse), device=inverse.device)
    return first.scatter_reduce_(0, inverse, rows, "amin"), inverse


def _group_members(inverse: Tensor) -> Tensor:
    """`[N]`: each row's rank among the rows of its prompt group (0 for the group's first row, in row order)."""
    order = torch.argsort(inverse, stable=True)
    sorted_groups = inverse[order]
    group_start = torch.searchsorted(sorted_groups, sorted_groups, right=False)  # where each row's group begins
    member = torch.empty_like(inverse)
    member[order] = torch.arange(len(inverse), device=inverse.device) - group_start
    return member


def _prefill(body: _Body, prompt_ids: Tensor, prompt_mask: Tensor, cos_table: Tensor, sin_table: Tensor):
    """One forward over left-padded prompts `[U, P]`: per layer the prompt's keys and values
    `[U, kv_heads, 2, P, hd]`, and the logits `[U, V]` after the last prompt token."""
    hidden = F.embedding(prompt_ids, body.embed)  # [U, P, D]
    positions = position_ids_for(prompt_mask)  # [U, P]
    cos, sin = cos_table[positions], sin_table[positions]  # [U, P, rot]
    mask = _prefill_mask(prompt_mask)
    shape, caches = body.shape, []
    gqa = shape.kv_heads != shape.heads
    hd = shape.head_dim

    def attend(q: Tensor, kv: Tensor) -> Tensor:  # the whole prompt at once: store its k|v, attend causally
        cache = caches[-1]
        cache.copy_(kv.unflatten(-1, (2, hd)).transpose(2, 3))  # [U, kv_heads, P, 2, hd] -> [U, kv_heads, 2, P, hd]
        return F.scaled_dot_product_attention(
            q, cache[:, :, 0], cache[:, :, 1], attn_mask=mask, scale=hd**-0.5, enable_gqa=gqa
        )

    for layer in body.layers:
        size = (len(prompt_ids), shape.kv_heads, 2, prompt_ids.shape[1], hd)
        caches.append(torch.empty(size, dtype=body.cache_dtype, device=prompt_ids.device))
        hidden = body.layer_forward(hidden, layer, shape, cos, sin, attend)
    return caches, _last_logits(body, hidden)


class _Groups(NamedTuple):
    """Which prompt group's cache each batch slot reads, for one decode step."""

    slot_group: Tensor  # [B] the slot's prompt group
    slot_member: Tensor  # [B] its rank within the group
    size: int  # rows per group, the largest
    prompt_bias: Tensor  # [U, P] float32: 0 on prompt tokens, -inf on left padding
    step: int  # the completion position being written: each slot's own cache holds 0..step


def _scatter_to_groups(x: Tensor, groups: _Groups, num_groups: int) -> Tensor:
    """`[B, kv_heads, rep, n]` -> `[U, kv_heads, size * rep, n]`: each slot's rows in its group's block (zeros where
    a group has fewer live rows), so one matmul per group meets the group's shared prompt cache."""
    slots, kv_heads, rep, n = x.shape
    grouped = x.new_zeros(num_groups, groups.size, kv_heads, rep, n)
    grouped[groups.slot_group, groups.slot_member] = x
    return grouped.transpose(1, 2).reshape(num_groups, kv_heads, groups.size * rep, n)


def _gather_from_groups(x: Tensor, groups: _Groups) -> Tensor:
    """The inverse of `_scatter_to_groups`: `[U, kv_heads, size * rep, n]` -> `[B, kv_heads, rep, n]`."""
    num_groups, kv_heads, _, n = x.shape
    per_member = x.view(num_groups, kv_heads, groups.size, -1, n).transpose(1, 2)  # [U, size, kv_heads, rep, n]
    return per_member[groups.slot_group, groups.slot_member]


def _decode_attend(q: Tensor, kv: Tensor, prompt_kv: Tensor, own_kv: Tensor, groups: _Groups) -> Tensor:
    """One new token per slot: q `[B, H, 1, hd]` attends to its group's prompt cache `[U, kv_heads, 2, P, hd]`,
    read once for the whole group, and to its own completion so far (`own_kv` `[B, kv_heads, 2, T, hd]`, where
    the new k|v `[B, kv_heads, 1, 2*hd]` is stored first).

    One softmax over both parts (their scores concatenated), so the result is attention over prompt + completion,
    as if each row held a copy of its prompt's cache; with k rows per prompt the prompt's keys and values are read
    once instead of k times, and not copied k times."""
    step, hd = groups.step, q.shape[-1]
    own_kv[:, :, :, step] = kv[:, :, 0].unflatten(-1, (2, hd))
    slots, heads = q.shape[:2]
    kv_heads = own_kv.shape[1]
    q = (q * hd**-0.5).reshape(slots, kv_heads, heads // kv_heads, hd)  # [B, kv_heads, rep, hd]
    own_keys, own_values = own_kv[:, :, 0, : step + 1], own_kv[:, :, 1, : step + 1]  # [B, kv_heads, T, hd]
    prompt_keys, prompt_values = prompt_kv[:, :, 0], prompt_kv[:, :, 1]  # [U, kv_heads, P, hd]
    prompt_scores = torch.matmul(_scatter_to_groups(q, groups, len(prompt_kv)), prompt_keys.transpose(-1, -2))
    prompt_scores = (
        _gather_from_groups(prompt_scores, groups).float() + groups.prompt_bias[groups.slot_group, None, None]
    )
    scores = torch.cat((prompt_scores, torch.matmul(q, own_keys.transpose(-1, -2)).float()), dim=-1)
    probs = torch.softmax(scores, dim=-1).to(q.dtype)  # [B, kv_heads, rep, P + step + 1]
    prompt_len = prompt_keys.shape[2]
    prompt_out = torch.matmul(_scatter_to_groups(probs[..., :prompt_len], groups, len(prompt_kv)), prompt_values)
    out = _gather_from_groups(prompt_out, groups) + torch.matmul(probs[..., prompt_len:], own_values)
    return out.reshape(slots, heads, 1, hd)


@torch.no_grad()
def lean_generate(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    sampling: SamplingConfig,
    eos_token_id: int,
    pad_token_id: int,
    *,
    drop_finished: bool = True,
    weights: _Body | None = None,
) -> tuple[Tensor, Tensor]:
    """Sample completions like `rloo.rollout.generate` (HF generate) with a hand-written KV-cache loop.

    prompt_ids, prompt_mask: `[N, P]` left-padded. Returns completion ids `[N, T]` (T <= max_new_tokens; stops
    once every row has ended; pad_token_id after a row's EOS) and generation log-probs `[N, T]` float32:
    log softmax(logits / temperature) of each sampled token (temperature 1 when greedy), 0 after the row ended.
    drop_finished=False keeps ended rows in the forward, fed pad as generate does (the reference the tests compare
    against); either way only live rows draw, in row order, so both settings consume the random stream alike.
    weights: `prepared_weights(model, rows)` made before, for several calls with the same weights; None: made here.
    """
    if sampling.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {sampling.max_new_tokens}")
    body = weights if weights is not None else prepared_weights(model, len(prompt_ids))
    num_rows, prompt_len = prompt_ids.shape
    device, max_new = prompt_ids.device, sampling.max_new_tokens
    stop_id = eos_token_id if sampling.stop_at_eos else None

    cos_table, sin_table = rotary_tables(body.rotary, prompt_len + max_new, body.embed.dtype)  # [S, rot]
    next_position = position_ids_for(prompt_mask)[:, -1] + 1  # [N] as generate: the last prompt position + 1

    # one prefill per distinct prompt; its cache is shared by the prompt's rows, each row caching its own completion
    first, inverse = _prompt_groups(prompt_ids, prompt_mask)  # [U], [N]
    prompt_kvs, group_logits = _prefill(body, prompt_ids[first], prompt_mask[first], cos_table, sin_table)
    logits = group_logits[inverse]  # [N, V]
    member = _group_members(inverse)  # [N]
    group_size = int(member.max()) + 1
    group_masks = prompt_mask[first]  # [U, P]
    if len(first) * group_size > 2 * num_rows:  # groups of very unequal sizes: padding them would cost more than
        prompt_kvs = [kv[inverse] for kv in prompt_kvs]  # a copy of the prompt's cache per row
        inverse, member, group_size, group_masks = torch.arange(num_rows, device=device), member * 0, 1, prompt_mask
    prompt_bias = torch.zeros(group_masks.shape, dtype=torch.float32, device=device)
    prompt_bias.masked_fill_(group_masks == 0, float("-inf"))  # [U, P]
    shape = body.shape
    own_kvs = [
        torch.empty(num_rows, shape.kv_heads, 2, max_new, shape.head_dim, dtype=body.cache_dtype, device=device)
        for _ in body.layers
    ]

    completion_ids = torch.full((num_rows, max_new), pad_token_id, dtype=prompt_ids.dtype, device=device)
    generation_logprobs = torch.zeros(num_rows, max_new, dtype=torch.float32, device=device)
    rows = torch.arange(num_rows, device=device)  # [B] original row of each batch slot
    live = torch.ones(num_rows, dtype=torch.bool, device=device)  # [B] only without dropping: False once ended
    num_live = num_rows  # python int: the loop never syncs to count
    # the slots that draw, in original row order, so the random stream falls on rows as it would without
    # dropping (and as in generate while no row has ended); None: every slot, already in that order
    draw = None
    width = max_new
    for step in range(max_new):
        if draw is None:
            new_tokens, logprobs = sample_tokens(logits, sampling)  # [B]
            drawn_rows, tokens = rows, new_tokens
        else:
            new_tokens, logprobs = sample_tokens(logits.index_select(0, draw), sampling)  # [A]
            drawn_rows = rows.index_select(0, draw)
            tokens = torch.full_like(rows, pad_token_id).index_copy_(0, draw, new_tokens)  # ended rows: pad
        completion_ids[drawn_rows, step] = new_tokens
        generation_logprobs[drawn_rows, step] = logprobs
        if step == max_new - 1:
            break

        ended = None if stop_id is None else new_tokens == stop_id  # [A]
        num_ended = 0 if ended is None else int(ended.sum())
        if num_ended:
            num_live -= num_ended
            if num_live == 0:
                width = step + 1
                break
            ended_slots = ended.nonzero().squeeze(1) if draw is None else draw[ended]
            if drop_finished:
                # the batch keeps its first B' slots: live rows from the tail move into the ended slots below B',
                # so a drop copies only the moved rows, and every cache stays a contiguous prefix of its buffer
                gone = torch.zeros(len(rows), dtype=torch.bool, device=device).index_fill_(0, ended_slots, True)
                holes = gone[:num_live].nonzero().squeeze(1)  # [M] ended slots below B'
                movers = (~gone[num_live:]).nonzero().squeeze(1) + num_live  # [M] live slots from B' on
                state = [tokens, rows, next_position, *own_kvs]
                for tensor in state:
                    tensor.index_copy_(0, holes, tensor.index_select(0, movers))
                tokens, rows, next_position, *own_kvs = (tensor[:num_live] for tensor in state)
                draw = rows.argsort()
            else:
                live[ended_slots] = False
                draw = live.nonzero().squeeze(1)

        # one decode step: the token just drawn goes into each slot's own cache at position `step`
        hidden = F.embedding(tokens[:, None], body.embed)  # [B, 1, D]
        cos, sin = cos_table[next_position][:, None], sin_table[next_position][:, None]  # [B, 1, rot]
        groups = _Groups(inverse[rows], member[rows], group_size, prompt_bias, step)
        for layer, prompt_kv, own_kv in zip(body.layers, prompt_kvs, own_kvs):
            attend = partial(_decode_attend, prompt_kv=prompt_kv, own_kv=own_kv, groups=groups)
            hidden = body.layer_forward(hidden, layer, shape, cos, sin, attend)
        logits = _last_logits(body, hidden)  # [B, V]
        next_position += 1
    return completion_ids[:, :width], generation_logprobs[:, :width]
