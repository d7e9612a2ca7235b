"""How completions are sampled, as settings: what every sampler reads (`SamplingConfig`) and the lean decode's draws
(`SAMPLERS`). Plain data, no torch: the algorithms' config classes carry it, and validating a config loads nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingConfig:
    """The sampling keys of conf/sampling.yaml (documented there); built from a config by rloo.config.checks."""

    max_new_tokens: int
    temperature: float
    top_k: int  # 0: off
    top_p: float  # 1.0: off
    greedy: bool
    stop_at_eos: bool
    lean_decode: bool  # rloo.generation.decode's KV-cache loop where the family has decode layer code, else HF generate
    sampler: str  # the lean decode's draw: inverse_cdf | multinomial (HF generate's random stream)
    cuda_graph: bool = (
        True  # the lean decode on a GPU: static-shape steps as CUDA graphs (rloo.generation.static_decode)
    )
    rollout_precision: str = "same"  # bf16: the lean decode's linear products from bfloat16 copies of the weights

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
ROLLOUT_PRECISIONS = ("same", "bf16")  # the rollout's linear products: the training precision's, or bfloat16


REPLY_ROLES = ("user", "tool")  # the roles an environment's replies take in a chat template


@dataclass(frozen=True)
class EpisodeSettings:
    """The keys of conf/env/<name>.yaml that shape a multi-turn episode (documented there)."""

    max_turns: int
    max_episode_tokens: int
    reply_role: str = "user"
