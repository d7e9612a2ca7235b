"""A lean KV-cache sampling loop for causal LMs, in place of HF `generate` in the rollout.

On small models HF `generate` spends about 30% of its time in framework code (cache objects, mask building,
logits processors, stopping criteria). This loop runs the model's own weights through the arithmetic of its
transformers implementation, which the model's family writes out (`Family.decode_body` in rloo/families/: GPT-NeoX,
Llama, Qwen2, Qwen3, Mistral, Gemma 2): prefill each distinct left-padded prompt in one forward, then one token per
step, dropping rows from the batch once they end. Per layer the cache is in two parts, each holding a head's keys
and then its values (so reading the keys reads no value bytes): the prompt's (`[U, kv_heads, 2, P, head_dim]`, one
per distinct prompt, read once per step by all k rows of the prompt) and each row's own completion
(`[B, kv_heads, 2, max_new, head_dim]`); one softmax spans both (in float32 on CPU through the fused attention kernel,
the two parts merged by their log-sum-exps). On CPU, float32 linear layers run through oneDNN, their weights
reordered into its blocked layout once per rollout or evaluation pass (`prepared_weights`); `rollout_precision=bf16`
reads bfloat16 copies instead.
The draws themselves (rloo.generation.sampling.sample_tokens) follow HF's order. On a GPU (`sampling.cuda_graph`) the
rollout runs the same step at static shapes, replayed as a CUDA graph (rloo.generation.static_decode).
Plain torch + transformers; no Lightning or Hydra.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from rloo import families
from rloo.families.base import DecodeBody, Proj
from rloo.generation.sampling import position_ids_for, sample_tokens
from rloo.models.loading import FP32Head
from rloo.models.sharding import weights_partitioned

# rotary types whose frequencies depend on the sequence length (HF recomputes them per call): not in this loop
LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")


class Prepared(NamedTuple):
    """A model's weights as the loop reads them: its family's body, the LM head's product and the cache dtype."""

    body: DecodeBody
    head: Callable[[Tensor], Tensor]  # final-normed hidden `[B, D]` -> logits `[B, V]` (`_head`)
    cache_dtype: torch.dtype


def supports_lean_decode(model, sequence_length: int | None) -> bool:
    return why_not_lean_decode(model, sequence_length) is None


def _linears(model, family) -> list[torch.nn.Module]:
    """Every linear layer of the body that the loop reads the weights of: the family's projections."""
    layers = model.base_model.layers
    return [module for name, module in layers.named_modules() if name.rsplit(".", 1)[-1] in family.projections]


def why_not_lean_decode(model, sequence_length: int | None) -> str | None:
    """None for a causal LM of a family with decode layer code (rloo/families/), over rows of `sequence_length`
    tokens (prompt + new tokens), whose rotary frequencies do not depend on the length (dynamic and longrope scaling
    recompute them per call), whose layers are plain linear layers: the loop reads their weights, so an
    adapter-wrapped layer (LoRA) would be sampled without its adapter, and a partitioned weight would be read as
    this rank's part. Else why not."""
    if reason := families.why_not(model, sequence_length):
        return reason
    family = families.family_of(model)
    if not isinstance(model, family.causal_lm):
        return f"it samples from {family.causal_lm.__name__}, not {type(model).__name__}"
    rope_type = model.base_model.rotary_emb.rope_type
    if any(kind in rope_type for kind in LENGTH_DEPENDENT_ROPE):
        return f"rope_type {rope_type} recomputes its frequencies per length, which it does not"
    if weights_partitioned(model):  # FSDP2 / ZeRO-3: each rank holds a part of each weight
        return "the weights are partitioned across ranks"
    if not all(type(module) is torch.nn.Linear for module in _linears(model, family)):
        return "its linear layers are wrapped (LoRA adapters), which it would read without them"
    return None


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


