"""Model families: one module per family, each exporting one `Family` record (rloo/families/base.py), and this list
of them. Everything in rloo that depends on a model's family reads it from here: LoRA's `auto` targets, the lean
decode's layer code, the memory plan's layout, the MLP form rloo.models.mlp_recompute rewrites, and `why_not`, which the
run and `rloo.plan` both ask before a fast path serves a model. No other module switches on a model class or a
`model_type` string.

Adding a family is a module here and a line in FAMILIES (docs/extending.md); a model of no family listed still
trains, on HF generate and the plain forward, and the run says why.
"""

from __future__ import annotations

from rloo.families import gemma2, gpt_neox, llama, mistral, qwen2, qwen3
from rloo.families.base import Architecture, Family

FAMILIES: tuple[Family, ...] = (
    gpt_neox.FAMILY,
    llama.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    mistral.FAMILY,
    gemma2.FAMILY,
)
_BY_MODEL_TYPE = {model_type: family for family in FAMILIES for model_type in family.model_types}


def family_named(model_type: str | None) -> Family | None:
    """The family that claims config.json's `model_type`, or None."""
    return _BY_MODEL_TYPE.get(model_type or "")


def family_of_config(config) -> Family | None:
    """The family of a transformers config, or of a config.json read as a dict, by its `model_type`."""
    return family_named(config.get("model_type") if isinstance(config, dict) else getattr(config, "model_type", None))


def family_of(model) -> Family | None:
    """The family of a transformers model (causal LM or sequence classifier), by its config's `model_type`."""
    return family_of_config(getattr(model, "config", None))


def known_model_types() -> str:
    return ", ".join(_BY_MODEL_TYPE)


def architecture_from_config(values: dict) -> Architecture | None:
    """The memory plan's Architecture of a config.json, read by its family; None for a model_type of no family."""
    family = family_of_config(values)
    return family.architecture(values) if family is not None else None


def no_family(model) -> str | None:
    """Why `model` has no family here (its model_type is none of theirs), or None."""
    if family_of(model) is not None:
        return None
    model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    return f"model_type {model_type} is none of the families in rloo/families/ ({known_model_types()})"


def why_not(model, sequence_length: int | None) -> str | None:
    """None where the fast paths' per-family code (the lean decode's layers, the shared-prefix forward) is written and
    tested for `model`'s body, over padded rows of `sequence_length` tokens (prompt + completion); else why not.
    A sliding window is served only where it covers every row, so that full attention computes what it does."""
    if reason := no_family(model):
        return reason
    family = family_of(model)
    window = family.attention_window(model.config)
    if window is not None and (sequence_length is None or sequence_length > window):
        length = "rows of unknown length" if sequence_length is None else f"{sequence_length}-token rows"
        return f"its sliding-window attention ({window} tokens) does not cover {length} (prompt + completion)"
    return None
