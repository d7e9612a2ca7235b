"""Models handed to rloo.fit as Python objects, kept in the run dir as datasets are, so that the run dir holds what it
trained and resumes from the command line too.

- a transformers `PreTrainedModel` with its tokenizer: saved (save_pretrained) into `<run dir>/models/policy`, which
  `model.policy` and `model.tokenizer` then name;
- a peft `PeftModel`: its adapters merged into a copy of the base (the caller's object is left as it was), saved as
  above, and its LoRA settings (r, alpha, dropout, target modules) become rloo's (`model.lora=true`): rloo trains
  fresh adapters of that shape on it, with the merged model as the reference (the SFT policy an RLHF run starts
  from);
- a path or hub id: `model.policy` as the command line takes it.

A run dir that holds a model already (a resume) keeps it; a different model handed to that run is refused in one
line, by the hash of its weights.
"""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

from rloo.utils.errors import ConfigError

POLICY_DIR = Path("models") / "policy"


def is_peft_model(model) -> bool:
    return hasattr(model, "peft_config") and callable(getattr(model, "merge_and_unload", None))


def model_overrides(model, tokenizer, out: Path, log) -> list[str]:
    """The overrides for a handed-in model (see the module), the model saved where they point."""
    if model is None:
        if tokenizer is not None:
            raise ConfigError("tokenizer is given without model: hand in the model it belongs to (model=...)")
        return []
    if isinstance(model, (str, Path)):
        return [f"model.policy={model}"] + ([] if tokenizer is None else tokenizer_override(tokenizer))
    if tokenizer is None:
        raise ConfigError(f"model is a {type(model).__name__} object: hand in its tokenizer too (tokenizer=...)")
    if isinstance(tokenizer, (str, Path)):
        raise ConfigError(
            "tokenizer: with a model object, hand in the tokenizer object (AutoTokenizer.from_pretrained)"
        )
    lora = []
    if is_peft_model(model):
        lora = lora_overrides(model)
        plain = copy.deepcopy(model).merge_and_unload()  # the caller's model keeps its adapters
        log(
            f"rloo.fit: {type(model).__name__}: its adapters merged into the policy (also the reference); rloo trains "
            f"fresh adapters of its shape ({' '.join(lora[1:])})"
        )
    else:
        from transformers import PreTrainedModel

        if not isinstance(model, PreTrainedModel):
            raise ConfigError(
                f"model is a {type(model).__name__}: a transformers PreTrainedModel, a peft PeftModel, or a path or "
                "hub id"
            )
        plain = model
    target = out / POLICY_DIR
    save_once(plain, tokenizer, target)
    return [f"model.policy={target}", f"model.tokenizer={target}", *lora]


def tokenizer_override(tokenizer) -> list[str]:
    if not isinstance(tokenizer, (str, Path)):
        raise ConfigError("tokenizer: with a model path, give the tokenizer's path or hub id too (or leave it out)")
    return [f"model.tokenizer={tokenizer}"]


def lora_overrides(model) -> list[str]:
    """rloo's LoRA settings from a PeftModel's active LoRA config; one line for an adapter that is not LoRA."""
    config = model.peft_config[getattr(model, "active_adapter", "default")]
    if (
        getattr(config, "peft_type", None) is None
        or str(getattr(config.peft_type, "value", config.peft_type)) != "LORA"
    ):
        raise ConfigError(f"model: a PeftModel with a {config.peft_type} adapter: rloo trains LoRA adapters only")
    targets = config.target_modules
    targets = targets if isinstance(targets, str) else sorted(targets)
    shown = targets if isinstance(targets, str) else "[" + ",".join(targets) + "]"
    return [
        "model.lora=true",
        f"lora.r={config.r}",
        f"lora.alpha={config.lora_alpha}",
        f"lora.dropout={config.lora_dropout}",
        f"lora.target_modules={shown}",
    ]


def weights_hash(model) -> str:
    """sha256 of the model's weights by name: the same weights give the same hash, wherever they were loaded from."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def save_once(model, tokenizer, target: Path) -> None:
    """The model and tokenizer into `target` (whole or absent), with the hash of its weights beside them; where a
    run dir holds one already (a resume), the same weights pass and others are refused in one line."""
    from rloo.utils import atomic

    digest = weights_hash(model)
    recorded = target / "weights.sha256"
    if target.is_dir():
        if recorded.is_file() and recorded.read_text().strip() == digest:
            return
        raise ConfigError(f"model differs from the one {target} holds: this run dir trained that one")

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "weights.sha256").write_text(digest + "\n")

    target.parent.mkdir(parents=True, exist_ok=True)
    atomic.save_dir(write, target, "the model handed to rloo.fit")
