"""How completions are sampled: the settings every sampler reads, and the positions a left-padded batch uses.

A leaf module: the rollout (rloo/rollout.py) and the lean decode (rloo/decode.py) both build on it.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class SamplingConfig:
    """The sampling keys of conf/sampling.yaml (documented there); built from a config by rloo.config."""

    max_new_tokens: int
    temperature: float
    top_k: int  # 0: off
    top_p: float  # 1.0: off
    greedy: bool
    stop_at_eos: bool
    lean_decode: bool  # rloo.decode's KV-cache loop where the architecture has one (GPT-NeoX), else HF generate
    sampler: str  # the lean decode's draw: inverse_cdf | multinomial (HF generate's random stream)

    @classmethod
    def greedy_decoding(cls, max_new_tokens: int, stop_at_eos: bool, lean_decode: bool) -> "SamplingConfig":
        """Greedy decoding, where temperature and filtering play no part (temperature 1: raw log-probs)."""
        return cls(
            max_new_tokens,
            1.0,
            0,
            1.0,
            greedy=True,
            stop_at_eos=stop_at_eos,
            lean_decode=lean_decode,
            sampler="inverse_cdf",
        )  # greedy draws nothing


SAMPLERS = ("inverse_cdf", "multinomial")


def position_ids_for(attention_mask: Tensor) -> Tensor:
    """Positions that skip left padding, as `generate` uses them; a plain forward would count the pads."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
