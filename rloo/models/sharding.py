"""Weights partitioned across ranks (FSDP2, DeepSpeed ZeRO-3): how to shard a policy, and how to tell that a model's
weights are partitioned, so that the rollout takes the paths that gather them.

A partitioned model is only whole inside its own forward: FSDP2 gathers a block's weights in the hooks of the modules
`fully_shard` wrapped, ZeRO-3 in hooks on every module. Paths that read a weight directly (the lean decode, the
chunked LM head, a body called without its root) would see a shard, so a partitioned policy runs its own forward,
and HF generate keeps every rank stepping until all ranks are done (each step gathers weights together).
No Lightning here: plain torch.
"""

from __future__ import annotations

import torch
from torch import nn


def weights_partitioned(model: nn.Module) -> bool:
    """True when the weights of `model` hold only this rank's part: a module FSDP2 sharded (its class says so), or
    DeepSpeed ZeRO-3 parameters (which carry a `ds_id`; ZeRO-3 partitions every parameter of a model it manages, so
    the first one tells); this runs on every log-prob pass and generation call."""
    from torch.distributed.fsdp import FSDPModule

    # FSDP2 by the class: after a forward without backward (an evaluation) it leaves the root's own weights gathered
    # as plain tensors, so its first weight would not tell
    return isinstance(model, FSDPModule) or hasattr(next(model.parameters(), None), "ds_id")


def ranks_step_together(model: nn.Module) -> bool:
    """Generation must keep every rank in step: each decode step of a partitioned model gathers weights, a
    collective every rank joins, so a rank whose rows all ended keeps stepping until all have (synced_gpus)."""
    return (
        weights_partitioned(model)
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


def shard_model(model: nn.Module, mesh) -> nn.Module:
    """FSDP2: each transformer block is a unit (its weights gathered for its forward and backward, then freed), and
    the root holds the rest (embeddings, final norm, head). `mesh`: the 1-D data-parallel device mesh."""
    from torch.distributed.fsdp import fully_shard

    block_types = tuple(getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in block_types]
    if not blocks:
        raise ValueError(f"{type(model).__name__} names no transformer block (_no_split_modules) to shard by")
    for block in blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def gather_ranks(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's `tensor` stacked [world, ...] (a collective: every rank calls it). torch.distributed's own
    all_gather: Lightning's strategy.all_gather goes through the autograd variant that torch deprecates."""
    tensor = tensor.contiguous()
    gathered = [torch.empty_like(tensor) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, tensor)
    return torch.stack(gathered)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every weight whole, on CPU, on rank 0 (empty on the other ranks). A collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def whole_copy(model: nn.Module) -> nn.Module | None:
    """A plain (unsharded) copy of a partitioned model with every weight whole, on rank 0 (None on the other ranks),
    for save_pretrained. A collective: every rank calls it."""
    from torch.distributed.fsdp import FSDPModule

    state = full_state_dict(model)
    if torch.distributed.get_rank() != 0:
        return None
    plain_class = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))  # fully_shard subclasses it
    copy = plain_class(model.config).to(next(iter(state.values())).dtype)
    copy.load_state_dict(state)
    return copy.eval()