def onednn_bf16_applies(weight: Tensor) -> bool:
    """Whether bfloat16 products of this weight run through oneDNN: on CPU, outside autocast, where oneDNN has
    bfloat16 kernels for this CPU (AVX-512 BF16 or AMX; elsewhere it would emulate them slowly)."""
    return (
        weight.device.type == "cpu"
        and not torch.is_autocast_enabled("cpu")
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


def _bfloat16_product(product: Callable, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x `[.., in]` float32 through a bfloat16 weight: the product in bfloat16, the result and the bias in float32."""
    out = product(x.to(torch.bfloat16), weight, None).float()
    return out if bias is None else out + bias


def _bf16_linear(module, rows: int) -> Proj:
    """The linear product from a bfloat16 copy of the module's weight (`rollout_precision=bf16`), float32 in and out:
    the product reads half the bytes, as vLLM-based trainers' samplers read bfloat16 weights. The copy is made once
    per rollout (`prepared_weights`) and freed after it; on CPU it is reordered for oneDNN where `onednn_bf16_applies`
    (0.57x the float32 product's time for a 768 x 3072 layer at 8 rows, 2 cores, AMD EPYC), else F.linear."""
    weight = module.weight.detach().to(torch.bfloat16)
    if onednn_bf16_applies(weight):
        return Proj(
            torch.ops.mkldnn._reorder_linear_weight(weight, rows),
            module.bias,
            partial(_bfloat16_product, _onednn_linear),
        )
    return Proj(weight, module.bias, partial(_bfloat16_product, F.linear))


def _linear(module, rows: int, bf16: bool = False) -> Proj:
    """The linear product the loop uses for a module: where `onednn_applies`, oneDNN's, with the weight reordered
    into oneDNN's blocked layout for products of about `rows` rows; else F.linear on the module's weight.

    oneDNN's float32 linear on a plain weight repacks it on every call: at 8 rows it read the 160m-class layers at
    about half the memory bandwidth (2 cores, AMD EPYC, torch 2.13: the 49 products of one decode step took 29-33 ms
    from plain weights, 18 ms from reordered ones, and F.linear (MKL) 53-63 ms). The reorder copies the weights once
    per rollout or evaluation pass (`prepared_weights`; they change with every update), 0.16-0.22 s for
    Pythia-160m's, and the copies are freed once it has sampled. Results are those of oneDNN's product on the plain
    weight (bit-identical at 3 rows and more) and differ from F.linear's in the last bits (about 2e-6 on unit-scale
    outputs). Sampling is no-grad, so autograd is not needed. Elsewhere (GPU, bfloat16, autocast, a torch without
    oneDNN) the loop keeps F.linear. bf16: float32 weights are read from bfloat16 copies (`_bf16_linear`)."""
    if bf16 and module.weight.dtype == torch.float32:
        return _bf16_linear(module, rows)
    if onednn_applies(module.weight):
        packed = torch.ops.mkldnn._reorder_linear_weight(module.weight.detach(), rows)
        return Proj(packed, module.bias, _onednn_linear)
    return Proj(module.weight, module.bias, F.linear)


def prepared_weights(model, rows: int, bf16: bool = False) -> Prepared:
    """The model's weights as the loop reads them, its linear products set up for batches of about `rows` rows
    (`_linear`: on CPU in float32, reordered copies; bf16: every float32 linear layer and the LM head from bfloat16
    copies, `rollout_precision=bf16`). Made once for every `lean_generate` call of one rollout or evaluation pass;
    made again once the weights change."""
    family = families.family_of(model)
    body = family.decode_body(model, partial(_linear, rows=rows, bf16=bf16))
    return Prepared(body, _head(model, rows, bf16), _linear_dtype(_linears(model, family)[0].weight))


def rotary_tables(rotary: torch.nn.Module, length: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and signed sin `[length, rotary_dims]` for positions 0..length-1, as HF's rotary embeddings make them
    from `inv_freq` and `attention_scaling`.

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


def _head(model, rows: int, bf16: bool = False) -> Callable[[Tensor], Tensor]:
    """The LM head, through the loop's product (`_linear`) where that is the head's own arithmetic: a plain linear
    head, or an FP32Head whose weights and input are float32 already (a float32 body), outside autocast. Any other
    head (FP32Head upcasting bfloat16) runs as is."""
    head = model.lm_head
    as_linear = type(head) is torch.nn.Linear or (
        isinstance(head, FP32Head)
        and head.weight.dtype == model.get_input_embeddings().weight.dtype == torch.float32
        and not torch.is_autocast_enabled(head.weight.device.type)
    )
    return _linear(head, rows, bf16) if as_linear else head


def _embed(body: DecodeBody, ids: Tensor) -> Tensor:
    """The input embedding `[.., D]`, scaled where the family scales it (Gemma: by sqrt(D) in the weights' dtype)."""
    hidden = F.embedding(ids, body.embed)
    return hidden if body.embed_scale is None else hidden * body.embed_scale.to(body.embed.dtype)


def _last_logits(weights: Prepared, hidden: Tensor) -> Tensor:
    """LM head on the last position only: `[B, T, D]` -> `[B, V]`, soft-capped where the family caps its logits."""
    logits = weights.head(weights.body.final_norm(hidden[:, -1]))
    cap = weights.body.logit_softcap
    return logits if cap is None else torch.tanh(logits / cap) * cap


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


def _soft_cap(scores: Tensor, cap: float | None) -> Tensor:
    """cap * tanh(scores / cap) where the family soft-caps its attention scores (Gemma 2), else the scores."""
    return scores if cap is None else torch.tanh(scores / cap) * cap


def masked_attention(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor, shape) -> Tensor:
    """q `[B, H, M, hd]` over keys and values `[B, kv_heads, L, hd]` where the bool `mask` `[B, 1, M, L]` allows
    (True): SDPA, or, where the family soft-caps its scores (Gemma 2; SDPA has no cap), HF's eager attention in its
    order of operations."""
    if shape.softcap is None:
        gqa = shape.kv_heads != shape.heads
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=shape.scale, enable_gqa=gqa)
    rep = shape.heads // shape.kv_heads
    keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    scores = _soft_cap(torch.matmul(q, keys.transpose(-1, -2)) * shape.scale, shape.softcap)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype), values)


def _prefill(weights: Prepared, prompt_ids: Tensor, prompt_mask: Tensor, cos_table: Tensor, sin_table: Tensor):
    """One forward over left-padded prompts `[U, P]`: per layer the prompt's keys and values
    `[U, kv_heads, 2, P, hd]`, and the logits `[U, V]` after the last prompt token."""
    body = weights.body
    hidden = _embed(body, prompt_ids)  # [U, P, D]
    positions = position_ids_for(prompt_mask)  # [U, P]
    cos, sin = cos_table[positions], sin_table[positions]  # [U, P, rot]
    mask = _prefill_mask(prompt_mask)
    shape, caches = body.shape, []
    hd = shape.head_dim

    def attend(q: Tensor, kv: Tensor) -> Tensor:  # the whole prompt at once: store its k|v, attend causally
        cache = caches[-1]
        cache.copy_(kv.unflatten(-1, (2, hd)).transpose(2, 3))  # [U, kv_heads, P, 2, hd] -> [U, kv_heads, 2, P, hd]
        return masked_attention(q, cache[:, :, 0], cache[:, :, 1], mask, shape)

    for layer in body.layers:
        size = (len(prompt_ids), shape.kv_heads, 2, prompt_ids.shape[1], hd)
        caches.append(torch.empty(size, dtype=weights.cache_dtype, device=prompt_ids.device))
        hidden = body.layer_forward(hidden, layer, shape, cos, sin, attend)
    return caches, _last_logits(weights, hidden)


class _Groups(NamedTuple):
    """Which prompt group's cache each batch slot reads, for one decode step."""

    slot_group: Tensor  # [B] the slot's prompt group
    slot_member: Tensor  # [B] its rank within the group
    size: int  # rows per group, the largest
    prompt_bias: Tensor | None  # [B, 1, 1, P] float32: 0 on the slot's prompt tokens, -inf on its left padding
    step: int | Tensor  # the completion position being written: int, each own cache holds 0..step; a `[1]` tensor
    # (the static-shape step, rloo.generation.static_decode): the whole cache is read, positions past it masked by
    # own_bias
    regular: bool  # slot b is member b % size of group b // size: grouping is a reshape, no index copies
    own_bias: Tensor | None = None  # [max_new] float32 with a tensor step: 0 up to the step, -inf after it; with
    # own_slots `[B, 1, 1, W]`: 0 up to each slot's own, -inf after it
    group_bias: Tensor | None = None  # [U, 1, 1, P] float32: prompt_bias per group (the fused kernel's mask)
    own_slots: Tensor | None = None  # [B] where each slot writes in its own cache, where rows differ in length (a
    # continued episode, rloo.generation.lean_sampler); the cache is read up to the longest, own_bias masks the rest


def _scatter_to_groups(x: Tensor, groups: _Groups, num_groups: int) -> Tensor:
    """`[B, kv_heads, rep, n]` -> `[U, kv_heads, size * rep, n]`: each slot's rows in its group's block (zeros where
    a group has fewer live rows), so one matmul per group meets the group's shared prompt cache."""
    slots, kv_heads, rep, n = x.shape
    if groups.regular:
        grouped = x.view(num_groups, groups.size, kv_heads, rep, n)
    else:
        grouped = x.new_zeros(num_groups, groups.size, kv_heads, rep, n)
        grouped[groups.slot_group, groups.slot_member] = x
    return grouped.transpose(1, 2).reshape(num_groups, kv_heads, groups.size * rep, n)


def _gather_from_groups(x: Tensor, groups: _Groups) -> Tensor:
    """The inverse of `_scatter_to_groups`: `[U, kv_heads, size * rep, n]` -> `[B, kv_heads, rep, n]`."""
    num_groups, kv_heads, _, n = x.shape
    per_member = x.view(num_groups, kv_heads, groups.size, -1, n).transpose(1, 2)  # [U, size, kv_heads, rep, n]
    if groups.regular:
        return per_member.flatten(0, 1)
    return per_member[groups.slot_group, groups.slot_member]


def _scores(keys: Tensor, q: Tensor) -> Tensor:
    """q.k for queries q `[.., n, hd]` against keys `[.., T, hd]`: `[.., n, T]`, computed as keys @ q^T."""
    return torch.matmul(keys, q.transpose(-1, -2)).transpose(-1, -2)


# the CPU's fused attention kernel, which also returns each query's log-sum-exp (torch >= 2.3)
_FUSED_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def fused_attention_applies(q: Tensor, groups: _Groups, softcap: float | None) -> bool:
    """Whether a decode step attends through the CPU's fused kernel (`_fused_decode_attend`): float32 on CPU, the
    eager loop (an int step), scores without a soft cap (the kernel has none: Gemma 2 keeps the matmul form)."""
    return (
        _FUSED_CPU is not None
        and q.device.type == "cpu"
        and q.dtype == torch.float32
        and (groups.own_bias is None or groups.own_slots is not None)
        and softcap is None
    )


def _fused_decode_attend(q: Tensor, prompt_kv: Tensor, own_kv: Tensor, groups: _Groups, scale: float) -> Tensor:
    """`_decode_attend`'s result from the CPU's fused attention kernel, called twice: the group's queries over its
    prompt cache, each slot's over its own completion; the two parts are merged by their log-sum-exps
    (softmax over both = each part's softmax weighted by exp(lse_part - lse_both)). Each kernel reads its keys and
    values once in blocks, with no scores tensor between ops. q `[B, kv_heads, rep, hd]` (scaled in the kernel)."""
    slots, kv_heads, rep, hd = q.shape
    prompt_q = _scatter_to_groups(q, groups, len(prompt_kv))  # [U, kv_heads, size * rep, hd]
    prompt_out, prompt_lse = _FUSED_CPU(
        prompt_q, prompt_kv[:, :, 0], prompt_kv[:, :, 1], attn_mask=groups.group_bias, scale=scale
    )
    prompt_out = _gather_from_groups(prompt_out, groups)  # [B, kv_heads, rep, hd]
    prompt_lse = _gather_from_groups(prompt_lse[..., None], groups)[..., 0]  # [B, kv_heads, rep]
    own_mask = groups.own_bias if groups.own_slots is not None else None
    own_out, own_lse = _FUSED_CPU(q, own_kv[:, :, 0], own_kv[:, :, 1], attn_mask=own_mask, scale=scale)
    both = torch.logaddexp(prompt_lse, own_lse)
    prompt_weight, own_weight = (prompt_lse - both).exp_()[..., None], (own_lse - both).exp_()[..., None]
    return prompt_out.mul_(prompt_weight).add_(own_out.mul_(own_weight))


def _decode_attend(
    q: Tensor, kv: Tensor, prompt_kv: Tensor, own_kv: Tensor, groups: _Groups, scale: float, softcap: float | None
) -> Tensor:
    """One new token per slot: q `[B, H, 1, hd]` attends to its group's prompt cache `[U, kv_heads, 2, P, hd]`,
    read once for the whole group, and to its own completion so far (`own_kv` `[B, kv_heads, 2, T, hd]`, where
    the new k|v `[B, kv_heads, 1, 2*hd]` is stored first).

    One softmax over both parts (their scores concatenated), so the result is attention over prompt + completion,
    as if each row held a copy of its prompt's cache; with k rows per prompt the prompt's keys and values are read
    once instead of k times, and not copied k times. Scores are q.k * scale, soft-capped where `softcap` is set."""
    step, hd = groups.step, q.shape[-1]
    if groups.own_slots is not None:  # rows at different lengths: each writes its own slot
        slots = torch.arange(len(own_kv), device=own_kv.device)
        own_kv[slots, :, :, groups.own_slots] = kv[:, :, 0].unflatten(-1, (2, hd))
        own_kv = own_kv[:, :, :, : groups.own_bias.shape[-1]]
    elif groups.own_bias is None:
        own_kv[:, :, :, step] = kv[:, :, 0].unflatten(-1, (2, hd))
        own_kv = own_kv[:, :, :, : step + 1]
    else:  # a static shape: written at the step tensor, read whole
        own_kv.index_copy_(3, step, kv[:, :, :1].unflatten(-1, (2, hd)).transpose(2, 3))
    slots, heads = q.shape[:2]
    kv_heads = own_kv.shape[1]
    if fused_attention_applies(q, groups, softcap):
        grouped = q.reshape(slots, kv_heads, heads // kv_heads, hd)
        return _fused_decode_attend(grouped, prompt_kv, own_kv, groups, scale).reshape(slots, heads, 1, hd)
    q = (q * scale).reshape(slots, kv_heads, heads // kv_heads, hd)  # [B, kv_heads, rep, hd]
    own_keys, own_values = own_kv[:, :, 0], own_kv[:, :, 1]  # [B, kv_heads, T, hd]
    prompt_keys, prompt_values = prompt_kv[:, :, 0], prompt_kv[:, :, 1]  # [U, kv_heads, P, hd]
    # scores as keys @ q^T: a matrix-vector product over the keys as they lie (on CPU a quarter faster than q @ K^T)
    prompt_scores = _scores(prompt_keys, _scatter_to_groups(q, groups, len(prompt_kv)))
    prompt_scores = _soft_cap(_gather_from_groups(prompt_scores, groups), softcap).float()
    if groups.prompt_bias is not None:
        prompt_scores = prompt_scores + groups.prompt_bias
    own_scores = _soft_cap(_scores(own_keys, q), softcap).float()
    if groups.own_bias is not None:
        own_scores = own_scores + groups.own_bias
    scores = torch.cat((prompt_scores, own_scores), dim=-1)
    probs = torch.softmax(scores, dim=-1).to(q.dtype)  # [B, kv_heads, rep, P + step + 1]
    prompt_len = prompt_keys.shape[2]
    prompt_out = torch.matmul(_scatter_to_groups(probs[..., :prompt_len], groups, len(prompt_kv)), prompt_values)
    out = _gather_from_groups(prompt_out, groups) + torch.matmul(probs[..., prompt_len:], own_values)
    return out.reshape(slots, heads, 1, hd)


def _prefill_groups(weights: Prepared, prompt_ids: Tensor, prompt_mask: Tensor, cos_table: Tensor, sin_table: Tensor):
    """The prefill of each distinct prompt `[U]` and how rows `[N]` map onto it: per layer the prompt caches, the
    first logits of every row `[N, V]`, each row's group `[N]` and rank in it `[N]`, the largest group size, and
    the prompt bias `[U, P]` (0 on tokens, -inf on left padding; None without padding). Groups of very unequal
    sizes (padding them would cost more than a copy of the prompt's cache per row) get a copy per row instead."""
    num_rows, device = len(prompt_ids), prompt_ids.device
    first, inverse = _prompt_groups(prompt_ids, prompt_mask)  # [U], [N]
    prompt_kvs, group_logits = _prefill(weights, prompt_ids[first], prompt_mask[first], cos_table, sin_table)
    member = _group_members(inverse)  # [N]
    group_size = int(member.max()) + 1
    group_masks = prompt_mask[first]  # [U, P]
    logits = group_logits[inverse]  # [N, V]
    if len(first) * group_size > 2 * num_rows:
        prompt_kvs = [kv[inverse] for kv in prompt_kvs]
        inverse, member, group_size, group_masks = torch.arange(num_rows, device=device), member * 0, 1, prompt_mask
    prompt_bias = None
    if not bool(group_masks.bool().all()):  # left padding somewhere
        prompt_bias = torch.zeros(group_masks.shape, dtype=torch.float32, device=device)
        prompt_bias.masked_fill_(group_masks == 0, float("-inf"))  # [U, P]
    return prompt_kvs, logits, inverse, member, group_size, prompt_bias


def _slot_groups(inverse: Tensor, member: Tensor, size: int, prompt_bias: Tensor | None, rows: Tensor) -> _Groups:
    """The groups of the slots holding `rows` `[B]` (original row of each slot), made when the slots change. Regular
    where slot b holds member b % size of group b // size of all U groups (the rollout's blocks of k, before any row
    is dropped). prompt_bias: `[U, P]` or None."""
    slot_group, slot_member = inverse[rows], member[rows]
    slots = torch.arange(len(rows), device=rows.device)
    regular = len(rows) == (int(inverse.max()) + 1) * size and bool(
        ((slot_group == slots // size) & (slot_member == slots % size)).all()
    )
    bias = None if prompt_bias is None else prompt_bias[slot_group][:, None, None]  # [B, 1, 1, P]
    group_bias = None if prompt_bias is None else prompt_bias[:, None, None]  # [U, 1, 1, P]
    return _Groups(slot_group, slot_member, size, bias, 0, regular, group_bias=group_bias)


def _drop_rows(ended_slots: Tensor, num_live: int, *state: Tensor) -> list[Tensor]:
    """Each tensor of `state` (batch-first) without the ended slots. The batch keeps its first B' = num_live slots:
    live rows from the tail move into the ended slots below B', so a drop copies only the moved rows, and every
    cache stays a contiguous prefix of its buffer."""
    gone = torch.zeros(len(state[0]), dtype=torch.bool, device=ended_slots.device).index_fill_(0, ended_slots, True)
    holes = gone[:num_live].nonzero().squeeze(1)  # [M] ended slots below B'
    movers = (~gone[num_live:]).nonzero().squeeze(1) + num_live  # [M] live slots from B' on
    for tensor in state:
        tensor.index_copy_(0, holes, tensor.index_select(0, movers))
    return [tensor[:num_live] for tensor in state]


def _draw(logits, rows, draw, sampling, pad_token_id: int, step: int, outputs) -> tuple[Tensor, Tensor]:
    """The live slots draw their next tokens (`draw`: those slots in original row order; None: every slot, already
    in that order), written at `step` into outputs (completion ids `[N, T]`, log-probs `[N, T]`): the drawn tokens
    `[A]`, and every slot's next input `[B]` (pad where a row has ended)."""
    completion_ids, generation_logprobs = outputs
    if draw is None:
        new_tokens, logprobs = sample_tokens(logits, sampling)  # [B]
        drawn_rows, tokens = rows, new_tokens
    else:
        new_tokens, logprobs = sample_tokens(logits.index_select(0, draw), sampling)  # [A]
        drawn_rows = rows.index_select(0, draw)
        tokens = torch.full_like(rows, pad_token_id).index_copy_(0, draw, new_tokens)  # ended rows: pad
    completion_ids[drawn_rows, step] = new_tokens
    generation_logprobs[drawn_rows, step] = logprobs
    return new_tokens, tokens


def _decode_step(weights: Prepared, hidden, cos, sin, prompt_kvs, own_kvs, groups: _Groups) -> Tensor:
    """Every layer over one new token per slot (hidden `[B, 1, D]`, cos, sin `[B, 1, rot]`), each storing the
    token's k|v in the slot's own cache: the logits `[B, V]` of the next token."""
    body = weights.body
    shape = body.shape
    for layer, prompt_kv, own_kv in zip(body.layers, prompt_kvs, own_kvs):
        attend = partial(
            _decode_attend,
            prompt_kv=prompt_kv,
            own_kv=own_kv,
            groups=groups,
            scale=shape.scale,
            softcap=shape.softcap,
        )
        hidden = body.layer_forward(hidden, layer, shape, cos, sin, attend)
    return _last_logits(weights, hidden)
