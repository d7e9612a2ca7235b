"""One rollout: generate -> truncate at the stop token -> log-probs -> score, into one `Rollout` record.

Every algorithm consumes a `Rollout`. No Lightning or Hydra here: plain torch over transformers models.
Token layout: prompts are left-padded to P, completions right-padded to T, so row i is
`[pad.. prompt | completion ..pad]` and position P + t holds completion token t.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, fields, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GenerationConfig, PreTrainedModel

from rloo.generation import decode, static_decode
from rloo.generation.forward import completion_logprobs, reward_scores
from rloo.generation.settings import SamplingConfig
from rloo.models.lora import adapters_disabled
from rloo.models.sharding import ranks_step_together
from rloo.objectives import token_logprobs


@dataclass
class Rollout:
    """What was sampled and scored; what an algorithm derives from it (rewards, advantages) is its own record."""

    prompt_ids: Tensor  # [N, P] left-padded, N = prompts * k (prompt-major: rows p*k .. p*k+k-1 share a prompt)
    prompt_mask: Tensor  # [N, P]
    completion_ids: Tensor  # [N, T] pad after the stop token
    completion_mask: Tensor  # [N, T] 1 on real tokens, the stop token included
    ended_with_eos: Tensor  # [N] bool
    generation_logprobs: Tensor  # [N, T] log pi(y_t | .) as the sampler saw it (float32), 0 on padding
    ref_logprobs: Tensor  # [N, T] log pi_ref(y_t | .) at temperature (float32), 0 on padding
    scores: Tensor  # [N] reward-model score at the last real token (before any penalty)
    # [N, T] 1 on every real token after the prompt: the completion's, and in a multi-turn episode the environment's
    # replies too (rloo.generation.episodes), which the forwards attend to and the loss never counts
    episode_mask: Tensor

    @property
    def input_ids(self) -> Tensor:  # [N, P+T]
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> Tensor:  # [N, P+T]
        return torch.cat([self.prompt_mask, self.episode_mask], dim=1)

    @property
    def lengths(self) -> Tensor:  # [N] completion tokens, stop token included
        return self.completion_mask.sum(1)

    def __len__(self) -> int:
        return self.scores.shape[0]

    def select(self, index: Tensor | slice) -> "Rollout":
        """The rows `index` of every field (a micro-batch)."""
        return Rollout(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def concatenate(parts: list[Rollout], pad_token_id: int) -> Rollout:
    """Rollouts of the same prompt-major layout, one after the other; prompts and completions padded to the widest
    (prompts on the left, completions on the right, as sampled; ids with pad_token_id, the rest with 0)."""
    prompt_width = max(p.prompt_ids.shape[1] for p in parts)
    width = max(p.completion_ids.shape[1] for p in parts)

    def pad(name: str, value: Tensor) -> Tensor:
        fill = pad_token_id if name.endswith("_ids") else 0
        if name.startswith("prompt"):
            return F.pad(value, (prompt_width - value.shape[1], 0), value=fill)
        if value.dim() == 2:
            return F.pad(value, (0, width - value.shape[1]), value=fill)
        return value

    return Rollout(**{f.name: torch.cat([pad(f.name, getattr(p, f.name)) for p in parts]) for f in fields(Rollout)})


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
        output_logits=True,  # the raw logits of each step, for the generation log-probs
        return_dict_in_generate=True,
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


def truncate_after_stop(
    completion_ids: Tensor, stop_token_id: int | None, pad_token_id: int
) -> tuple[Tensor, Tensor, Tensor]:
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


def generate_with_logprobs(
    policy: PreTrainedModel,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    sampling: SamplingConfig,
    eos_token_id: int,
    pad_token_id: int,
    batch_size: int,
) -> tuple[Tensor, Tensor]:
    """Sampled completions `[N, T]` and the log-probs the sampler gave each token `[N, T]` (float32).

    The log-probs are log softmax(logits / temperature) of the sampling pass itself (temperature 1 when
    greedy): compared with a training forward they measure the rollout / training mismatch.
    """
    chunks = []
    lean = sampling.lean_decode and decode.supports_lean_decode(policy, prompt_ids.shape[1] + sampling.max_new_tokens)
    # the weights as the lean decode reads them (on CPU in float32, reordered copies; rollout_precision=bf16:
    # bfloat16 copies): once for every chunk
    rows, bf16 = min(batch_size, prompt_ids.shape[0]), sampling.rollout_precision == "bf16"
    weights = decode.prepared_weights(policy, rows, bf16) if lean else None
    # on a GPU the same steps at static shapes, replayed as CUDA graphs (rloo.generation.fast_paths says which ran)
    graphs = lean and sampling.cuda_graph and static_decode.why_not_graph(policy) is None
    lean_sample = static_decode.static_generate if graphs else decode.lean_generate
    for start in range(0, prompt_ids.shape[0], batch_size):
        ids, mask = prompt_ids[start : start + batch_size], prompt_mask[start : start + batch_size]
        if lean:
            chunks.append(lean_sample(policy, ids, mask, sampling, eos_token_id, pad_token_id, weights=weights))
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
        output = policy.generate(
            input_ids=ids,
            attention_mask=mask,
            generation_config=config,
            synced_gpus=ranks_step_together(policy),
        )
    completion = output.sequences[:, ids.shape[1] :]
    temperature = 1.0 if sampling.greedy else sampling.temperature
    logits = torch.stack(output.logits, dim=1).float() / temperature  # [B, T, V] raw logits of each step
    return completion, token_logprobs(logits, completion)


def sample_completions(
    policy: PreTrainedModel,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    sampling: SamplingConfig,
    eos_token_id: int,
    pad_token_id: int,
    batch_size: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Sample, then truncate at the stop token: ids `[N, T]`, mask `[N, T]`, ended `[N]`, generation log-probs
    `[N, T]`."""
    raw, logprobs = generate_with_logprobs(
        policy, prompt_ids, prompt_mask, sampling, eos_token_id, pad_token_id, batch_size
    )
    completion_ids, completion_mask, ended = truncate_after_stop(
        raw, eos_token_id if sampling.stop_at_eos else None, pad_token_id
    )
    return completion_ids, completion_mask, ended, logprobs * completion_mask


