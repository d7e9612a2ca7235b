"""Loading the three models RLOO needs (policy, frozen reference, frozen reward model) and their tokenizer.

Each is a save_pretrained dir or a hub id; with HF_HUB_OFFLINE=1 a hub id that is not cached fails at once.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel

from rloo.utils.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _from_pretrained(auto_class, name_or_path: str, **kwargs) -> PreTrainedModel:
    """auto_class.from_pretrained, with a file that does not load (truncated weights, a broken config) said in one
    line naming the dir (ConfigError, exit 2) instead of the loader's traceback."""
    try:
        return auto_class.from_pretrained(name_or_path, **kwargs)
    except Exception as error:  # OSError, safetensors' and json's own errors, a config transformers refuses
        detail = (str(error).strip().splitlines() or [""])[0][:160]
        raise ConfigError(f"{name_or_path} does not load as a model: {type(error).__name__}: {detail}") from None


def load_tokenizer(name_or_path: str, pad_token: str | None = None, chat_template: str | None = None):
    """Left-padded tokenizer (generation appends on the right); a pad token is added when missing."""
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, padding_side="left")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.add_special_tokens({"pad_token": pad_token or "[PAD]"})
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer


def load_policy(name_or_path: str, tokenizer=None) -> PreTrainedModel:
    """The trained policy, in fp32 (the precision plugin casts compute). A policy with a non-finite weight (a
    diverged run's save) is refused in one line: it would sample garbage and be scored as if it were a policy."""
    policy = _from_pretrained(AutoModelForCausalLM, name_or_path, dtype=torch.float32)
    with torch.no_grad():
        broken = [name for name, p in policy.named_parameters() if not torch.isfinite(p).all()]
    if broken:
        raise ConfigError(
            f"{name_or_path} has non-finite weights in {len(broken)} of {len(list(policy.parameters()))} tensors "
            f"(first: {broken[0]}): a policy must be finite to be sampled"
        )
    if tokenizer is not None:
        _fit_embeddings(policy, tokenizer)
    return policy


def load_reward_model(name_or_path: str, dtype: str = "float32", tokenizer=None) -> PreTrainedModel:
    """A sequence classifier with one label: its output at the last real token is the score."""
    reward_model = _from_pretrained(AutoModelForSequenceClassification, name_or_path, num_labels=1, dtype=DTYPES[dtype])
    if tokenizer is not None:
        _fit_embeddings(reward_model, tokenizer)
        reward_model.config.pad_token_id = tokenizer.pad_token_id
    return freeze(reward_model)


def load_value_model(name_or_path: str, tokenizer=None) -> PreTrainedModel:
    """PPO's value model: a trainable fp32 sequence classifier (one label) initialised from a reward model."""
    value_model = _from_pretrained(AutoModelForSequenceClassification, name_or_path, num_labels=1, dtype=torch.float32)
    if tokenizer is not None:
        _fit_embeddings(value_model, tokenizer)
        value_model.config.pad_token_id = tokenizer.pad_token_id
    value_model.eval()  # no dropout; still trained
    return value_model.requires_grad_(True)


def reference_from(
    policy: PreTrainedModel, name_or_path: str | None, dtype: str = "float32", autocast_dtype: str | None = None
) -> PreTrainedModel:
    """The frozen reference: a copy of the initial policy (its FP32Head included), or another checkpoint, stored in
    `dtype` as `store_frozen` does for a policy trained under autocast to `autocast_dtype` (None: no autocast)."""
    if name_or_path is None:
        reference = copy.deepcopy(policy)
    else:
        reference = _from_pretrained(AutoModelForCausalLM, name_or_path, dtype=torch.float32)
        if isinstance(policy.get_output_embeddings(), FP32Head):
            use_fp32_lm_head(reference)
    return freeze(store_frozen(reference, dtype, autocast_dtype))


def store_frozen(model: PreTrainedModel, dtype: str, autocast_dtype: str | None = None) -> PreTrainedModel:
    """Cast a float32 frozen model to `dtype` for storage.

    Under autocast to that same dtype (bf16-mixed, 16-mixed) only the linear layers are cast: their weights are
    what autocast rounds to that dtype before every matmul anyway, while embeddings, norms and an FP32Head keep
    float32, as in the policy. A reference copied from the initial policy then computes exactly what the policy
    computes (KL 0 at step 0) in about half the memory; a whole-model cast would also round the embeddings and
    norms, and the two would differ from the first token on.
    """
    if dtype == "float32":
        return model
    if dtype != autocast_dtype:
        return model.to(DTYPES[dtype])
    # a weight tied to an embedding (a tied LM head) stays float32 with it
    kept = {id(p) for m in model.modules() if not isinstance(m, torch.nn.Linear) for p in m.parameters(recurse=False)}
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and not isinstance(module, FP32Head) and id(module.weight) not in kept:
            module.to(DTYPES[dtype])
    return model


def freeze(model: PreTrainedModel) -> PreTrainedModel:
    model.eval()
    model.requires_grad_(False)
    return model


def _fit_embeddings(model: PreTrainedModel, tokenizer) -> None:
    # Pythia checkpoints pad the embedding to 50304, so the added [PAD] usually fits without a resize.
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tokenizer))


class FP32Head(torch.nn.Linear):
    """An LM head whose logits are computed in float32 whatever the autocast or weight dtype.

    bf16 logits carry ~3 significant digits; log-softmax over them is where rollout and training forward
    disagree most (MiniMax-M1: fp32 head, train/inference probability correlation 0.9 -> 0.99).
    Installed by swapping the head's class, so parameter names, checkpoints and save_pretrained are unchanged.
    """

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return F.linear(hidden.float(), self.weight.float(), bias)


def use_fp32_lm_head(model: PreTrainedModel) -> PreTrainedModel:
    """Make `model`'s output projection an FP32Head (in place); a no-op when it already is one."""
    head = model.get_output_embeddings()
    if head is None or not isinstance(head, torch.nn.Linear):
        raise ValueError(f"fp32_lm_head: {type(model).__name__} has no linear output head")
    if not isinstance(head, FP32Head):
        head.__class__ = FP32Head
    return model


def use_activation_checkpointing(model: PreTrainedModel) -> PreTrainedModel:
    """Recompute each transformer block in the backward pass instead of keeping its activations (in place).

    transformers checkpoints a block only while that block is in training mode; the policy stays in eval mode (no
    dropout: on-policy the ratio must be exactly 1), so only the blocks' own flag is set, not their children's.
    Without gradients (the rollout, generate) the blocks run as they are.
    """
    from transformers.modeling_layers import GradientCheckpointingLayer

    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 (the old name is deprecated there)
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    blocks = [module for module in model.modules() if isinstance(module, GradientCheckpointingLayer)]
    if not blocks:
        raise ValueError(f"activation_checkpointing: {type(model).__name__} has no checkpointable blocks")
    for block in blocks:
        block.training = True
    return model
