"""One rollout: sample episodes (rloo.generation.episodes; a plain completion is a one-turn episode) -> the
reference's log-probs -> the reward model's scores, into one `Rollout` record.

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
from transformers import PreTrainedModel

from rloo.generation.episodes import Sampled, sample_episodes
from rloo.generation.forward import completion_logprobs, reward_scores
from rloo.generation.samplers import truncate_after_stop  # noqa: F401 (re-exported: rollout.truncate_after_stop)
from rloo.generation.settings import EpisodeSettings, SamplingConfig
from rloo.models.lora import adapters_disabled


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
    # [N] int64: the policy version that sampled each row (the learner's count of rollouts trained on when it was
    # published; the synchronous loop samples rollout r with version r). Its log-probs are generation_logprobs: the
    # behaviour policy's, which the loss's corrections weigh against the learner's (rloo.objectives.mismatch)
    behaviour_version: Tensor

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


def generate_with_logprobs(
    policy: PreTrainedModel,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    sampling: SamplingConfig,
    eos_token_id: int,
    pad_token_id: int,
    batch_size: int,
) -> tuple[Tensor, Tensor]:
    """Plain completions `[N, T]` (pad after a row's stop token) and the log-probs the sampler gave each token `[N, T]`
    (float32, 0 after the stop): the rollout engine's one-turn episodes (rloo.generation.episodes).

    The log-probs are log softmax(logits / temperature) of the sampling pass itself (temperature 1 when
    greedy): compared with a training forward they measure the rollout / training mismatch.
    """
    sampled = sample_episodes(policy, prompt_ids, prompt_mask, sampling, batch_size, eos_token_id, pad_token_id)
    return sampled.completion_ids, sampled.generation_logprobs


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
def sample_rollout(
    policy: PreTrainedModel,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    k: int,
    sampling: SamplingConfig,
    eos_token_id: int,
    pad_token_id: int,
    batch_size: int,
    *,
    environments: list | None = None,
    settings: EpisodeSettings | None = None,
    tokenizer=None,
    chat: bool = False,
) -> Sampled:
    """k episodes of each prompt, prompt-major (rloo.generation.episodes.sample_episodes): plain completions, or,
    with `environments` (one reset environment per episode, in that order) and `settings`, multi-turn episodes."""
    prompt_ids = prompt_ids.repeat_interleave(k, dim=0)  # [B*k, P]
    prompt_mask = prompt_mask.repeat_interleave(k, dim=0)  # [B*k, P]
    return sample_episodes(
        policy,
        prompt_ids,
        prompt_mask,
        sampling,
        batch_size,
        eos_token_id,
        pad_token_id,
        environments=environments,
        settings=settings,
        tokenizer=tokenizer,
        chat=chat,
    )


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
    """k plain completions per prompt, sampled (`sample_rollout`) and scored (`scored_rollout`)."""
    timer = timer or PhaseTimer()
    with timer("generate"):
        sampled = sample_rollout(
            policy, prompt_ids, prompt_mask, k, sampling, eos_token_id, pad_token_id, forward_batch_size
        )
    group = k if shared_prefix else 1
    temperature = sampling.temperature
    return scored_rollout(policy, reference, reward_model, sampled, temperature, forward_batch_size, timer, group)


def scored_rollout(
    policy,
    reference,
    reward_model,
    sampled: Sampled,
    temperature: float,
    forward_batch_size: int,
    timer,
    group: int,
    version: int = 0,
) -> Rollout:
    """`sampled` scored: the reference's log-probs of the model's tokens `[N, T]` (float32, 0 where completion_mask
    is 0) and the reward model's scores `[N]` (zeros without one), from forwards that attend to every real token of
    the episode. `group`: rows per shared prompt for the shared-prefix forwards (1: plain rows); `version`: the
    policy version that sampled it, stamped on every row."""
    completion_ids, completion_mask = sampled.completion_ids, sampled.completion_mask
    input_ids, attention_mask = sampled.input_ids, sampled.attention_mask
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
    return Rollout(
        sampled.prompt_ids,
        sampled.prompt_mask,
        completion_ids,
        completion_mask,
        sampled.ended,
        sampled.generation_logprobs,
        ref_logprobs.float(),
        scores,
        sampled.episode_mask,
        torch.full((len(scores),), version, dtype=torch.int64, device=scores.device),
    )
