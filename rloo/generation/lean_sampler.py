"""The lean decode as a sampler of turns: prefill each distinct prompt once, draw a turn's tokens one step at a time
with their log-probs (finished rows leave the batch), and append an environment's tokens to a row's cache, so an
episode continues in the cache it began in and nothing of it is computed twice. A plain completion is the one-turn
case: one prefill, one turn, nothing appended (`lean_generate`).

Per layer the cache is in two parts (rloo.generation.decode): each distinct prompt's, shared by its rows, and each
row's own (`[N, kv_heads, 2, C, hd]`: its turns and the replies between them, `own_len` slots filled). The batch is
held in slots: a slot holds one row (`rows`: the row of each slot), and the rows that draw are moved into the first
slots. When a row ends, a live row from the tail moves into its slot; where the episode continues (`keeps_rows`),
the two swap, so the ended row's cache is kept for its next turn. A turn's last drawn token is not yet in the cache
(`pending`): the next `append` feeds it first. On a GPU a plain completion's turn runs at static shapes as CUDA
graphs (rloo.generation.static_decode); continued turns take the eager steps. No Lightning or Hydra here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from rloo.generation import decode
from rloo.generation.decode import (
    Prepared,
    _decode_step,
    _draw,
    _drop_rows,
    _embed,
    _last_logits,
    _prefill_groups,
    _slot_groups,
    masked_attention,
    rotary_tables,
)
from rloo.generation.sampling import position_ids_for
from rloo.generation.settings import SamplingConfig

GROWTH = 64  # own-cache slots added when an episode outgrows its cache


def _swap_rows(ended_slots: Tensor, num_live: int, *state: Tensor) -> list[Tensor]:
    """`_drop_rows`, keeping the ended rows: each ended slot below B' = num_live trades places with a live slot from
    the tail, so the live rows fill the first B' slots and every ended row's state stays in the buffers, past them.
    Returns the first B' slots of each tensor (views)."""
    gone = torch.zeros(len(state[0]), dtype=torch.bool, device=ended_slots.device).index_fill_(0, ended_slots, True)
    holes = gone[:num_live].nonzero().squeeze(1)
    movers = (~gone[num_live:]).nonzero().squeeze(1) + num_live
    for tensor in state:
        ended = tensor.index_select(0, holes)
        tensor.index_copy_(0, holes, tensor.index_select(0, movers))
        tensor.index_copy_(0, movers, ended)
    return [tensor[:num_live] for tensor in state]


