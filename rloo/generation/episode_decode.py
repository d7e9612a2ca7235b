"""The lean decode for multi-turn episodes: one KV cache per episode that lives across its turns. A turn's tokens are
drawn one step at a time; the environment's reply (with the turn's last drawn token) is then prefilled into the same
cache in one forward, and the next turn continues from there: nothing of the episode is computed twice.

Every forward is a chunk of new tokens per row, right-padded (`real` False on the padding): each row writes its
chunk's keys and values at the row's own next slots and attends to its cached real tokens and to the real tokens of
its chunk up to itself. Rows that have nothing to add this step are fed padding, which they write where their next
token will go and never attend to. The arithmetic is the family's (`DecodeBody.layer_forward`, as rloo.generation.
decode runs it), so the logits equal a full forward over the same tokens to float rounding (tests/test_episodes.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rloo.generation.decode import Prepared, _embed, _last_logits, masked_attention, rotary_tables

GROWTH = 64  # slots added when a chunk would overrun the cache


class EpisodeCache:
    """Per layer `[N, kv_heads, 2, C, head_dim]`, which slots of each row hold a real token (`filled` `[N, C]`), how
    many slots each row has used (`used` `[N]`) and the position id its next real token takes (`position` `[N]`)."""

    def __init__(self, weights: Prepared, rows: int, capacity: int, device):
        body = weights.body
        self.weights, self.device = weights, device
        shape = body.shape
        self.kv = [
            torch.zeros(rows, shape.kv_heads, 2, capacity, shape.head_dim, dtype=weights.cache_dtype, device=device)
            for _ in body.layers
        ]
        self.filled = torch.zeros(rows, capacity, dtype=torch.bool, device=device)
        self.used = torch.zeros(rows, dtype=torch.long, device=device)
        self.position = torch.zeros(rows, dtype=torch.long, device=device)
        self.cos, self.sin = rotary_tables(body.rotary, capacity, body.embed.dtype)

    @property
    def capacity(self) -> int:
        return self.filled.shape[1]

    def _grow(self, needed: int) -> None:
        extra = max(GROWTH, needed - self.capacity)
        self.kv = [F.pad(kv, (0, 0, 0, extra)) for kv in self.kv]
        self.filled = F.pad(self.filled, (0, extra))
        self.cos, self.sin = rotary_tables(self.weights.body.rotary, self.capacity, self.weights.body.embed.dtype)

    @torch.no_grad()
    def forward(self, tokens: Tensor, real: Tensor) -> Tensor:
        """Feed every row its chunk `tokens` `[N, M]` (`real` `[N, M]`: True on its leading real tokens); returns the
        logits `[N, V]` after each row's last real token (a row with none: after its pad, to be ignored)."""
        rows, width = tokens.shape
        if int(self.used.max()) + width > self.capacity:
            self._grow(int(self.used.max()) + width)
        slots = self.used[:, None] + torch.arange(width, device=self.device)  # [N, M] where each token goes
        positions = self.position[:, None] + (real.long().cumsum(1) - 1).clamp(min=0)  # [N, M]
        keys = torch.arange(self.capacity, device=self.device)  # [C]
        offset = keys[None, :] - self.used[:, None]  # [N, C]: a key's place in this chunk
        in_chunk = (offset >= 0) & (offset < width)
        chunk_real = in_chunk & real.gather(1, offset.clamp(0, width - 1))  # [N, C] the chunk's real keys
        visible = self.filled[:, None, :] | (chunk_real[:, None, :] & (keys[None, None, :] <= slots[:, :, None]))
        visible |= keys[None, None, :] == slots[:, :, None]  # a pad query sees itself: no empty softmax row
        mask = visible[:, None]  # [N, 1, M, C]
        body, shape, hd = self.weights.body, self.weights.body.shape, self.weights.body.shape.head_dim
        caches = iter(self.kv)
        row_index = torch.arange(rows, device=self.device)[:, None]

        def attend(q: Tensor, kv: Tensor) -> Tensor:  # q [N, H, M, hd], kv [N, kv_heads, M, 2*hd]
            cache = next(caches)
            cache.permute(0, 3, 1, 2, 4)[row_index, slots] = kv.unflatten(-1, (2, hd)).permute(0, 2, 1, 3, 4)
            return masked_attention(q, cache[:, :, 0], cache[:, :, 1], mask, shape)  # over [N, kv_heads, C, hd]

        hidden = _embed(body, tokens)  # [N, M, D]
        cos, sin = self.cos[positions], self.sin[positions]
        for layer in body.layers:
            hidden = body.layer_forward(hidden, layer, shape, cos, sin, attend)
        counts = real.sum(1)  # [N]
        self.filled[row_index, slots] |= real
        self.used += counts
        self.position += counts
        last = (counts - 1).clamp(min=0)
        return _last_logits(self.weights, hidden[torch.arange(rows, device=self.device), last][:, None])
