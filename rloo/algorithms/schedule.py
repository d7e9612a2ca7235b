"""The update schedule every algorithm shares: num_ppo_epochs passes over a rollout's rows, each num_mini_batches
mini-batches of micro-batches, an optimiser step after each mini-batch (`micro_batches`), and what differs by
strategy when gradients accumulate and the optimiser steps (`StrategyAdapter`). An algorithm's update reads:

    for micro in self.update_micro_batches(len(rollout), shuffle=True):
        loss, stats = <the algorithm's loss on rollout.select(micro.index)>
        self.accumulate_gradients(loss, micro)
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator, NamedTuple

import torch
from torch import Tensor


def mini_batch_indices(
    n: int, k: int, micro_batch_size: int, num_mini_batches: int, whole_groups: bool, shuffle: bool, device
) -> Iterator[list[Tensor]]:
    """One pass over n rollout rows: num_mini_batches mini-batches, each a list of micro-batch row indices. Without
    `shuffle` rows keep their prompt-major order. With it, whole groups of k are shuffled where `whole_groups` (each
    micro-batch then holds whole groups, so the prompt runs once per group in the update too), else single rows."""
    if shuffle and whole_groups:
        groups = torch.randperm(n // k, device=device)
        order = (groups[:, None] * k + torch.arange(k, device=device)).flatten()
    else:
        order = torch.randperm(n, device=device) if shuffle else torch.arange(n, device=device)
    for mini in order.split(n // num_mini_batches):
        yield list(mini.split(micro_batch_size))


class MicroBatch(NamedTuple):
    index: Tensor  # the rollout rows it holds
    last_of_mini_batch: bool  # gradients are reduced across ranks after it, and the optimiser steps
    mini_batch: Tensor  # the rows of its whole mini-batch (a loss averaged over tokens weighs its share of them)


def micro_batches(passes: Iterable[Iterator[list[Tensor]]], step: Callable[[], None]) -> Iterator[MicroBatch]:
    """Every micro-batch of an update in order, each with its place in its mini-batch; `step` (the optimiser step)
    runs once the caller has finished with a mini-batch's last micro-batch. `passes`: one `mini_batch_indices` pass
    per epoch."""
    for mini_batches in passes:
        for mini_batch in mini_batches:
            for position, index in enumerate(mini_batch):
                yield MicroBatch(index, position == len(mini_batch) - 1, torch.cat(mini_batch))
            step()


class StrategyAdapter:
    """The strategy differences of an update, in one place. DDP reduces gradients through Lightning's
    `toggle_model(sync_grad=...)` (the module's own code); FSDP2 (rloo.models.sharding) has its own sync switch on the
    policy; DeepSpeed holds the gradients itself, must be told the accumulation boundary before each backward, clips
    inside its step and reports the norm it clipped by."""

    def __init__(self, module):
        self.module = module

    @property
    def deepspeed_engine(self):
        module = self.module
        return getattr(module.trainer.strategy, "deepspeed_engine", None) if module._trainer is not None else None

    @property
    def clips_itself(self) -> bool:
        """DeepSpeed clips inside its step (gradient_clipping, rloo.run.assemble.deepspeed_settings); p.grad holds
        nothing."""
        return self.deepspeed_engine is not None

    def backward_sync(self, last_of_mini_batch: bool):
        """The context of one micro-batch's backward: gradients are reduced across ranks after the last micro-batch
        of a mini-batch only. DeepSpeed reduces (and may step) only at a boundary it is told of, and refuses DDP's
        no_sync under ZeRO-2 and 3; FSDP2 has its own switch on the policy; the rest take Lightning's
        toggle_model (DDP's no_sync)."""
        engine = self.deepspeed_engine
        if engine is not None:
            engine.set_gradient_accumulation_boundary(last_of_mini_batch)
            # what the engine's own forward does first, each micro-batch: the module's micro-batches run the policy
            # outside it, and without this ZeRO-3 counts every backward of a mini-batch as its first, keeping the
            # last micro-batch's gradients only (seen: DeepSpeed 0.19.8, grad norm 0.60 where DDP's was 3.91)
            if hasattr(engine.optimizer, "clear_backward_seen_flag"):
                engine.optimizer.clear_backward_seen_flag()
            return contextlib.nullcontext()
        if hasattr(self.module.policy, "set_requires_gradient_sync"):  # FSDP2
            self.module.policy.set_requires_gradient_sync(last_of_mini_batch)
        return self.module.optimizers().toggle_model(sync_grad=last_of_mini_batch)

    def grad_norm_of_last_step(self) -> Tensor | None:
        """DeepSpeed: the norm it clipped by in the step just taken (nan before its first); None elsewhere (the
        module measured it before the step)."""
        engine = self.deepspeed_engine
        if engine is None:
            return None
        norm = engine.get_global_grad_norm()
        return torch.as_tensor(float("nan") if norm is None else float(norm))

    def loss_scaled(self) -> bool:
        """fp16 with a GradScaler: a non-finite gradient is the scaler's to handle (it skips that step and lowers the
        scale, as it must while it finds its scale); the guard would take the gradients its step needs to see."""
        module = self.module
        return module._trainer is not None and getattr(module.trainer.precision_plugin, "scaler", None) is not None
