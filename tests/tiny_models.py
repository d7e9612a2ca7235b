"""Tiny random models of every family in rloo/families/, the one helper every test builds them with.

Each VARIANT is a family with the detail its tests need: GPT-NeoX as Pythia (parallel residual, rotary on a quarter
of each head), with the sequential residual and with full rotary; Llama, Qwen2 (q/k/v biases), Qwen3 (per-head q/k
norms), Mistral (a sliding window that covers the tests' rows) and Gemma 2 (scaled embeddings, sandwich norms,
GeGLU, soft-capped scores and logits, sliding window on every other layer, an untied head) with grouped-query
attention (4 heads, 2 key/value heads) and a tied head; Llama with one key/value head per head, an untied head
and Llama 3's rope scaling.
"""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    Gemma2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

FAMILIES = ("gpt_neox", "llama", "qwen2", "qwen3", "mistral", "gemma2")  # every family the fast paths serve
GATED_FAMILIES = FAMILIES[1:]  # the Llama-style ones: separate q/k/v, a gated MLP, RMSNorm
NEOX = {"gpt_neox": (True, 0.25), "gpt_neox_sequential": (False, 0.25), "gpt_neox_full_rotary": (True, 1.0)}
VARIANTS = (*NEOX, "llama", "qwen2", "qwen3", "mistral", "gemma2", "llama3_untied_mha")
PAD, EOS = 0, 1  # ids of the models built without a tokenizer
WINDOW = 256  # Mistral's and Gemma 2's sliding window: longer than any test's rows


def _config(variant: str, sizes: dict):
    """The variant's config; `sizes` (with the caller's overrides) win over the variant's defaults."""
    if variant in NEOX:
        parallel, rotary_pct = NEOX[variant]
        values = dict(use_parallel_residual=parallel, rotary_pct=rotary_pct, tie_word_embeddings=False)
        values |= dict(hidden_dropout=0.0, attention_dropout=0.0)
        return GPTNeoXConfig(**(values | sizes))
    head_dim = sizes["hidden_size"] // sizes["num_attention_heads"]
    values = dict(num_key_value_heads=2, tie_word_embeddings=True, head_dim=head_dim)
    if variant == "qwen2":
        return Qwen2Config(**(values | sizes))
    if variant == "qwen3":
        return Qwen3Config(**(values | sizes))
    if variant == "mistral":
        return MistralConfig(**(values | {"sliding_window": WINDOW} | sizes))
    if variant == "gemma2":  # soft-caps 50 (scores) and 30 (logits), as Gemma 2's release
        gemma = dict(query_pre_attn_scalar=head_dim, sliding_window=WINDOW, attn_implementation="eager")
        # untied: through a tied head a random model's scaled embedding (x sqrt(D)) echoes the last token forever
        gemma["tie_word_embeddings"] = False
        return Gemma2Config(**(values | gemma | sizes))
    if variant == "llama3_untied_mha":
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0}
        rope |= {"high_freq_factor": 4.0, "original_max_position_embeddings": 32}
        values |= {"num_key_value_heads": 4, "tie_word_embeddings": False, "rope_parameters": rope}
    return LlamaConfig(**(values | sizes))


def tiny_model(
    variant: str = "gpt_neox",
    tokenizer=None,
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    reward: bool = False,
    seed: int = 0,
    **config,
):
    """A random 2-layer model of `variant` (VARIANTS), in eval mode; a one-label sequence classifier if `reward`.

    With a tokenizer (the embedded task's): its vocabulary and special tokens, hidden 32, HF's initialisation.
    Without: `vocab_size`, PAD=0 and EOS=1, hidden 64 (4 heads of 16 dims), and weights of Llama-style families drawn
    with std 0.2 (HF's 0.02 makes a 2-layer model repeat one token), so greedy rows differ. `config` overrides."""
    torch.manual_seed(seed)
    if tokenizer is not None:
        pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        sizes = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, max_position_embeddings=128)
    else:
        pad, eos = PAD, EOS
        inner = (4 if variant in NEOX else 2) * hidden_size
        sizes = dict(
            vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=inner, max_position_embeddings=256
        )
        if variant not in NEOX:
            sizes["initializer_range"] = 0.2
    sizes |= dict(num_hidden_layers=2, num_attention_heads=4, pad_token_id=pad, eos_token_id=eos, bos_token_id=eos)
    model_config = _config(variant, sizes | config | ({"num_labels": 1} if reward else {}))
    auto = AutoModelForSequenceClassification if reward else AutoModelForCausalLM
    return auto.from_config(model_config).eval()
