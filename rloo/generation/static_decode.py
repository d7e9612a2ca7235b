"""The lean decode's static-shape loop, for GPUs: every step the same shapes, so one step is captured as a CUDA
graph and replayed, one launch instead of a dozen kernels per layer.

At 1B sizes the eager loop (rloo.generation.decode.lean_generate) is launch-bound on a GPU: Pythia-1B took 8.3 ms a
token for
64 rows on an H200, where reading its weights takes about 0.5 ms. Here the step's shapes never change:

- each row's own cache is read whole (`[B, kv_heads, 2, max_new, hd]`), the positions past the step masked, and the
  new k|v is written at a step held in a tensor, so the step's arithmetic is the eager loop's over more (masked)
  keys: the same layer code (rloo/families/), the same grouped prompt cache, the same draws;
- rows that end are fed pad (as HF generate does) instead of leaving the batch, until the live rows fit a smaller
  bucket (N, N/2, N/4, N/8 rows): then the live rows move into the first slots, in place, and the bucket's own
  graph runs on the buffers' first rows. At most four graphs per call, captured into one memory pool;
- sampling, the end-of-row test and the moves run eagerly between replays (they read the logits on the host).

`capture=False` runs the same static step eagerly: what the CPU tests compare with HF generate and the eager loop.
Plain torch + transformers.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from rloo.generation.decode import (
    Prepared,
    _decode_step,
    _draw,
    _embed,
    _Groups,
    _prefill_groups,
    prepared_weights,
    rotary_tables,
)
from rloo.generation.sampling import position_ids_for
from rloo.generation.settings import SamplingConfig

MAX_BUCKETS = 4  # N, N/2, N/4, N/8 rows


def why_not_graph(model) -> str | None:
    """None where the static step can be captured as a CUDA graph (the model's weights on a CUDA device), else
    why not."""
    device = model.get_input_embeddings().weight.device
    if device.type != "cuda":
        return f"the policy is on {device.type}; CUDA graphs need a GPU"
    return None


def buckets(rows: int) -> list[int]:
    """The batch sizes the loop runs at, largest first: rows, then halves (rounded up), at most MAX_BUCKETS."""
    sizes = [rows]
    while len(sizes) < MAX_BUCKETS and sizes[-1] > 1:
        sizes.append((sizes[-1] + 1) // 2)
    return sizes


def _uncached_autocast():
    """The autocast state in force (a bf16-mixed run samples under it), without its cache of cast weights: a cast
    cached during capture would be freed when the run's autocast region ends, under the graph that reads it."""
    enabled = torch.is_autocast_enabled("cuda")
    return torch.autocast("cuda", dtype=torch.get_autocast_dtype("cuda"), enabled=enabled, cache_enabled=False)


def _capture(step: Callable[[], Tensor], pool) -> Callable[[], Tensor]:
    """`step` captured as a CUDA graph into `pool`: a callable that replays it and returns its logits buffer."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), _uncached_autocast():  # a warm-up outside capture: lazy init, library workspaces
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool), _uncached_autocast():
        logits = step()

    def replay() -> Tensor:
        graph.replay()
        return logits

    return replay


class _Slots:
    """The static buffers the step reads, one row per slot; moves keep every live row in the first slots."""

    def __init__(self, rows: int, max_new: int, positions: Tensor, slot_group: Tensor, slot_member: Tensor, bias):
        device = positions.device
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        self.positions = positions.clone()  # [N] the position of each slot's next token
        self.rows = torch.arange(rows, device=device)  # original row of each slot
        self.live = torch.ones(rows, dtype=torch.bool, device=device)
        self.group, self.member, self.bias = slot_group.clone(), slot_member.clone(), bias
        self.step = torch.zeros(1, dtype=torch.long, device=device)
        self.own_bias = torch.zeros(max_new, dtype=torch.float32, device=device)

    def state(self, own_kvs: list[Tensor]) -> list[Tensor]:
        extra = [] if self.bias is None else [self.bias]
        return [self.tokens, self.positions, self.rows, self.live, self.group, self.member, *extra, *own_kvs]

    def compact(self, width: int, size: int, own_kvs: list[Tensor]) -> None:
        """Move the live rows of slots [size, width) into ended slots below `size`, in place."""
        live = self.live[:width]
        movers = live[size:].nonzero().squeeze(1) + size
        holes = (~live[:size]).nonzero().squeeze(1)[: len(movers)]
        for tensor in self.state(own_kvs):
            tensor.index_copy_(0, holes, tensor.index_select(0, movers))


def _static_step(weights: Prepared, slots: _Slots, prompt_kvs, own_kvs, tables, group_size: int, width: int):
    """The decode step over the first `width` slots, every shape fixed: it reads the tokens, positions and step
    index from `slots` and returns the logits `[width, V]`."""
    cos_table, sin_table = tables
    positions_ahead = torch.arange(len(slots.own_bias), device=slots.step.device)

    def step() -> Tensor:
        slots.own_bias.copy_(torch.where(positions_ahead <= slots.step, 0.0, float("-inf")))
        positions = slots.positions[:width]
        cos, sin = cos_table[positions][:, None], sin_table[positions][:, None]
        bias = None if slots.bias is None else slots.bias[:width]
        groups = _Groups(slots.group[:width], slots.member[:width], group_size, bias, slots.step, False, slots.own_bias)
        hidden = _embed(weights.body, slots.tokens[:width, None])
        return _decode_step(weights, hidden, cos, sin, prompt_kvs, [kv[:width] for kv in own_kvs], groups)

    return step


@torch.no_grad()
def static_generate(
    model,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    sampling: SamplingConfig,
    eos_token_id: int,
    pad_token_id: int,
    *,
    weights: Prepared | None = None,
    capture: bool = True,
) -> tuple[Tensor, Tensor]:
    """`rloo.generation.decode.lean_generate`'s samples from static-shape steps: the same ids and log-probs (to float
    rounding: the softmax spans masked positions too), the same random stream. capture: replay each bucket's
    step as a CUDA graph (the model on a GPU); False: run it eagerly."""
    if sampling.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {sampling.max_new_tokens}")
    weights = weights if weights is not None else prepared_weights(model, len(prompt_ids))
    body, shape = weights.body, weights.body.shape
    num_rows, prompt_len = prompt_ids.shape
    device, max_new = prompt_ids.device, sampling.max_new_tokens
    stop_id = eos_token_id if sampling.stop_at_eos else None

    cos_table, sin_table = rotary_tables(body.rotary, prompt_len + max_new, body.embed.dtype)
    prompt_kvs, logits, inverse, member, group_size, prompt_bias = _prefill_groups(
        weights, prompt_ids, prompt_mask, cos_table, sin_table
    )
    own_kvs = [
        torch.zeros(num_rows, shape.kv_heads, 2, max_new, shape.head_dim, dtype=weights.cache_dtype, device=device)
        for _ in body.layers
    ]  # zeros: masked positions weigh 0 * value, never 0 * garbage
    bias = None if prompt_bias is None else prompt_bias[inverse][:, None, None]  # [N, 1, 1, P]
    slots = _Slots(num_rows, max_new, position_ids_for(prompt_mask)[:, -1] + 1, inverse, member, bias)

    def step_of(width: int) -> Callable[[], Tensor]:
        return _static_step(weights, slots, prompt_kvs, own_kvs, (cos_table, sin_table), group_size, width)

    pool = torch.cuda.graph_pool_handle() if capture else None
    runners: dict[int, Callable[[], Tensor]] = {}
    sizes = buckets(num_rows)
    width, num_live = num_rows, num_rows
    completion_ids = torch.full((num_rows, max_new), pad_token_id, dtype=prompt_ids.dtype, device=device)
    generation_logprobs = torch.zeros(num_rows, max_new, dtype=torch.float32, device=device)
    outputs = completion_ids, generation_logprobs
    draw = None  # the live slots in original row order; None: every slot, already in that order
    length = max_new
    for step in range(max_new):
        rows = slots.rows[:width]
        new_tokens, tokens = _draw(logits, rows, draw, sampling, pad_token_id, step, outputs)
        if step == max_new - 1:
            break
        slots.tokens[:width].copy_(tokens)

        ended = None if stop_id is None else new_tokens == stop_id
        num_ended = 0 if ended is None else int(ended.sum())
        if num_ended:
            num_live -= num_ended
            if num_live == 0:
                length = step + 1
                break
            slots.live[ended.nonzero().squeeze(1) if draw is None else draw[ended]] = False
            smaller = min(size for size in sizes if size >= num_live)
            if smaller < width:
                slots.compact(width, smaller, own_kvs)
                width = smaller
            live_slots = slots.live[:width].nonzero().squeeze(1)
            draw = live_slots[slots.rows[live_slots].argsort()]

        slots.step.fill_(step)
        if width not in runners:
            runners[width] = _capture(step_of(width), pool) if capture else step_of(width)
        logits = runners[width]()
        slots.positions += 1
    return completion_ids[:, :length], generation_logprobs[:, :length]
