"""How completions are sampled: the settings every sampler reads, the draws the lean decode makes with them (HF's
order: logits / temperature -> top-k -> top-p -> softmax -> a draw), and the positions a left-padded batch uses.

A leaf module: the rollout (rloo/generation/rollout.py) and the lean decode (rloo/generation/decode.py) both build on
it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rloo.generation.settings import SamplingConfig


def position_ids_for(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, as `generate` uses them; a plain forward would count the pads."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


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
    token is never drawn (the cumulative sum does not rise there), and a draw that rounds up to the row's total is
    held just below it, so it lands on the last token with probability. On CPU about 20x cheaper than
    torch.multinomial, whose exponential noise costs a logarithm per vocabulary entry; one uniform per row instead."""
    cumulative = probs.cumsum(-1, dtype=torch.float64)  # [B, V]
    total = cumulative[:, -1:]
    draw = torch.rand(probs.shape[0], 1, dtype=torch.float64, device=probs.device) * total
    draw = torch.minimum(draw, torch.nextafter(total, torch.zeros_like(total)))  # < total: some c_v exceeds it
    return torch.searchsorted(cumulative, draw, right=True).squeeze(1)  # first c_v > draw: p_v > 0


def sample_tokens(logits: Tensor, sampling: SamplingConfig) -> tuple[Tensor, Tensor]:
    """Next tokens `[B]` and their log-probs `[B]` (float32) under softmax(logits / temperature), unfiltered.

    The log-prob is z_y - logsumexp(z), with logsumexp as torch computes it (max + log sum exp(z - max)); the
    inverse-CDF draw reads the same exp(z - max) (unnormalised: the draw scales to the row's total), so the scores
    are exponentiated once."""
    scores = logits.float()  # HF samples from float32 logits
    if sampling.temperature != 1.0 and not sampling.greedy:
        scores = scores / sampling.temperature
    top = scores.amax(-1, keepdim=True)  # [B, 1]
    top = top.masked_fill(top.isinf(), 0.0)  # as torch.logsumexp: an infinite max shifts nothing
    weights = (scores - top).exp()  # [B, V]
    log_total = weights.sum(-1).log() + top.squeeze(1)  # torch.logsumexp's arithmetic, its result bit for bit
    if sampling.greedy:
        tokens = scores.argmax(-1)
    else:
        filtered = filter_logits(scores, sampling.top_k, sampling.top_p)
        if sampling.sampler == "multinomial":  # HF generate's draw, the same random stream
            tokens = torch.multinomial(filtered.softmax(-1), 1).squeeze(1)
        elif filtered is scores:  # nothing filtered: the weights are the unnormalised probabilities
            tokens = inverse_cdf_draw(weights)
        else:
            tokens = inverse_cdf_draw(filtered.softmax(-1))
    picked = scores.gather(1, tokens[:, None]).squeeze(1)
    return tokens, picked - log_total  # log p(y) = z_y - log sum_v exp(z_v), as token_logprobs