def clock() -> float:
    """Wall seconds, after the GPU has finished the work queued so far (CUDA kernels run asynchronously)."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


class PhaseTimer:
    """Wall seconds per named phase, summed over calls: `with timer("generate"): ...`."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, phase: str):
        started = clock()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + clock() - started


def chunked(fn, batch_size: int, *tensors: Tensor) -> Tensor:
    """Apply `fn` to row chunks of `tensors` and concatenate along rows."""
    n = tensors[0].shape[0]
    return torch.cat([fn(*(t[s : s + batch_size] for t in tensors)) for s in range(0, n, batch_size)])


@torch.no_grad()
def collect_rollout(
    policy: PreTrainedModel,
    reference: PreTrainedModel | None,
    reward_model: PreTrainedModel,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    k: int,
    sampling: SamplingConfig,
    eos_token_id: int,
    pad_token_id: int,
    forward_batch_size: int,
    timer: PhaseTimer | None = None,
    shared_prefix: bool = False,
) -> Rollout:
    """Repeat each prompt k times, sample, truncate, and compute reference log-probs and scores.

    `timer`, if given, receives the seconds of the phases generate / ref_logprobs / scores. With `shared_prefix`
    the reference and the reward model run each prompt once for its k completions (body_hidden_states).
    """
    timer = timer or PhaseTimer()
    prompt_ids = prompt_ids.repeat_interleave(k, dim=0)  # [B*k, P]
    prompt_mask = prompt_mask.repeat_interleave(k, dim=0)  # [B*k, P]
    with timer("generate"):
        completion_ids, completion_mask, ended, generation_logprobs = sample_completions(
            policy, prompt_ids, prompt_mask, sampling, eos_token_id, pad_token_id, forward_batch_size
        )
    return scored_rollout(
        policy,
        reference,
        reward_model,
        Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, ended, generation_logprobs, None, None, None),
        sampling.temperature,
        forward_batch_size,
        timer,
        k if shared_prefix else 1,
    )


def scored_rollout(
    policy, reference, reward_model, sampled: Rollout, temperature: float, forward_batch_size: int, timer, group: int
) -> Rollout:
    """`sampled` (its ids, masks, ends and generation log-probs; episode_mask None: the completion's own) with the
    reference's log-probs of the completion tokens `[N, T]` (float32, 0 where completion_mask is 0) and the reward
    model's scores `[N]` (zeros without one), from forwards that attend to the episode's tokens. `group`: rows per
    shared prompt for the shared-prefix forwards (1: plain rows)."""
    completion_ids, completion_mask = sampled.completion_ids, sampled.completion_mask
    episode_mask = completion_mask if sampled.episode_mask is None else sampled.episode_mask
    input_ids = torch.cat([sampled.prompt_ids, completion_ids], 1)
    attention_mask = torch.cat([sampled.prompt_mask, episode_mask], 1)
    # reference None: the policy's base, its LoRA adapters switched off (rloo.models.lora)
    with (
        timer("ref_logprobs"),
        adapters_disabled(policy) if reference is None else contextlib.nullcontext(reference) as ref,
    ):
        ref_logprobs = chunked(
            partial(completion_logprobs, ref, temperature=temperature, group_size=group),
            forward_batch_size,
            input_ids,
            attention_mask,
            completion_ids,
            completion_mask,
        )
    with timer("scores"):
        scores = (
            chunked(
                partial(reward_scores, reward_model, completion_len=completion_ids.shape[1], group_size=group),
                forward_batch_size,
                input_ids,
                attention_mask,
            )
            if reward_model is not None
            else torch.zeros(input_ids.shape[0], device=input_ids.device)
        )  # reward= without model
    return replace(sampled, ref_logprobs=ref_logprobs.float(), scores=scores, episode_mask=episode_mask)
