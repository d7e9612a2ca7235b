"""One rollout: generate -> truncate at the stop token -> log-probs -> score, into one `Rollout` record.

Every algorithm consumes a `Rollout`. No Lightning or Hydra here: plain torch over transformers models.
Token layout: prompts are left-padded to P, completions right-padded to T, so row i is
`[pad.. prompt | completion ..pad]` and position P + t holds completion token t.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, fields
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GenerationConfig, PreTrainedModel

from rloo import decode
from rloo.lora import adapters_disabled
from rloo.objectives import entropy_from_logits, token_logprobs
from rloo.sampling import SamplingConfig, position_ids_for
from rloo.sharding import ranks_step_together, weights_partitioned


@dataclass
class Rollout:
    """What was sampled and scored; what an algorithm derives from it (rewards, advantages) is its own record."""
    prompt_ids: Tensor          # [N, P] left-padded, N = prompts * k (prompt-major: rows p*k .. p*k+k-1 share a prompt)
    prompt_mask: Tensor         # [N, P]
    completion_ids: Tensor      # [N, T] pad after the stop token
    completion_mask: Tensor     # [N, T] 1 on real tokens, the stop token included
    ended_with_eos: Tensor      # [N] bool
    generation_logprobs: Tensor  # [N, T] log pi(y_t | .) as the sampler saw it (float32), 0 on padding
    ref_logprobs: Tensor        # [N, T] log pi_ref(y_t | .) at temperature (float32), 0 on padding
    scores: Tensor              # [N] reward-model score at the last real token (before any penalty)

    @property
    def input_ids(self) -> Tensor:  # [N, P+T]
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:  # [N, P+T]
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)

    @property
    def lengths(self) -> Tensor:  # [N] completion tokens, stop token included
        return self.completion_mask.sum(1)

    def __len__(self) -> int:
        return self.scores.shape[0]

    def select(self, index: Tensor | slice) -> "Rollout":
        """The rows `index` of every field (a micro-batch)."""
        return Rollout(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def generation_config_for(sampling: SamplingConfig, eos_token_id: int, pad_token_id: int) -> GenerationConfig:
    """Every field that changes sampling is set here, so nothing comes from the model's own generation_config."""
    return GenerationConfig(
        max_new_tokens=sampling.max_new_tokens,
        min_new_tokens=0,
        do_sample=not sampling.greedy,
        temperature=None if sampling.greedy else sampling.temperature,
        top_k=None if sampling.greedy else sampling.top_k,  # 0 disables; None would let transformers fill in 50
        top_p=None if sampling.greedy or sampling.top_p >= 1.0 else sampling.top_p,
        num_beams=1,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        eos_token_id=eos_token_id if sampling.stop_at_eos else None,
        pad_token_id=pad_token_id,
        use_cache=True,
    )


@contextlib.contextmanager
def _own_generation_config(model: PreTrainedModel, config: GenerationConfig):
    # transformers fills "unset" fields of a passed config from model.generation_config; swap it for ours meanwhile
    saved = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = saved


