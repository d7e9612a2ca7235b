"""Benchmark presets: a GPT-NeoX (Pythia) or Llama architecture with random weights plus the batch it is timed at.

Random weights are enough for cost: step time and memory depend on shapes, not on what the weights know.
Random policies almost never sample EOS, so completions run to `response_length` on every side alike.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import asdict, dataclass

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    Gemma2Config,
    GPTNeoXConfig,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

PAD_TOKEN, EOS_TOKEN = "[PAD]", "<|endoftext|>"
GRPO_FAMILY = ("grpo", "dr_grpo", "dapo")  # rloo's algorithms timed against TRL's GRPOTrainer at that loss_type


@dataclass(frozen=True)
class Preset:
    name: str
    about: str
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    prompts_per_step: int  # prompts per rollout (PPO: prompts_per_step * k prompts, one completion each)
    k: int  # completions per prompt for RLOO
    prompt_length: int  # tokens per prompt (all prompts the same length: no padding to blur the cost)
    response_length: int  # new tokens per completion
    kl_coef: float = 0.05
    needs_gpu: bool = False
    family: str = "gpt_neox"  # a family of rloo/families/ (`model_config` builds its config)
    num_kv_heads: int = 0  # the Llama-style families: key/value heads (0: one per head)

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.k

    def as_dict(self) -> dict:
        return asdict(self) | {"completions_per_step": self.completions_per_step}


PRESETS = {
    p.name: p
    for p in (
        Preset(
            "tiny",
            "the embedded task's architecture at its default batch",
            128,
            4,
            4,
            512,
            512,
            prompts_per_step=16,
            k=4,
            prompt_length=24,
            response_length=16,
        ),
        Preset(
            "small",
            "the setting of the peer figures, TRL 2024 RLOO vs PPO (hidden 256, 4 layers)",
            256,
            4,
            4,
            1024,
            512,
            prompts_per_step=16,
            k=4,
            prompt_length=8,
            response_length=32,
        ),
        Preset(
            "pythia-160m",
            "Pythia-160m architecture, a CPU-sized batch",
            768,
            12,
            12,
            3072,
            50304,
            prompts_per_step=4,
            k=4,
            prompt_length=32,
            response_length=16,
        ),
        Preset(
            "tldr-160m",
            "TL;DR's shape (~400-token prompts, 53 new tokens, k=4) at Pythia-160m architecture, CPU",
            768,
            12,
            12,
            3072,
            50304,
            prompts_per_step=2,
            k=4,
            prompt_length=400,
            response_length=53,
        ),
        Preset(
            "long-160m",
            "long completions: 512 new tokens after 64-token prompts, k=4, at Pythia-160m architecture, CPU",
            768,
            12,
            12,
            3072,
            50304,
            prompts_per_step=2,
            k=4,
            prompt_length=64,
            response_length=512,
        ),
        Preset(
            "tldr-160m-k2",
            "TL;DR's shape at k=2, as many completions per step as tldr-160m",
            768,
            12,
            12,
            3072,
            50304,
            prompts_per_step=4,
            k=2,
            prompt_length=400,
            response_length=53,
        ),
        Preset(
            "tldr-1b",
            "TL;DR's shape at Pythia-1b architecture, GPU",
            2048,
            16,
            8,
            8192,
            50304,
            prompts_per_step=16,
            k=4,
            prompt_length=400,
            response_length=53,
            needs_gpu=True,
        ),
        Preset(
            "pythia-1b",
            "Pythia-1b architecture, GPU",
            2048,
            16,
            8,
            8192,
            50304,
            prompts_per_step=16,
            k=4,
            prompt_length=128,
            response_length=53,
            needs_gpu=True,
        ),
        Preset(
            "llama-1b",
            "Llama-3.2-1B architecture (32 heads, 8 key/value heads, tied 128k vocabulary), GPU",
            2048,
            16,
            32,
            8192,
            128256,
            prompts_per_step=16,
            k=4,
            prompt_length=128,
            response_length=53,
            needs_gpu=True,
            family="llama",
            num_kv_heads=8,
        ),
        Preset(
            "llama-small",
            "a small Llama (8 heads, 2 key/value heads, tied head) at `small`'s batch, CPU",
            256,
            4,
            8,
            1024,
            4096,
            prompts_per_step=16,
            k=4,
            prompt_length=8,
            response_length=32,
            family="llama",
            num_kv_heads=2,
        ),
        Preset(
            "pythia-6.9b",
            "Pythia-6.9b architecture, GPU",
            4096,
            32,
            32,
            16384,
            50304,
            prompts_per_step=8,
            k=4,
            prompt_length=128,
            response_length=53,
            needs_gpu=True,
        ),
    )
}

# every family of rloo/families/ at two shapes, grouped-query attention (a half or a third of the heads as
# key/value heads): `<family>-tiny` (the embedded task's size and batch) and `<family>-100m` (about 100M parameters at
# pythia-160m's batch), so each family's decode and step are timed against TRL alike
FAMILY_SHAPES = {
    "tiny": dict(
        hidden_size=128,
        num_layers=4,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=512,
        vocab_size=512,
        prompts_per_step=16,
        k=4,
        prompt_length=24,
        response_length=16,
    ),
    "100m": dict(
        hidden_size=768,
        num_layers=12,
        num_heads=12,
        num_kv_heads=4,
        intermediate_size=2048,
        vocab_size=32768,
        prompts_per_step=4,
        k=4,
        prompt_length=32,
        response_length=16,
    ),
}
ABOUT = {
    "llama": "Llama 3's layout (SwiGLU, RMSNorm, full rotary, tied head)",
    "qwen2": "Qwen2's layout (Llama's, with q/k/v biases)",
    "qwen3": "Qwen3's layout (Llama's, with per-head q/k RMSNorm)",
    "mistral": "Mistral's layout (Llama's; its sliding window wider than any preset's rows)",
    "gemma2": "Gemma 2's layout (scaled embeddings, sandwich norms, GeGLU, soft-capped scores and logits, untied head)",
}
for _family, _about in ABOUT.items():
    for _size, _shape in FAMILY_SHAPES.items():
        _name = f"{_family}-{_size}"
        PRESETS[_name] = Preset(_name, f"{_about} at {_size} size, CPU", family=_family, **_shape)


SHAPE_KEYS = {"P": "prompt_length", "T": "response_length", "k": "k", "prompts": "prompts_per_step"}


def get_preset(name: str) -> Preset:
    """A preset by name, optionally reshaped: `small@T=128+k=8` is `small` with 128-token completions and k = 8
    (P: prompt length, T: completion length, k: completions per prompt, prompts: prompts per step). Every worker,
    rloo's and TRL's, reads the same spec, so both sides run the same shape."""
    base, _, shape = name.partition("@")
    if base not in PRESETS:
        raise ValueError(f"preset {base!r} is not known: choose one of {', '.join(PRESETS)}")
    changes = {}
    for item in filter(None, shape.split("+")):
        match = re.fullmatch(r"(\w+)=(\d+)", item)
        if match is None or match[1] not in SHAPE_KEYS or int(match[2]) < 1:
            raise ValueError(
                f"preset {name!r}: {item!r} is not a shape; give {', '.join(f'{k}=<int >= 1>' for k in SHAPE_KEYS)}"
            )
        changes[SHAPE_KEYS[match[1]]] = int(match[2])
    return dataclasses.replace(PRESETS[base], name=name, **changes) if changes else PRESETS[base]


def build_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of exactly `vocab_size` ids: [PAD]=0, EOS=1, then "w2" ... "w{V-1}".

    Text round-trips exactly ("w5 w17" <-> [5, 17]), so trainers that decode and re-tokenise see the same ids.
    """
    vocab = {PAD_TOKEN: 0, EOS_TOKEN: 1} | {f"w{i}": i for i in range(2, vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=PAD_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with single spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=EOS_TOKEN,
        padding_side="left",
        model_max_length=4096,
    )


def _sizes(preset: Preset) -> dict:
    """What every family's config takes from the preset, with the presets' tokenizer ids (PAD 0, EOS/BOS 1)."""
    return dict(
        vocab_size=preset.vocab_size,
        hidden_size=preset.hidden_size,
        num_hidden_layers=preset.num_layers,
        num_attention_heads=preset.num_heads,
        intermediate_size=preset.intermediate_size,
        max_position_embeddings=2048,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )


def neox_config(preset: Preset, **overrides) -> GPTNeoXConfig:
    """Pythia's architecture: rotary on 25% of head dims, parallel residual, untied embeddings, no dropout."""
    values = _sizes(preset) | dict(
        rotary_pct=0.25,
        use_parallel_residual=True,
        tie_word_embeddings=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
    )
    return GPTNeoXConfig(**(values | overrides))


def llama_config(preset: Preset, **overrides) -> LlamaConfig:
    """Llama 3's layout: grouped-query attention, SwiGLU MLP, RMSNorm, full rotary, tied embeddings."""
    values = _sizes(preset) | dict(
        num_key_value_heads=preset.num_kv_heads or preset.num_heads, tie_word_embeddings=True
    )
    return LlamaConfig(**(values | overrides))


WINDOW = 2048  # Mistral's and Gemma 2's sliding window: the whole of every preset's rows


def gated_config(preset: Preset, **overrides):
    """The Llama-style families (rloo/families/): Llama's values and each family's own detail."""
    if preset.family == "llama":
        return llama_config(preset, **overrides)
    heads = preset.num_kv_heads or preset.num_heads
    head_dim = preset.hidden_size // preset.num_heads
    values = _sizes(preset) | dict(num_key_value_heads=heads, head_dim=head_dim, tie_word_embeddings=True)
    if preset.family == "qwen2":
        return Qwen2Config(**(values | overrides))
    if preset.family == "qwen3":
        return Qwen3Config(**(values | overrides))
    if preset.family == "mistral":
        return MistralConfig(**(values | {"sliding_window": WINDOW} | overrides))
    if preset.family == "gemma2":  # untied: through a tied head a random model's scaled embedding echoes its input
        gemma = dict(query_pre_attn_scalar=head_dim, sliding_window=WINDOW, tie_word_embeddings=False)
        return Gemma2Config(**(values | gemma | overrides))
    raise ValueError(f"preset {preset.name!r}: no config for family {preset.family!r}")


def model_config(preset: Preset, **overrides):
    return (neox_config if preset.family == "gpt_neox" else gated_config)(preset, **overrides)


def build_models(preset: Preset, seed: int = 0):
    """A random-weight policy and reward model (fp32) of the preset's architecture."""
    torch.manual_seed(seed)
    policy = AutoModelForCausalLM.from_config(model_config(preset))
    torch.manual_seed(seed + 1)
    reward_model = AutoModelForSequenceClassification.from_config(model_config(preset, num_labels=1))
    return policy, reward_model


def random_prompts(preset: Preset, num_prompts: int, seed: int = 0) -> torch.Tensor:
    """[num_prompts, prompt_length] ids drawn from the ordinary tokens (never PAD or EOS)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(2, preset.vocab_size, (num_prompts, preset.prompt_length), generator=generator)
