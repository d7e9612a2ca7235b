"""LoRA on the policy, with the base model as the reference: one copy of the weights serves both.

peft injects low-rank adapters into the policy's linear layers in place, so the policy stays the same transformers
model and every rollout function runs on it unchanged. The reference is that model with its adapters switched off
(`adapters_disabled`): exactly the initial policy, at no memory. `merged_copy` folds the adapters into a plain copy
for `save_pretrained`, which then loads in transformers without peft.
Plain torch + peft; no Lightning or Hydra. peft is imported only here, and only when adapters are asked for.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from typing import Iterator, Sequence

from torch import nn

ADAPTER_MARK = "lora_"  # in the name of every adapter parameter

ALL_LINEAR = "all-linear"  # peft: every linear layer but the output head


def resolve_targets(spec, config) -> list[str] | str:
    """lora.target_modules as peft takes it for a policy of this config (a transformers config or config.json's
    dict): `auto` (the attention and MLP projections of its family in rloo/families/; every linear layer for a model
    of no family there), `all-linear`, or a list of layer names as given."""
    if spec == "auto":
        from rloo.families import family_of_config

        family = family_of_config(config)
        return list(family.projections) if family is not None else ALL_LINEAR
    return spec if spec == ALL_LINEAR else list(spec)


def unmatched_targets(targets: list[str] | str, module_names: Sequence[str]) -> list[str]:
    """The names of `targets` that no module of the model ends with (peft matches a name's last parts)."""
    if targets == ALL_LINEAR:
        return []
    return [t for t in targets if not any(name == t or name.endswith("." + t) for name in module_names)]


def add_adapters(
    model: nn.Module, r: int, alpha: float, dropout: float, target_modules: Sequence[str] | str
) -> nn.Module:
    """Inject LoRA adapters (rank r, scale alpha / r) into the linear layers named in `target_modules` (or
    `all-linear`), in place. Only the adapters train; the base weights are frozen, and at initialisation the model
    computes what it did."""
    from peft import LoraConfig, inject_adapter_in_model

    targets = target_modules if target_modules == ALL_LINEAR else list(target_modules)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")
    return train_adapters_only(inject_adapter_in_model(config, model))


def train_adapters_only(model: nn.Module) -> nn.Module:
    """Adapter parameters trainable, every other parameter frozen."""
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(ADAPTER_MARK in name)
    return model


def adapter_layers(model: nn.Module) -> list[nn.Module]:
    """The layers peft wrapped (empty when peft is not installed: then nothing can have adapters)."""
    try:
        from peft.tuners.tuners_utils import BaseTunerLayer
    except ImportError:
        return []
    return [module for module in model.modules() if isinstance(module, BaseTunerLayer)]


def has_adapters(model: nn.Module) -> bool:
    return bool(adapter_layers(model))


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """The base model inside the block: every adapter off, then on again (and trainable) however the block ends."""
    layers = adapter_layers(model)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        train_adapters_only(model)  # peft's switch also flips requires_grad: restore exactly what trains


def merged_copy(model: nn.Module) -> nn.Module:
    """A copy with every adapter folded into its base weight (W + B A * alpha / r) and the wrappers removed: a plain
    transformers model. The model itself is left as it is."""
    merged = copy.deepcopy(model)
    wrapped = set(adapter_layers(merged))
    for name, module in list(merged.named_modules()):
        if module in wrapped:
            module.merge()
            parent, _, child = name.rpartition(".")
            setattr(merged.get_submodule(parent), child, module.get_base_layer())
    return merged


def adapter_state(state_dict: dict) -> dict:
    """The adapter entries of a state dict: all a LoRA checkpoint needs to keep (the base is the model it loads)."""
    return {key: value for key, value in state_dict.items() if ADAPTER_MARK in key}