class LeanSampler:
    """The rollout engine's sampler over the lean decode, for the rows of `prompt_ids`, `prompt_mask` `[N, P]`
    (left-padded). `turn` draws a turn for some rows, `append` feeds rows the environment's tokens. `keeps_rows`:
    rows may take another turn after this one (an episode), so an ended row's cache is kept; False (a plain
    completion) drops it as the one-turn decode always has. `capacity`: the own cache's slots per row to begin
    with (it grows where an episode needs more). `graphs`: a plain completion's turn at static shapes, as CUDA
    graphs (rloo.generation.static_decode)."""

    def __init__(
        self,
        weights: Prepared,
        prompt_ids: Tensor,
        prompt_mask: Tensor,
        sampling: SamplingConfig,
        eos_token_id: int,
        pad_token_id: int,
        *,
        capacity: int,
        keeps_rows: bool,
        drop_finished: bool = True,
        graphs: bool = False,
    ):
        self.weights, self.sampling, self.eos, self.pad = weights, sampling, eos_token_id, pad_token_id
        self.stop_id = eos_token_id if sampling.stop_at_eos else None
        self.prompt_ids, self.prompt_mask = prompt_ids, prompt_mask
        self.keeps_rows, self.drop_finished, self.graphs = keeps_rows, drop_finished, graphs
        self.capacity, self.prefilled = capacity, False

    # ---- state -------------------------------------------------------------------------------------------------
    def _prefill(self) -> None:
        body, shape = self.weights.body, self.weights.body.shape
        num_rows, prompt_len = self.prompt_ids.shape
        device = self.prompt_ids.device
        self.tables = rotary_tables(body.rotary, prompt_len + self.capacity, body.embed.dtype)  # [S, rot]
        # one prefill per distinct prompt; its cache is shared by the prompt's rows
        self.prompt_kvs, logits, self.inverse, self.member, self.group_size, self.prompt_bias = _prefill_groups(
            self.weights, self.prompt_ids, self.prompt_mask, *self.tables
        )
        # an episode's rows read their caches up to the longest row, masked past their own: zeros there, so a
        # masked slot weighs 0 * value, never 0 * garbage (a one-turn decode reads only what it wrote)
        alloc = torch.zeros if self.keeps_rows else torch.empty
        size = (num_rows, shape.kv_heads, 2, self.capacity, shape.head_dim)
        self.own_kvs = [alloc(size, dtype=self.weights.cache_dtype, device=device) for _ in body.layers]
        self.rows = torch.arange(num_rows, device=device)  # [N] the row each slot holds
        self.position = position_ids_for(self.prompt_mask)[:, -1] + 1  # [N] the position of a slot's next token
        self.own_len = torch.zeros(num_rows, dtype=torch.long, device=device)  # [N] own-cache slots filled
        self.pending = torch.full((num_rows,), -1, dtype=torch.long, device=device)  # [N] drawn, not yet fed
        self.logits = logits  # [N, V] each slot's next-token logits (stale where a token is pending)
        self.prefilled = True

    def _state(self) -> list[Tensor]:
        """Every slot-indexed tensor, moved together."""
        return [self.rows, self.position, self.own_len, self.pending, self.logits, *self.own_kvs]

    def _slots_of(self, rows: Tensor) -> Tensor:
        slot_of = torch.empty_like(self.rows)
        slot_of[self.rows] = torch.arange(len(self.rows), device=self.rows.device)
        return slot_of[rows]

    def _to_front(self, rows: Tensor) -> None:
        """The slots of `rows` moved (swapped) into the first len(rows) slots."""
        count = len(rows)
        wanted = torch.zeros(len(self.rows), dtype=torch.bool, device=rows.device)
        wanted[self._slots_of(rows)] = True
        holes = (~wanted[:count]).nonzero().squeeze(1)
        movers = wanted[count:].nonzero().squeeze(1) + count
        if len(holes):
            for tensor in self._state():
                held = tensor.index_select(0, holes)
                tensor.index_copy_(0, holes, tensor.index_select(0, movers))
                tensor.index_copy_(0, movers, held)

    def _grow(self, needed: int) -> None:
        extra = max(GROWTH, needed - self.capacity)
        self.own_kvs = [F.pad(kv, (0, 0, 0, extra)) for kv in self.own_kvs]
        self.capacity += extra
        body = self.weights.body
        self.tables = rotary_tables(body.rotary, self.prompt_ids.shape[1] + self.capacity, body.embed.dtype)

    # ---- a turn ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def turn(self, rows: Tensor, max_new: int, limits: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """A turn for `rows` (row numbers, ascending): completion ids `[A, T]` (T <= max_new; pad after a row's stop
        token) and their log-probs `[A, T]` (float32; log softmax(logits / temperature), temperature 1 when greedy;
        0 after a row ended). A row ends at its stop token, after max_new tokens, or after `limits[a]` tokens (its
        room, where given). Only live rows draw, in row order."""
        if max_new < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new}")
        if self.graphs and not self.prefilled and not self.keeps_rows:
            from rloo.generation.static_decode import static_generate

            return static_generate(
                None, self.prompt_ids, self.prompt_mask, self.sampling, self.eos, self.pad, weights=self.weights
            )
        if not self.prefilled:
            self._prefill()
        waiting = rows[self.pending.index_select(0, self._slots_of(rows.to(self.rows.device))).cpu() >= 0]
        if len(waiting):  # a last turn's token not yet fed (no reply came since): fed now
            self.append(waiting, [[] for _ in range(len(waiting))])
        if int(self.own_len.max()) + max_new > self.capacity:
            self._grow(int(self.own_len.max()) + max_new)
        self._to_front(rows)
        return self._decode(len(rows), max_new, None if limits is None else limits.to(self.rows.device))

    def _decode(self, count: int, max_new: int, limits: Tensor | None) -> tuple[Tensor, Tensor]:
        """The decode loop over the first `count` slots: each live slot draws, ended slots leave the batch (moved
        past the live ones), the rest take one decode step; returns this turn's ids and log-probs in row order."""
        sampling, device, pad = self.sampling, self.rows.device, self.pad
        rows, position, own_len, pending, logits, *own_kvs = [t[:count] for t in self._state()]
        completion_ids = torch.full((count, max_new), pad, dtype=self.prompt_ids.dtype, device=device)
        logprobs = torch.zeros(count, max_new, dtype=torch.float32, device=device)
        outputs = completion_ids, logprobs
        order = rows.argsort()  # the slots in row order: the order rows draw in
        in_order = bool((order == torch.arange(count, device=device)).all())
        # each slot's line of this turn's outputs (its rank among the turn's rows)
        turn_rows = torch.empty_like(rows).index_copy_(0, order, torch.arange(count, device=device))
        limit = None if limits is None else limits.index_select(0, turn_rows)  # [B] each slot's room
        base = int(own_len[0])
        offsets = None if bool((own_len == base).all()) else own_len.clone()  # rows at different lengths
        live = torch.ones(count, dtype=torch.bool, device=device)  # [B] only without dropping: False once ended
        num_live, width = count, max_new
        draw = None if in_order else order  # the live slots in row order; None: every slot, in that order
        groups = _slot_groups(self.inverse, self.member, self.group_size, self.prompt_bias, rows)
        extra = [t for t in (offsets, limit) if t is not None]
        for step in range(max_new):
            new_tokens, tokens = _draw(logits, turn_rows, draw, sampling, pad, step, outputs)
            if step == max_new - 1:  # every live row ends here, its last token pending
                drawn = torch.arange(len(tokens), device=device) if draw is None else draw  # [A] the slots that drew
                own_len.index_add_(0, drawn, torch.full_like(drawn, step))
                pending.index_copy_(0, drawn, new_tokens)
                break
            ended = None if self.stop_id is None else new_tokens == self.stop_id  # [A]
            if limit is not None:
                at_limit = (limit if draw is None else limit.index_select(0, draw)) <= step + 1
                ended = at_limit if ended is None else ended | at_limit
            num_ended = 0 if ended is None else int(ended.sum())
            if num_ended:
                ended_slots = ended.nonzero().squeeze(1) if draw is None else draw[ended]
                own_len.index_add_(0, ended_slots, torch.full_like(ended_slots, step))
                pending.index_copy_(0, ended_slots, new_tokens[ended])
                num_live -= num_ended
                if num_live == 0:
                    width = step + 1
                    break
                if self.drop_finished:
                    moves = _swap_rows if self.keeps_rows else _drop_rows
                    state = [tokens, turn_rows, rows, position, own_len, pending, *extra, *own_kvs]
                    tokens, turn_rows, rows, position, own_len, pending, *rest = moves(ended_slots, num_live, *state)
                    extra, own_kvs = rest[: len(extra)], rest[len(extra) :]
                    offsets = extra[0] if offsets is not None else None
                    limit = extra[-1] if limit is not None else None
                    draw = turn_rows.argsort()
                    groups = _slot_groups(self.inverse, self.member, self.group_size, self.prompt_bias, rows)
                else:
                    live[ended_slots] = False
                    draw = live.nonzero().squeeze(1)
            # one decode step: the token just drawn goes into each slot's own cache
            hidden = _embed(self.weights.body, tokens[:, None])  # [B, 1, D]
            cos, sin = self.tables[0][position][:, None], self.tables[1][position][:, None]  # [B, 1, rot]
            logits = _decode_step(
                self.weights,
                hidden,
                cos,
                sin,
                self.prompt_kvs,
                own_kvs,
                self._step_groups(groups, base + step if offsets is None else step, offsets),
            )
            position += 1
        return completion_ids[:, :width], logprobs[:, :width]

    @staticmethod
    def _step_groups(groups, step: int, offsets: Tensor | None):
        """The step's groups: all rows at the same own length (`step` the slot every row writes), or, where an
        episode's rows differ (`offsets` `[B]`), each row's slot and a bias over the own cache up to it."""
        if offsets is None:
            return groups._replace(step=step)
        reach = offsets + step  # [B] the slot each row writes
        visible = torch.arange(int(reach.max()) + 1, device=reach.device)[None, :] <= reach[:, None]
        bias = torch.zeros(visible.shape, dtype=torch.float32, device=reach.device).masked_fill_(~visible, -torch.inf)
        return groups._replace(step=0, own_slots=reach, own_bias=bias[:, None, None])

    # ---- an environment's tokens -------------------------------------------------------------------------------
    @torch.no_grad()
    def append(self, rows: Tensor, chunks: list[list[int]]) -> None:
        """Feed each row of `rows` its pending token and then `chunks[a]` (the environment's reply, maybe none) in one
        forward: their keys and values written into the row's own cache, the row's next logits kept."""
        device = self.rows.device
        slots = self._slots_of(rows.to(device))
        pending = self.pending.index_select(0, slots).tolist()
        fed = [([p] if p >= 0 else []) + list(c) for p, c in zip(pending, chunks)]
        width = max(1, max(map(len, fed)))
        counts = torch.tensor([len(f) for f in fed], device=device)
        if int(self.own_len.max()) + width > self.capacity:
            self._grow(int(self.own_len.max()) + width)
        tokens = torch.tensor([f + [self.pad] * (width - len(f)) for f in fed], dtype=torch.long, device=device)
        own_len, position = self.own_len.index_select(0, slots), self.position.index_select(0, slots)
        own_kvs = [kv.index_select(0, slots) for kv in self.own_kvs]  # [A, kv_heads, 2, C, hd]
        logits = self._chunk_forward(tokens, self.rows.index_select(0, slots), own_len, position, own_kvs, counts)
        for kv, part in zip(self.own_kvs, own_kvs):
            kv.index_copy_(0, slots, part)
        self.own_len.index_copy_(0, slots, own_len + counts)
        self.position.index_copy_(0, slots, position + counts)
        self.pending.index_fill_(0, slots, -1)
        self.logits.index_copy_(0, slots, logits.to(self.logits.dtype))

    def _chunk_forward(self, tokens, rows, own_len, position, own_kvs, counts) -> Tensor:
        """Every layer over a chunk of tokens per row (`tokens` `[A, M]`, right-padded; `counts` `[A]` real), each
        attending to its prompt's cache and its own cache up to itself: the logits after each row's last real
        token `[A, V]`."""
        body, shape = self.weights.body, self.weights.body.shape
        count, width = tokens.shape
        device, hd = tokens.device, shape.head_dim
        slots = own_len[:, None] + torch.arange(width, device=device)  # [A, M] where each token goes
        positions = position[:, None] + torch.arange(width, device=device)  # [A, M]
        groups = self.inverse[rows]  # [A] each row's prompt cache
        reach = int(slots.max()) + 1
        own_visible = torch.arange(reach, device=device)[None, None, :] <= slots[:, :, None]  # [A, M, W] causal
        prompt_visible = torch.ones(count, width, self.prompt_kvs[0].shape[3], dtype=torch.bool, device=device)
        if self.prompt_bias is not None:
            prompt_visible &= torch.isfinite(self.prompt_bias[groups])[:, None, :]
        mask = torch.cat([prompt_visible, own_visible], dim=2)[:, None]  # [A, 1, M, P + W]
        row_index = torch.arange(count, device=device)[:, None]
        layers = iter(zip(self.prompt_kvs, own_kvs))

        def attend(q: Tensor, kv: Tensor) -> Tensor:  # q [A, H, M, hd], kv [A, kv_heads, M, 2*hd]
            prompt_kv, own = next(layers)
            own.permute(0, 3, 1, 2, 4)[row_index, slots] = kv.unflatten(-1, (2, hd)).permute(0, 2, 1, 3, 4)
            prompt = prompt_kv.index_select(0, groups)  # [A, kv_heads, 2, P, hd]
            keys = torch.cat([prompt[:, :, 0], own[:, :, 0, :reach]], dim=2)
            values = torch.cat([prompt[:, :, 1], own[:, :, 1, :reach]], dim=2)
            return masked_attention(q, keys, values, mask, shape)

        hidden = _embed(body, tokens)  # [A, M, D]
        cos, sin = self.tables[0][positions], self.tables[1][positions]
        for layer in body.layers:
            hidden = body.layer_forward(hidden, layer, shape, cos, sin, attend)
        last = (counts - 1).clamp(min=0)
        return _last_logits(self.weights, hidden[torch.arange(count, device=device), last][:, None])


