"""The forward passes over prompt + completion rows that every phase shares: completion log-probs (the packed
shared-prefix forward of a group, the chunked LM head whose backward recomputes its logits), reward scores at the last
real token, and PPO's token values. Plain torch over transformers models, no Lightning or Hydra.

Token layout, as rloo/generation/rollout.py's: prompts left-padded to P, completions right-padded to T, so row i is
`[pad.. prompt | completion ..pad]` and position P + t holds completion token t.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformers import PreTrainedModel

from rloo import families
from rloo.generation.sampling import position_ids_for
from rloo.models.sharding import weights_partitioned
from rloo.objectives import entropy_from_logits, token_logprobs

LOGIT_CHUNK_ELEMENTS = (
    2**24
)  # logits materialised at once by the log-prob passes: 64 MB of float32, whatever the vocabulary


def completion_logits(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, completion_len: int) -> Tensor:
    """Logits predicting each completion token, `[N, T, V]`: only the last T+1 positions go through the LM head.
    (The log-prob passes below never build this whole tensor; it stays for callers that need every logit.)"""
    output = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_for(attention_mask),
        logits_to_keep=completion_len + 1,
        use_cache=False,
    )
    return output.logits[:, :-1]


def _head_is_plain(model: PreTrainedModel) -> bool:
    """The logits are head(hidden), soft-capped where the config caps them (`_logit_head`): no scaling after the head
    (Cohere's logit_scale) that only the model's own forward applies."""
    return (
        isinstance(model.get_output_embeddings(), torch.nn.Linear)  # not an adapter-wrapped head
        and getattr(model.config, "logit_scale", 1.0) in (None, 1.0)
    )


class SoftCappedHead(torch.nn.Module):
    """cap * tanh(head(h) / cap), in the head's dtype, as the models with `final_logit_softcapping` (Gemma 2) cap their
    logits; `weight`, `bias` and `out_features` are the head's, for the chunked log-prob pass."""

    def __init__(self, head: torch.nn.Linear, cap: float):
        super().__init__()
        self.head, self.cap = head, cap
        self.weight, self.bias, self.out_features = head.weight, head.bias, head.out_features

    def forward(self, hidden: Tensor) -> Tensor:
        return torch.tanh(self.head(hidden) / self.cap) * self.cap


def _logit_head(model: PreTrainedModel):
    """The LM head as the model's own forward applies it: soft-capped where the config says so."""
    head, cap = model.get_output_embeddings(), getattr(model.config, "final_logit_softcapping", None)
    return SoftCappedHead(head, cap) if cap else head


PACKED_MASK_ATTENTION = ("sdpa", "eager")  # attention implementations that take an arbitrary 4-D mask


def why_not_shared_prefix(model: PreTrainedModel, sequence_length: int | None) -> str | None:
    """None where the packed shared-prefix forward serves `model`'s body (a family of rloo/families/, tested in
    tests/test_rollout.py) for rows of `sequence_length` tokens (prompt + completion); else why not."""
    if reason := families.why_not(model, sequence_length):
        return reason
    if model.config._attn_implementation not in PACKED_MASK_ATTENTION:
        return f"attention {model.config._attn_implementation} takes no 4-D mask (sdpa and eager do)"
    return None


def shares_prefix(
    model: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, group_size: int, sequence_length: int | None = None
) -> bool:
    """Rows (of `sequence_length` tokens: None, unknown) come in groups of `group_size` with the same (left-padded)
    prompt, on a body the packed forward supports: then the prompt can run once per group."""
    n = prompt_ids.shape[0]
    if group_size < 2 or n % group_size or why_not_shared_prefix(model, sequence_length) is not None:
        return False
    ids, mask = prompt_ids.view(n // group_size, group_size, -1), prompt_mask.view(n // group_size, group_size, -1)
    return bool((ids == ids[:, :1]).all() & (mask == mask[:, :1]).all())  # one host sync


def _block_costs(model: PreTrainedModel) -> tuple[int, int]:
    """(multiply-adds of one block's linear layers per token, query width heads x head_dim): what a token costs in
    the linear layers, and what each (query, key) pair costs in attention (scores and weighted sum: 2 x width)."""
    config = model.config
    width = config.num_attention_heads * (
        getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    )
    block = model.base_model.layers[0]
    weights = sum(m.weight.numel() for m in block.modules() if isinstance(m, torch.nn.Linear))
    return weights, width


def packing_pays(model: PreTrainedModel, prompt_len: int, completion_len: int, group_size: int) -> bool:
    """Whether one packed row `[prompt | k completions]` costs fewer multiply-adds than k plain rows
    `[prompt | completion]`. Per layer, a row of L tokens costs about W*L in the linear layers (W: one block's
    linear weights) and 2*width*L^2 in dense attention, where the mask skips no work. Packing saves (k-1)*P tokens
    of linear work and pays (P + kT)^2 of attention against k(P + T)^2: it wins at long prompts and short
    completions (TL;DR: P=400, T=53), and loses as completions grow (P=8, T=128, k=4 at the `small` preset)."""
    weights, width = _block_costs(model)
    packed, plain = prompt_len + group_size * completion_len, prompt_len + completion_len
    return weights * packed + 2 * width * packed**2 < group_size * (weights * plain + 2 * width * plain**2)


def packed_attention(prompt_mask: Tensor, completion_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Who attends to whom in a packed group row `[prompt | completion 1 | ... | completion k]`, and the positions.

    prompt_mask `[G, P]` (left-padded), completion_mask `[G, k, T]` (right-padded). Returns a bool mask
    `[G, 1, L, L]` (L = P + k*T; True: may attend) and position ids `[G, L]`. A query sees earlier real tokens of
    the prompt and of its own completion, never another completion; a pad query sees itself only, so no row of
    the softmax is empty. Completion j's token t sits at position (real prompt tokens) + t, as in its own row.
    """
    groups, k, length = completion_mask.shape
    prompt_len = prompt_mask.shape[1]
    segment = torch.cat(
        [
            torch.zeros(prompt_len, dtype=torch.long, device=prompt_mask.device),
            torch.arange(1, k + 1, device=prompt_mask.device).repeat_interleave(length),
        ]
    )  # [L]
    key_real = torch.cat([prompt_mask, completion_mask.reshape(groups, -1)], 1).bool()  # [G, L]
    width = segment.shape[0]
    causal = torch.ones(width, width, dtype=torch.bool, device=prompt_mask.device).tril()
    same_or_prompt = (segment[None, :] == segment[:, None]) | (segment[None, :] == 0)  # [L, L]
    mask = (causal & same_or_prompt)[None] & key_real[:, None, :]
    mask |= torch.eye(width, dtype=torch.bool, device=prompt_mask.device)
    prompt_positions = position_ids_for(prompt_mask)  # [G, P]
    completion_positions = prompt_mask.sum(1, keepdim=True) + torch.arange(length, device=prompt_mask.device).repeat(k)
    return mask[:, None], torch.cat([prompt_positions, completion_positions], 1)


def body_hidden_states(
    model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, completion_len: int, group_size: int = 1
) -> tuple[Tensor, Tensor]:
    """The transformer body's last hidden states of prompt + completion rows: at the last prompt position `[N, D]`
    and at every completion position `[N, T, D]`.

    When the rows come in groups of `group_size` sharing a prompt (prompt-major, as a rollout lays them) and packing
    costs less than the plain rows (packing_pays), each group runs as one packed row
    `[prompt | completion 1 | ... | completion k]` whose mask lets every completion see the prompt and itself
    (packed_attention): the prompt is computed once, every weight sees all tokens in one matmul, and under autograd
    the k completions' gradients meet in the shared prompt. Same values as one forward of every row.
    """
    body, prompt_len = model.base_model, input_ids.shape[1] - completion_len
    prompt_ids, prompt_mask = input_ids[:, :prompt_len], attention_mask[:, :prompt_len]
    # the cheap questions first (a family's body, where packing pays), then the rows' prompts (a host sync)
    packed = (
        group_size > 1
        and why_not_shared_prefix(model, input_ids.shape[1]) is None
        and packing_pays(model, prompt_len, completion_len, group_size)
        and shares_prefix(model, prompt_ids, prompt_mask, group_size, input_ids.shape[1])
    )
    if not packed:
        hidden = body(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids_for(attention_mask),
            use_cache=False,
        ).last_hidden_state
        return hidden[:, prompt_len - 1], hidden[:, prompt_len:]
    k, groups = group_size, input_ids.shape[0] // group_size
    packed_ids = torch.cat([input_ids[::k, :prompt_len], input_ids[:, prompt_len:].reshape(groups, -1)], 1)  # [G, L]
    mask, positions = packed_attention(
        attention_mask[::k, :prompt_len], attention_mask[:, prompt_len:].reshape(groups, k, completion_len)
    )
    if model.config._attn_implementation == "eager":  # eager adds the mask to the scores
        mask = torch.zeros(mask.shape, dtype=model.dtype, device=mask.device).masked_fill_(
            ~mask, torch.finfo(model.dtype).min
        )
    hidden = body(input_ids=packed_ids, attention_mask=mask, position_ids=positions, use_cache=False).last_hidden_state
    completion = hidden[:, prompt_len:].reshape(groups * k, completion_len, -1)  # [N, T, D]
    return hidden[:, prompt_len - 1].repeat_interleave(k, 0), completion


def completion_hidden_states(
    model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, completion_len: int, group_size: int = 1
) -> Tensor:
    """The hidden states at the positions that predict each completion token, as one contiguous `[N*T, D]`."""
    last_prompt, completion = body_hidden_states(model, input_ids, attention_mask, completion_len, group_size)
    hidden = torch.cat([last_prompt.unsqueeze(1), completion[:, :-1]], 1)
    return hidden.reshape(-1, hidden.shape[-1])


def _head_chunks(
    head, hidden: Tensor, token_ids: Tensor, temperature: float, rows: int, with_entropy: bool
) -> tuple[Tensor, Tensor | None, Tensor]:
    """log p(y), the entropy (or None) and log Z `[R]` of softmax(head(h) / temperature), `rows` rows at a time."""
    logprobs, entropies, log_zs = [], [], []
    for start in range(0, hidden.shape[0], rows):
        logits = head(hidden[start : start + rows]).float()  # [rows, V], fresh: divided in place
        if temperature != 1.0:
            logits.div_(temperature)
        log_z = logits.logsumexp(-1)
        logprobs.append(logits.gather(1, token_ids[start : start + rows, None]).squeeze(1) - log_z)
        if with_entropy:  # H = log Z - sum_v p_v z_v
            entropies.append(log_z - (logits - log_z[:, None]).exp_().mul_(logits).sum(-1))
        log_zs.append(log_z)
    return torch.cat(logprobs), torch.cat(entropies) if with_entropy else None, torch.cat(log_zs)


class _ChunkedHeadLogprobs(torch.autograd.Function):
    """log softmax(head(h) / temperature)[y] with a backward that keeps no logits: each chunk's logits are
    recomputed there, and d log p(y) / d z = onehot(y) - softmax(z) is formed from the saved log Z in one pass."""

    @staticmethod
    def forward(ctx, hidden, token_ids, head, temperature, rows, with_entropy, weight, bias):
        logprobs, entropy, log_z = _head_chunks(head, hidden, token_ids, temperature, rows, with_entropy)
        entropy = entropy if with_entropy else logprobs.new_empty(0)
        ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(hidden, token_ids, log_z)
        ctx.head, ctx.temperature, ctx.rows = head, temperature, rows
        device = hidden.device.type
        ctx.autocast = (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):  # the entropy is a metric: no gradient
        hidden, token_ids, log_z = ctx.saved_tensors
        head, temperature, rows = ctx.head, ctx.temperature, ctx.rows
        wanted = [hidden.requires_grad] + [p is not None and p.requires_grad for p in (head.weight, head.bias)]
        grad_hidden = torch.empty_like(hidden) if wanted[0] else None
        grad_weight = grad_bias = None
        device, enabled, dtype = ctx.autocast
        for start in range(0, hidden.shape[0], rows):
            end = min(start + rows, hidden.shape[0])
            h = hidden[start:end].detach().requires_grad_(wanted[0])
            with torch.enable_grad(), torch.autocast(device, dtype=dtype, enabled=enabled):
                logits = head(h)  # [rows, V]
            with torch.no_grad():
                g = grad_logprobs[start:end, None].float()
                grad_logits = (logits.float() / temperature - log_z[start:end, None]).exp_().mul_(-g)  # -g * softmax
                grad_logits.scatter_add_(1, token_ids[start:end, None], g).div_(temperature)
            inputs = [t for t, w in zip((h, head.weight, head.bias), wanted) if w]
            grads = iter(torch.autograd.grad(logits, inputs, grad_logits.to(logits.dtype)))
            if wanted[0]:
                grad_hidden[start:end] = next(grads)
            if wanted[1]:
                grad_weight = next(grads) if grad_weight is None else grad_weight.add_(next(grads))
            if wanted[2]:
                grad_bias = next(grads) if grad_bias is None else grad_bias.add_(next(grads))
        return grad_hidden, None, None, None, None, None, grad_weight, grad_bias


def chunked_logprobs_and_entropy(
    head,
    hidden: Tensor,
    token_ids: Tensor,
    temperature: float,
    with_entropy: bool = True,
    chunk_elements: int = LOGIT_CHUNK_ELEMENTS,
) -> tuple[Tensor, Tensor | None]:
    """log softmax(head(h) / temperature)[y] and the entropy (detached), row by row of `hidden` `[R, D]`, in chunks of
    about `chunk_elements` logits, so the `[R, V]` logits never exist at once. With gradients, the backward recomputes
    each chunk's logits (one more head matmul) instead of keeping them (_ChunkedHeadLogprobs)."""
    rows = max(1, chunk_elements // head.out_features)
    params = (head.weight, head.bias)
    if not (
        torch.is_grad_enabled() and (hidden.requires_grad or any(p is not None and p.requires_grad for p in params))
    ):
        logprobs, entropy, _ = _head_chunks(head, hidden, token_ids, temperature, rows, with_entropy)
        return logprobs, entropy
    logprobs, entropy = _ChunkedHeadLogprobs.apply(hidden, token_ids, head, temperature, rows, with_entropy, *params)
    return logprobs, entropy if with_entropy else None


def completion_logprobs_and_entropy(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float,
    with_entropy: bool = True,
    group_size: int = 1,
) -> tuple[Tensor, Tensor | None]:
    """The training-style forward of the policy: log pi(y_t | x, y_<t) `[N, T]` at the sampling temperature and
    the per-token entropy of that distribution `[N, T]` (detached), both 0 on padding. The LM head runs on the
    completion positions only, as a contiguous 2-D slice, in chunks (chunked_logprobs_and_entropy); with
    `group_size` k, each prompt runs once per group of k rows (body_hidden_states). A model whose weights are
    partitioned across ranks (rloo.models.sharding) runs its own forward, which gathers them."""
    n, t = completion_ids.shape
    if not _head_is_plain(model) or weights_partitioned(model):
        logits = completion_logits(model, input_ids, attention_mask, t) / temperature
        with torch.no_grad():
            entropy = entropy_from_logits(logits) * completion_mask if with_entropy else None
        return token_logprobs(logits, completion_ids) * completion_mask, entropy
    hidden = completion_hidden_states(model, input_ids, attention_mask, t, group_size)
    logprobs, entropy = chunked_logprobs_and_entropy(
        _logit_head(model), hidden, completion_ids.reshape(-1), temperature, with_entropy
    )
    return logprobs.view(n, t) * completion_mask, None if entropy is None else entropy.view(n, t) * completion_mask


def completion_logprobs(
    model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_ids: Tensor,
    completion_mask: Tensor,
    temperature: float,
    group_size: int = 1,
) -> Tensor:
    """log pi(y_t | x, y_<t) of each completion token at the sampling temperature, `[N, T]`, 0 on padding."""
    return completion_logprobs_and_entropy(
        model,
        input_ids,
        attention_mask,
        completion_ids,
        completion_mask,
        temperature,
        with_entropy=False,
        group_size=group_size,
    )[0]


def last_hidden_states(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """The transformer body of a sequence classifier (reward or value model), `[N, L, D]`."""
    return model.base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_for(attention_mask),
        use_cache=False,
    ).last_hidden_state


def reward_scores(
    reward_model: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_len: int = 0,
    group_size: int = 1,
) -> Tensor:
    """Score `[N]` of each prompt+completion at its last real token (found from the mask, not from pad ids). Given the
    completion length and rows in groups of `group_size` sharing a prompt, the prompt runs once per group."""
    if completion_len:
        last_prompt, completion = body_hidden_states(
            reward_model, input_ids, attention_mask, completion_len, group_size
        )
        lengths = attention_mask[:, -completion_len:].sum(1)  # real completion tokens (right-padded)
        at_end = completion[torch.arange(completion.shape[0]), (lengths - 1).clamp(min=0)]
        last = torch.where((lengths > 0).unsqueeze(1), at_end, last_prompt)
        return reward_model.score(last).squeeze(-1).float()
    hidden = last_hidden_states(reward_model, input_ids, attention_mask)
    last = attention_mask.shape[1] - 1 - attention_mask.flip(1).argmax(1)  # [N] index of the last 1
    return reward_model.score(hidden[torch.arange(hidden.shape[0]), last]).squeeze(-1).float()


def token_values(
    value_model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, completion_len: int
) -> Tensor:
    """PPO's value of each completion token, `[N, T]`: the value head on the hidden state that predicts token t."""
    hidden = last_hidden_states(value_model, input_ids, attention_mask)
    return value_model.score(hidden[:, -completion_len - 1 : -1]).squeeze(-1).float()
