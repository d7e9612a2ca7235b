"""Token layout: prompts left-padded to one width, as every sampler and the forward passes take them. Plain torch:
the judges and the evaluation pad with it without loading the data module."""

from __future__ import annotations

import torch


def left_pad(sequences: list[list[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad to the longest: ids `[B, P]` and mask `[B, P]`."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq) :] = torch.tensor(seq)
            mask[row, width - len(seq) :] = 1
    return ids, mask