@torch.no_grad()
def lean_generate(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    sampling: SamplingConfig,
    eos_token_id: int,
    pad_token_id: int,
    *,
    drop_finished: bool = True,
    weights: Prepared | None = None,
) -> tuple[Tensor, Tensor]:
    """Plain completions from the lean decode: one turn of every row (`LeanSampler`), as HF generate samples them.

    prompt_ids, prompt_mask: `[N, P]` left-padded. Returns completion ids `[N, T]` (T <= max_new_tokens; stops
    once every row has ended; pad_token_id after a row's EOS) and generation log-probs `[N, T]` float32:
    log softmax(logits / temperature) of each sampled token (temperature 1 when greedy), 0 after the row ended.
    drop_finished=False keeps ended rows in the forward, fed pad as generate does (the reference the tests compare
    against); either way only live rows draw, in row order, so both settings consume the random stream alike.
    weights: `prepared_weights(model, rows)` made before, for several calls with the same weights; None: made here.
    rloo.generation.static_decode.static_generate samples the same at static shapes (on a GPU, as CUDA graphs).
    """
    weights = weights if weights is not None else decode.prepared_weights(model, len(prompt_ids))
    sampler = LeanSampler(
        weights,
        prompt_ids,
        prompt_mask,
        sampling,
        eos_token_id,
        pad_token_id,
        capacity=sampling.max_new_tokens,
        keeps_rows=False,
        drop_finished=drop_finished,
    )
    return sampler.turn(torch.arange(len(prompt_ids), device=prompt_ids.device), sampling.max_new_tokens)
