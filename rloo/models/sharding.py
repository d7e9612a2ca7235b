"""Weights partitioned across ranks (FSDP2, DeepSpeed ZeRO-3): how to shard a policy, and how to tell that a model's
weights are partitioned, so that the rollout takes the paths that gather them.

A partitioned model is only whole inside its own forward: FSDP2 gathers a block's weights in the hooks of the modules
`fully_shard` wrapped, ZeRO-3 in hooks on every module. Paths that read a weight directly (the chunked LM head, a body
called without its root) would see a shard, so a partitioned policy runs its own forward. The rollout instead
gathers the policy's weights whole once (`whole_weights`, as TRL, OpenRLHF and veRL gather or sync them for their
samplers) and the lean decode samples from them; where that copy would not fit (`gather_fits`), HF generate steps
through the sharded model with every rank stepping until all are done (each step gathers weights together).
No Lightning here: plain torch.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

WHOLE = "_rloo_weights_whole"  # set on a partitioned model while whole_weights holds its weights gathered
GATHERS = "rloo_rollout_gathers"  # set by the run on a partitioned policy: the rollout gathers its weights whole


def weights_partitioned(model: nn.Module) -> bool:
    """True when the weights of `model` hold only this rank's part: a module FSDP2 sharded (its class says so), or
    DeepSpeed ZeRO-3 parameters (which carry a `ds_id`; ZeRO-3 partitions every parameter of a model it manages, so
    the first one tells); this runs on every log-prob pass and generation call."""
    from torch.distributed.fsdp import FSDPModule

    if getattr(model, WHOLE, False):  # gathered for the rollout (whole_weights)
        return False
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


def whole_bytes(model: nn.Module) -> int:
    """Bytes of the model's weights whole: what gathering them for the rollout allocates on each rank (a DTensor's
    numel is the whole tensor's; a ZeRO-3 parameter's whole size is its ds_numel)."""
    return sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in model.parameters())


def gather_fits(needed: int, available: int, margin: float = 0.9) -> bool:
    """Whether a gathered copy of `needed` bytes fits in `available` free bytes with a tenth kept free."""
    return needed <= margin * available


@contextmanager
def whole_weights(model: nn.Module):
    """The weights of a partitioned model whole on every rank for the block, read directly by the lean decode, then
    partitioned again (their whole copies freed) before anything trains. A collective: every rank enters it at the
    same point. FSDP2: every unit `fully_shard` made is unsharded in place (its parameters become plain tensors);
    ZeRO-3: DeepSpeed's GatheredParameters. Inside it, weights_partitioned(model) is False."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if units:
        gathered = _fsdp_unsharded(units)
    else:
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    with gathered:
        setattr(model, WHOLE, True)
        try:
            yield model
        finally:
            delattr(model, WHOLE)


@contextmanager
def sampling_weights(model: nn.Module, lean_decode: bool):
    """The weights the sampler reads: a partitioned model's gathered whole (`whole_weights`) where the lean decode
    samples and the run found room for the copy (the model's GATHERS, decided once with every rank), else the model
    as it is (HF generate then steps through the partitioned model)."""
    if lean_decode and getattr(model, GATHERS, False) and weights_partitioned(model):
        with whole_weights(model):
            yield
    else:
        yield


@contextmanager
def _fsdp_unsharded(units: list):
    for unit in units:
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()


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
    """A plain (unsharded) copy of a partitioned model (FSDP2 or ZeRO-3) with every weight whole, on rank 0 (None on
    the other ranks), for save_pretrained. A collective: every rank calls it."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        state = full_state_dict(model)
    else:  # ZeRO-3: gathered on every rank for the copy
        with whole_weights(model):
            first = torch.distributed.get_rank() == 0
            state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()} if first else {}
    if torch.distributed.get_rank() != 0:
        return None
    plain_class = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))  # fully_shard subclasses it
    copy = plain_class(model.config).to(next(iter(state.values())).dtype)
    copy.load_state_dict(state)
    return copy.eval()
