"""The rollout engine's samplers: what draws a turn's tokens for some rows and takes an environment's tokens into a
row. One interface, two implementations:

    turn(rows, max_new, limits=None) -> (ids `[A, T]`, log-probs `[A, T]`)   a turn for `rows` (ascending)
    append(rows, chunks)                                                      the environment's tokens, per row

`LeanSampler` (rloo.generation.lean_sampler) keeps a KV cache per row across turns, with prompt groups, row dropping
and the CUDA-graph path; `HFSampler` samples each turn with HF `generate` from the whole episode so far (every turn
prefilled anew), where the lean decode cannot serve the policy. `samplers_for` picks one and prepares the weights once
for every chunk of a rollout or evaluation pass. Plain torch + transformers.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import torch
from torch import Tensor
from transformers import GenerationConfig, PreTrainedModel

from rloo.data.padding import left_pad
from rloo.generation import decode, static_decode
from rloo.generation.lean_sampler import LeanSampler
from rloo.generation.settings import SamplingConfig
from rloo.models.sharding import ranks_step_together
from rloo.objectives import token_logprobs


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


@torch.no_grad()
def hf_generate_with_logprobs(policy, ids, mask, sampling, eos_token_id, pad_token_id) -> tuple[Tensor, Tensor]:
    """HF generate's completions `[B, T]` (pad after a row's EOS) and the log-probs of its own sampling pass
    `[B, T]` (log softmax(logits / temperature), temperature 1 when greedy)."""
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


class HFSampler:
    """Turns sampled by HF generate over each row's whole episode so far: the prompt (as given, left-padded, for a
    first turn) and every token after it. Holds the tokens, not a cache: each turn is prefilled anew."""

    def __init__(self, policy, prompt_ids: Tensor, prompt_mask: Tensor, sampling, eos_token_id, pad_token_id):
        self.policy, self.sampling, self.eos, self.pad = policy, sampling, eos_token_id, pad_token_id
        self.prompt_ids, self.prompt_mask = prompt_ids, prompt_mask
        self.after = [[] for _ in range(len(prompt_ids))]  # each row's tokens after its prompt so far

    def turn(self, rows: Tensor, max_new: int, limits: Tensor | None = None) -> tuple[Tensor, Tensor]:
        index = rows.tolist()
        if not any(self.after[i] for i in index):  # a first turn: the prompts as the batch holds them
            ids, mask = self.prompt_ids[rows], self.prompt_mask[rows]
        else:
            whole = [self.prompt_ids[i][self.prompt_mask[i].bool()].tolist() + self.after[i] for i in index]
            ids, mask = (t.to(self.prompt_ids.device) for t in left_pad(whole, self.pad))
        sampling = (
            self.sampling if max_new == self.sampling.max_new_tokens else replace(self.sampling, max_new_tokens=max_new)
        )
        completion, logprobs = hf_generate_with_logprobs(self.policy, ids, mask, sampling, self.eos, self.pad)
        lengths = truncate_after_stop(completion, self.eos if self.sampling.stop_at_eos else None, self.pad)[1].sum(1)
        for row, i in enumerate(index):  # up to and with the stop token (within its room): what the next turn reads
            take = int(lengths[row]) if limits is None else min(int(lengths[row]), int(limits[row]))
            self.after[i] += completion[row, :take].tolist()
        return completion, logprobs

    def append(self, rows: Tensor, chunks: list[list[int]]) -> None:
        for i, chunk in zip(rows.tolist(), chunks):
            self.after[i] += list(chunk)


def lean_serves(policy, sampling: SamplingConfig, sequence_length: int) -> bool:
    return sampling.lean_decode and decode.supports_lean_decode(policy, sequence_length)


def samplers_for(
    policy,
    sampling: SamplingConfig,
    rows: int,
    sequence_length: int,
    eos_token_id,
    pad_token_id,
    *,
    episodes: bool,
    capacity: int,
):
    """A maker of the sampler for each chunk of one rollout or evaluation pass: `make(prompt_ids, prompt_mask)`. The
    lean decode where it serves the policy over rows of `sequence_length` tokens, its weights prepared once here for
    every chunk (on CPU in float32, reordered copies; rollout_precision=bf16: bfloat16 copies); else HF generate.
    `episodes`: rows may take more than one turn (their caches are kept); `capacity`: own-cache slots per row."""
    if not lean_serves(policy, sampling, sequence_length):
        return lambda ids, mask: HFSampler(policy, ids, mask, sampling, eos_token_id, pad_token_id)
    weights = decode.prepared_weights(policy, rows, sampling.rollout_precision == "bf16")
    # on a GPU a plain completion's steps at static shapes, replayed as CUDA graphs (rloo.generation.fast_paths)
    graphs = sampling.cuda_graph and not episodes and static_decode.why_not_graph(policy) is None
    return lambda ids, mask: LeanSampler(
        weights,
        ids,
        mask,
        sampling,
        eos_token_id,
        pad_token_id,
        capacity=capacity,
        keeps_rows=episodes,
        graphs=graphs,
    )


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