def truncate_after_stop(completion_ids: Tensor, stop_token_id: int | None, pad_token_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """Pad everything after the first stop token (which is kept). Returns ids `[N, T]`, mask `[N, T]`, ended `[N]`.

    Tokens before the stop are real even when they equal the pad id (a policy may sample it): only the
    position decides. Rows that never stop keep all T tokens (generate pads only rows that have ended).
    """
    positions = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    if stop_token_id is None:
        is_stop = torch.zeros_like(completion_ids, dtype=torch.bool)
    else:
        is_stop = completion_ids == stop_token_id
    ended = is_stop.any(1)
    first_stop = torch.where(ended, is_stop.int().argmax(1), completion_ids.shape[1])  # [N]
    mask = positions[None, :] <= first_stop[:, None]  # up to and including the stop token
    return torch.where(mask, completion_ids, pad_token_id), mask.long(), ended


def generate_with_logprobs(policy: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, sampling: SamplingConfig,
                           eos_token_id: int, pad_token_id: int, batch_size: int) -> tuple[Tensor, Tensor]:
    """Sampled completions `[N, T]` and the log-probs the sampler gave each token `[N, T]` (float32).

    The log-probs are log softmax(logits / temperature) of the sampling pass itself (temperature 1 when
    greedy): compared with a training forward they measure the rollout / training mismatch.
    """
    chunks = []
    for start in range(0, prompt_ids.shape[0], batch_size):
        ids, mask = prompt_ids[start:start + batch_size], prompt_mask[start:start + batch_size]
        if sampling.lean_decode and decode.supports_lean_decode(policy):
            chunks.append(decode.lean_generate(policy, ids, mask, sampling, eos_token_id, pad_token_id))
        else:
            chunks.append(_hf_generate_with_logprobs(policy, ids, mask, sampling, eos_token_id, pad_token_id))
    width = max(c[0].shape[1] for c in chunks)
    completion_ids = torch.cat([F.pad(ids, (0, width - ids.shape[1]), value=pad_token_id) for ids, _ in chunks])
    logprobs = torch.cat([F.pad(lp, (0, width - lp.shape[1])) for _, lp in chunks])
    return completion_ids, logprobs


@torch.no_grad()
def _hf_generate_with_logprobs(policy, ids, mask, sampling, eos_token_id, pad_token_id) -> tuple[Tensor, Tensor]:
    config = generation_config_for(sampling, eos_token_id, pad_token_id)
    with _own_generation_config(policy, config):
        output = policy.generate(input_ids=ids, attention_mask=mask, generation_config=config, output_logits=True,
                                 return_dict_in_generate=True, synced_gpus=ranks_step_together(policy))
    completion = output.sequences[:, ids.shape[1]:]
    temperature = 1.0 if sampling.greedy else sampling.temperature
    logits = torch.stack(output.logits, dim=1).float() / temperature  # [B, T, V] raw logits of each step
    return completion, token_logprobs(logits, completion)


def sample_completions(policy: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, sampling: SamplingConfig,
                       eos_token_id: int, pad_token_id: int, batch_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Sample, then truncate at the stop token: ids `[N, T]`, mask `[N, T]`, ended `[N]`, generation log-probs `[N, T]`."""
    raw, logprobs = generate_with_logprobs(policy, prompt_ids, prompt_mask, sampling, eos_token_id, pad_token_id, batch_size)
    completion_ids, completion_mask, ended = truncate_after_stop(raw, eos_token_id if sampling.stop_at_eos else None,
                                                                 pad_token_id)
    return completion_ids, completion_mask, ended, logprobs * completion_mask


LOGIT_CHUNK_ELEMENTS = 2**24  # logits materialised at once by the log-prob passes: 64 MB of float32, whatever the vocabulary


def completion_logits(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, completion_len: int) -> Tensor:
    """Logits predicting each completion token, `[N, T, V]`: only the last T+1 positions go through the LM head.
    (The log-prob passes below never build this whole tensor; it stays for callers that need every logit.)"""
    output = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_for(attention_mask),
                   logits_to_keep=completion_len + 1, use_cache=False)
    return output.logits[:, :-1]


def _head_is_plain(model: PreTrainedModel) -> bool:
    """The logits are head(hidden): no soft-capping or scaling after the head (Gemma 2, Cohere) that only the model's
    own forward applies."""
    config = model.config
    return (isinstance(model.get_output_embeddings(), torch.nn.Linear)  # not an adapter-wrapped head
            and not getattr(config, "final_logit_softcapping", None) and getattr(config, "logit_scale", 1.0) in (None, 1.0))


SHARED_PREFIX_MODELS = ("gpt_neox",)  # bodies the packed forward is tested on
PACKED_MASK_ATTENTION = ("sdpa", "eager")  # attention implementations that take an arbitrary 4-D mask


def shares_prompts(model: PreTrainedModel, prompt_ids: Tensor, prompt_mask: Tensor, group_size: int) -> bool:
    """Rows come in groups of `group_size` with the same (left-padded) prompt, on a body the packed forward
    supports: then the prompt can run once per group."""
    n = prompt_ids.shape[0]
    if (group_size < 2 or n % group_size or model.config.model_type not in SHARED_PREFIX_MODELS
            or model.config._attn_implementation not in PACKED_MASK_ATTENTION):
        return False
    ids, mask = prompt_ids.view(n // group_size, group_size, -1), prompt_mask.view(n // group_size, group_size, -1)
    return bool((ids == ids[:, :1]).all() & (mask == mask[:, :1]).all())  # one host sync


def packed_attention(prompt_mask: Tensor, completion_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Who attends to whom in a packed group row `[prompt | completion 1 | ... | completion k]`, and the positions.

    prompt_mask `[G, P]` (left-padded), completion_mask `[G, k, T]` (right-padded). Returns a bool mask
    `[G, 1, L, L]` (L = P + k*T; True: may attend) and position ids `[G, L]`. A query sees earlier real tokens of
    the prompt and of its own completion, never another completion; a pad query sees itself only, so no row of
    the softmax is empty. Completion j's token t sits at position (real prompt tokens) + t, as in its own row.
    """
    groups, k, length = completion_mask.shape
    prompt_len = prompt_mask.shape[1]
    segment = torch.cat([torch.zeros(prompt_len, dtype=torch.long, device=prompt_mask.device),
                         torch.arange(1, k + 1, device=prompt_mask.device).repeat_interleave(length)])  # [L]
    key_real = torch.cat([prompt_mask, completion_mask.reshape(groups, -1)], 1).bool()  # [G, L]
    width = segment.shape[0]
    causal = torch.ones(width, width, dtype=torch.bool, device=prompt_mask.device).tril()
    same_or_prompt = (segment[None, :] == segment[:, None]) | (segment[None, :] == 0)  # [L, L]
    mask = (causal & same_or_prompt)[None] & key_real[:, None, :]
    mask |= torch.eye(width, dtype=torch.bool, device=prompt_mask.device)
    prompt_positions = position_ids_for(prompt_mask)                                    # [G, P]
    completion_positions = prompt_mask.sum(1, keepdim=True) + torch.arange(length, device=prompt_mask.device).repeat(k)
    return mask[:, None], torch.cat([prompt_positions, completion_positions], 1)


def body_hidden_states(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, completion_len: int,
                       group_size: int = 1) -> tuple[Tensor, Tensor]:
    """The transformer body's last hidden states of prompt + completion rows: at the last prompt position `[N, D]`
    and at every completion position `[N, T, D]`.

    When the rows come in groups of `group_size` sharing a prompt (prompt-major, as a rollout lays them), each group
    runs as one packed row `[prompt | completion 1 | ... | completion k]` whose mask lets every completion see the
    prompt and itself (packed_attention): the prompt is computed once, every weight sees all tokens in one matmul,
    and under autograd the k completions' gradients meet in the shared prompt. Same values as one forward of every
    row.
    """
    body, prompt_len = model.base_model, input_ids.shape[1] - completion_len
    if not shares_prompts(model, input_ids[:, :prompt_len], attention_mask[:, :prompt_len], group_size):
        hidden = body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_for(attention_mask),
                      use_cache=False).last_hidden_state
        return hidden[:, prompt_len - 1], hidden[:, prompt_len:]
    k, groups = group_size, input_ids.shape[0] // group_size
    packed_ids = torch.cat([input_ids[::k, :prompt_len], input_ids[:, prompt_len:].reshape(groups, -1)], 1)  # [G, L]
    mask, positions = packed_attention(attention_mask[::k, :prompt_len],
                                       attention_mask[:, prompt_len:].reshape(groups, k, completion_len))
    if model.config._attn_implementation == "eager":  # eager adds the mask to the scores
        mask = torch.zeros(mask.shape, dtype=model.dtype, device=mask.device).masked_fill_(~mask, torch.finfo(model.dtype).min)
    hidden = body(input_ids=packed_ids, attention_mask=mask, position_ids=positions, use_cache=False).last_hidden_state
    completion = hidden[:, prompt_len:].reshape(groups * k, completion_len, -1)      # [N, T, D]
    return hidden[:, prompt_len - 1].repeat_interleave(k, 0), completion


def completion_hidden_states(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, completion_len: int,
                             group_size: int = 1) -> Tensor:
    """The hidden states at the positions that predict each completion token, as one contiguous `[N*T, D]`."""
    last_prompt, completion = body_hidden_states(model, input_ids, attention_mask, completion_len, group_size)
    hidden = torch.cat([last_prompt.unsqueeze(1), completion[:, :-1]], 1)
    return hidden.reshape(-1, hidden.shape[-1])


def _head_chunks(head, hidden: Tensor, token_ids: Tensor, temperature: float, rows: int,
                 with_entropy: bool) -> tuple[Tensor, Tensor | None, Tensor]:
    """log p(y), the entropy (or None) and log Z `[R]` of softmax(head(h) / temperature), `rows` rows at a time."""
    logprobs, entropies, log_zs = [], [], []
    for start in range(0, hidden.shape[0], rows):
        logits = head(hidden[start:start + rows]).float()  # [rows, V], fresh: divided in place
        if temperature != 1.0:
            logits.div_(temperature)
        log_z = logits.logsumexp(-1)
        logprobs.append(logits.gather(1, token_ids[start:start + rows, None]).squeeze(1) - log_z)
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
                logits = head(h)                                              # [rows, V]
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


def chunked_logprobs_and_entropy(head, hidden: Tensor, token_ids: Tensor, temperature: float, with_entropy: bool = True,
                                 chunk_elements: int = LOGIT_CHUNK_ELEMENTS) -> tuple[Tensor, Tensor | None]:
    """log softmax(head(h) / temperature)[y] and the entropy (detached), row by row of `hidden` `[R, D]`, in chunks of
    about `chunk_elements` logits, so the `[R, V]` logits never exist at once. With gradients, the backward recomputes
    each chunk's logits (one more head matmul) instead of keeping them (_ChunkedHeadLogprobs)."""
    rows = max(1, chunk_elements // head.out_features)
    params = (head.weight, head.bias)
    if not (torch.is_grad_enabled() and (hidden.requires_grad or any(p is not None and p.requires_grad for p in params))):
        logprobs, entropy, _ = _head_chunks(head, hidden, token_ids, temperature, rows, with_entropy)
        return logprobs, entropy
    logprobs, entropy = _ChunkedHeadLogprobs.apply(hidden, token_ids, head, temperature, rows, with_entropy, *params)
    return logprobs, entropy if with_entropy else None


def completion_logprobs_and_entropy(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor,
                                    completion_ids: Tensor, completion_mask: Tensor, temperature: float,
                                    with_entropy: bool = True, group_size: int = 1) -> tuple[Tensor, Tensor | None]:
    """The training-style forward of the policy: log pi(y_t | x, y_<t) `[N, T]` at the sampling temperature and
    the per-token entropy of that distribution `[N, T]` (detached), both 0 on padding. The LM head runs on the
    completion positions only, as a contiguous 2-D slice, in chunks (chunked_logprobs_and_entropy); with
    `group_size` k, each prompt runs once per group of k rows (body_hidden_states). A model whose weights are
    partitioned across ranks (rloo.sharding) runs its own forward, which gathers them."""
    n, t = completion_ids.shape
    if not _head_is_plain(model) or weights_partitioned(model):
        logits = completion_logits(model, input_ids, attention_mask, t) / temperature
        with torch.no_grad():
            entropy = entropy_from_logits(logits) * completion_mask if with_entropy else None
        return token_logprobs(logits, completion_ids) * completion_mask, entropy
    hidden = completion_hidden_states(model, input_ids, attention_mask, t, group_size)
    logprobs, entropy = chunked_logprobs_and_entropy(model.get_output_embeddings(), hidden, completion_ids.reshape(-1),
                                                     temperature, with_entropy)
    return logprobs.view(n, t) * completion_mask, None if entropy is None else entropy.view(n, t) * completion_mask


def completion_logprobs(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, completion_ids: Tensor,
                        completion_mask: Tensor, temperature: float, group_size: int = 1) -> Tensor:
    """log pi(y_t | x, y_<t) of each completion token at the sampling temperature, `[N, T]`, 0 on padding."""
    return completion_logprobs_and_entropy(model, input_ids, attention_mask, completion_ids, completion_mask,
                                           temperature, with_entropy=False, group_size=group_size)[0]


def last_hidden_states(model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
    """The transformer body of a sequence classifier (reward or value model), `[N, L, D]`."""
    return model.base_model(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids_for(attention_mask), use_cache=False).last_hidden_state


def reward_scores(reward_model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, completion_len: int = 0,
                  group_size: int = 1) -> Tensor:
    """Score `[N]` of each prompt+completion at its last real token (found from the mask, not from pad ids). Given the
    completion length and rows in groups of `group_size` sharing a prompt, the prompt runs once per group."""
    if completion_len:
        last_prompt, completion = body_hidden_states(reward_model, input_ids, attention_mask, completion_len, group_size)
        lengths = attention_mask[:, -completion_len:].sum(1)              # real completion tokens (right-padded)
        at_end = completion[torch.arange(completion.shape[0]), (lengths - 1).clamp(min=0)]
        last = torch.where((lengths > 0).unsqueeze(1), at_end, last_prompt)
        return reward_model.score(last).squeeze(-1).float()
    hidden = last_hidden_states(reward_model, input_ids, attention_mask)
    last = attention_mask.shape[1] - 1 - attention_mask.flip(1).argmax(1)  # [N] index of the last 1
    return reward_model.score(hidden[torch.arange(hidden.shape[0]), last]).squeeze(-1).float()


def token_values(value_model: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, completion_len: int) -> Tensor:
    """PPO's value of each completion token, `[N, T]`: the value head on the hidden state that predicts token t."""
    hidden = last_hidden_states(value_model, input_ids, attention_mask)
    return value_model.score(hidden[:, -completion_len - 1:-1]).squeeze(-1).float()


class PhaseTimer:
    """Wall seconds per named phase, summed over calls: `with timer("generate"): ...`."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - started


def chunked(fn, batch_size: int, *tensors: Tensor) -> Tensor:
    """Apply `fn` to row chunks of `tensors` and concatenate along rows."""
    n = tensors[0].shape[0]
    return torch.cat([fn(*(t[s:s + batch_size] for t in tensors)) for s in range(0, n, batch_size)])


@torch.no_grad()
def collect_rollout(policy: PreTrainedModel, reference: PreTrainedModel | None, reward_model: PreTrainedModel,
                    prompt_ids: Tensor, prompt_mask: Tensor, k: int, sampling: SamplingConfig,
                    eos_token_id: int, pad_token_id: int, forward_batch_size: int,
                    timer: PhaseTimer | None = None, share_prompts: bool = False) -> Rollout:
    """Repeat each prompt k times, sample, truncate, and compute reference log-probs and scores.

    `timer`, if given, receives the seconds of the phases generate / ref_logprobs / scores. With `share_prompts`
    the reference and the reward model run each prompt once for its k completions (body_hidden_states).
    """
    timer = timer or PhaseTimer()
    prompt_ids = prompt_ids.repeat_interleave(k, dim=0)    # [B*k, P]
    prompt_mask = prompt_mask.repeat_interleave(k, dim=0)  # [B*k, P]
    with timer("generate"):
        completion_ids, completion_mask, ended, generation_logprobs = sample_completions(
            policy, prompt_ids, prompt_mask, sampling, eos_token_id, pad_token_id, forward_batch_size)
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention_mask = torch.cat([prompt_mask, completion_mask], 1)
    group = k if share_prompts else 1
    # reference None: the policy's base, its LoRA adapters switched off (rloo.lora)
    with timer("ref_logprobs"), (adapters_disabled(policy) if reference is None else contextlib.nullcontext(reference)) as ref:
        ref_logprobs = chunked(partial(completion_logprobs, ref, temperature=sampling.temperature, group_size=group),
                               forward_batch_size, input_ids, attention_mask, completion_ids, completion_mask)
    with timer("scores"):
        scores = chunked(partial(reward_scores, reward_model, completion_len=completion_ids.shape[1], group_size=group),
                         forward_batch_size, input_ids, attention_mask) if reward_model is not None else torch.zeros(input_ids.shape[0], device=input_ids.device)  # reward= without model
    return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, ended, generation_logprobs,
                   ref_logprobs.float(), scores)
