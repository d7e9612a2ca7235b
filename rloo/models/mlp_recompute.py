"""The policy's MLPs keep fewer activations for the backward pass, for one elementwise op each in the backward.

In a transformer block the MLP holds most of what autograd keeps for the backward. A GELU MLP (GPT-NeoX, GPT-2)
keeps h = up(x), the activation's input, and a = act(h), the down-projection's input, each `[tokens, I]`; a gated MLP
(Llama, Qwen, Mistral, Gemma) keeps g = gate(x), u = up(x), act(g) and act(g) * u. All but h (g and u) are
elementwise functions of the others, so here they are saved as a recipe instead of a tensor
(`torch.autograd.graph.saved_tensors_hooks`) and recomputed from the kept ones when the backward reaches them: I fewer
values per token and layer for GELU MLPs, 2I fewer for gated ones (a fifth to a third of the policy's activations),
for one activation (and one product) more per layer in the backward. No matrix product is recomputed, unlike
activation checkpointing.

Autograd's math is untouched: the same ops run and save the same values; a recomputed tensor is the same op on the
same input. A layer is patched only after its new forward matched the module's own on a probe input.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch import Tensor, nn

from rloo.families import family_of, no_family
from rloo.families.base import MLPForm


class _Recipes:
    """Tensors registered as recomputable, inside `with _Recipes() as recipes:`. A tensor autograd saves there that
    is one of them (or a view of it) is packed as the function that makes it again, and made again when the backward
    unpacks it. autograd keeps the pack hook with every tensor saved under it, so the hook holds no tensor: only the
    address of each registered one (alive, and so not reused, until the block ends) and its recipe."""

    def __init__(self):
        self._recipes: dict[tuple[int, torch.dtype], Callable[[], Tensor]] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)

    def __enter__(self) -> "_Recipes":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._recipes.clear()
        self._hooks.__exit__(*exc)

    def add(self, tensor: Tensor, remake: Callable[[], Tensor]) -> Tensor:
        if tensor.requires_grad and tensor.is_contiguous():  # a fresh output; nothing to save without autograd
            self._recipes[tensor.untyped_storage().data_ptr(), tensor.dtype] = remake
        return tensor

    def _pack(self, saved: Tensor):
        remake = self._recipes.get((saved.untyped_storage().data_ptr(), saved.dtype))
        if remake is None:
            return saved
        return remake, saved.shape, saved.stride(), saved.storage_offset(), saved.device.type


def _unpack(packed):
    if isinstance(packed, Tensor):
        return packed
    remake, shape, stride, offset, device = packed
    # the forward's elementwise ops ran on the kept tensors' dtype (autocast casts none of them): so does this
    with torch.no_grad(), torch.autocast(device, enabled=False):
        return remake().as_strided(shape, stride, offset)


def _gated_forward(names: tuple[str, ...]):
    gate_name, up_name, down_name, act_name = names

    def forward(self, x: Tensor) -> Tensor:
        """down(act(gate(x)) * up(x)), keeping g and u: act(g) and the product are recomputed from them."""
        gate, up, act = getattr(self, gate_name)(x), getattr(self, up_name)(x), getattr(self, act_name)
        with _Recipes() as recipes:
            activated = recipes.add(act(gate), lambda: act(gate))
            product = recipes.add(activated * up, lambda: act(gate) * up)
            return getattr(self, down_name)(product)

    return forward


def _up_act_down_forward(names: tuple[str, ...]):
    up_name, act_name, down_name = names

    def forward(self, x: Tensor) -> Tensor:
        """down(act(up(x))), keeping h = up(x): act(h), the down-projection's input, is recomputed from it."""
        hidden = getattr(self, up_name)(x)
        act = getattr(self, act_name)
        with _Recipes() as recipes:
            out = getattr(self, down_name)(recipes.add(act(hidden), lambda: act(hidden)))
        dropout = getattr(self, "dropout", None)
        return dropout(out) if dropout is not None else out

    return forward


def _recomputing_forward(form: MLPForm):
    """The recomputing forward of the family's MLP form, and the name of its first projection (the probe's input)."""
    return (_gated_forward if form.gated else _up_act_down_forward)(form.names), form.names[0]


def _mlps(model: nn.Module) -> list[nn.Module]:
    return [module for name, module in model.named_modules() if name.rsplit(".", 1)[-1] == "mlp"]


def why_not_recompute_mlp(model: nn.Module) -> str | None:
    """None when the model's family (rloo/families/) gives its MLP form and every block's MLP has that form's
    layers, else why not."""
    if reason := no_family(model):
        return reason
    family = family_of(model)
    mlps = _mlps(model)
    if not mlps:
        return f"{type(model).__name__} has no module named mlp"
    unknown = sorted({type(mlp).__name__ for mlp in mlps if not all(hasattr(mlp, name) for name in family.mlp.names)})
    if unknown:
        return f"{', '.join(unknown)} lacks the {family.name} MLP's layers ({', '.join(family.mlp.names)})"
    return None


def _matches(mlp: nn.Module, forward, first: str) -> bool:
    """The new forward gives the module's own output on a probe input (eval mode, no gradients: no dropout)."""
    param = next(mlp.parameters())
    if param.device.type == "meta":
        return True
    layer = getattr(mlp, first)
    in_features = layer.in_features if hasattr(layer, "in_features") else layer.weight.shape[0]  # GPT-2's Conv1D
    probe = torch.randn(1, 3, in_features, generator=torch.Generator().manual_seed(0)).to(param)
    was_training = mlp.training
    mlp.eval()
    try:
        with torch.no_grad():
            return torch.equal(type(mlp).forward(mlp, probe), forward(mlp, probe))
    finally:
        mlp.train(was_training)


def recompute_mlp_activations(model: nn.Module) -> tuple[str, str]:
    """Patch every block's MLP of `model` (in place) to keep fewer activations; returns the fast path as (what runs,
    why), for the run's log and summary.json. Nothing is patched unless every MLP can be."""
    if reason := why_not_recompute_mlp(model):
        return "kept", f"mlp_recompute=true, but {reason}"
    mlps = _mlps(model)
    form = family_of(model).mlp
    forward, first = _recomputing_forward(form)
    for mlp in mlps:
        if not _matches(mlp, forward, first):
            return "kept", (
                f"mlp_recompute=true, but {type(mlp).__name__}'s own forward differs from the form recomputed here "
                "on a probe input"
            )
    for mlp in mlps:
        mlp.forward = types.MethodType(forward, mlp)
    gated = form.gated
    return "mlp_recompute", (
        f"{len(mlps)} MLPs keep their up-projection{'s' if gated else ''} only; "
        f"{'act(gate) and act(gate) * up are' if gated else 'act(h) is'} recomputed in the backward"
    )
