"""Masked statistics and per-token log-probs, computed in float32 whatever the inputs' precision.

Shapes: N = prompts * k completions, T = completion length; `mask` [N, T] is 1 on real completion tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _upcast(x: Tensor) -> Tensor:
    """Half / bf16 -> float32; float32 / float64 unchanged."""
    # bf16 has 8 mantissa bits: summing ~100 log-probs in it loses whole nats
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(values * mask) over `dim` (all entries if None).

    values: [...], mask: bool or float, broadcastable to values. Low-precision
    inputs are summed in float32.
    """
    values = _upcast(values)
    mask = mask.to(values.dtype)
    # where() as well as the product: padding may hold inf/nan and 0 * inf = nan
    masked = torch.where(mask != 0, values * mask, torch.zeros_like(values))
    return masked.sum() if dim is None else masked.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """sum(values * mask) / sum(mask) over `dim`; 0 where the mask is empty.

    values: [...], mask: bool or float, broadcastable to values.
    """
    total = masked_sum(values, mask, dim)
    count = torch.broadcast_to(mask, values.shape).to(total.dtype)
    count = count.sum() if dim is None else count.sum(dim)
    # a safe denominator (not where() on the quotient) keeps gradients finite too
    return total / torch.where(count > 0, count, torch.ones_like(count))


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance over all masked entries -> scalar.

    With unbiased=True applies Bessel's correction n/(n-1); skipped when n <= 1
    (the biased value, 0, is returned instead of dividing by zero).
    """
    mean = masked_mean(values, mask)
    var = masked_mean((_upcast(values) - mean) ** 2, mask)  # E[(v - mu)^2]
    if unbiased:
        n = torch.broadcast_to(mask, values.shape).to(var.dtype).sum()
        var = torch.where(n > 1, var * n / torch.clamp(n - 1, min=1), var)
    return var


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(values - mean) / sqrt(var + 1e-8) over masked entries; 0 at masked-out positions.

    values: [...], mask broadcastable -> same shape as values.
    shift_mean=False adds the mean back (only rescales).
    """
    values = _upcast(values)
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)  # z = (v - mu) / sigma
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask.bool(), whitened, torch.zeros_like(whitened))


def token_logprobs(logits: Tensor, token_ids: Tensor) -> Tensor:
    """log softmax(logits)[token] per position, computed in float32.

    logits: [N, T, V], token_ids: [N, T] -> [N, T]. logsumexp and a gather avoid a second [N, T, V] tensor.
    """
    logits = logits.float()  # bf16 logits lose ~2 decimal digits in log-softmax
    picked = logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    return picked - logits.logsumexp(-1)  # log p(y_t) = z_y - log sum_v exp(z_v)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of softmax(logits) per position, [N, T, V] -> [N, T], in float32."""
    logits = logits.float()
    log_z = logits.logsumexp(-1)
    probs = torch.softmax(logits, -1)
    return log_z - (probs * logits).sum(-1)  # H = log Z - sum_v p_v z_v
