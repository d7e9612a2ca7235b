"""Settings for tests that build pieces directly: the typed configs come from conf/ like a run's (they have no
defaults of their own), and HF generate is the reference the lean decode is held to."""

from dataclasses import replace

from rloo.config.checks import algorithm_config, validate_train_config
from rloo.generation.rollout import generate_with_logprobs
from rloo.generation.settings import SamplingConfig
from rloo.run.cli import compose_train_config


def sampling(
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    greedy: bool = False,
    stop_at_eos: bool = True,
    lean_decode: bool = True,
    sampler: str = "multinomial",
) -> SamplingConfig:
    """Sampling settings; the multinomial draw by default, so the lean decode and HF generate share a random stream."""
    return SamplingConfig(max_new_tokens, temperature, top_k, top_p, greedy, stop_at_eos, lean_decode, sampler)


def hf_generate(
    policy, prompt_ids, prompt_mask, sampling: SamplingConfig, eos_token_id: int, pad_token_id: int, batch_size: int
):
    """HF generate's completions `[N, T]` (T <= max_new_tokens; it stops once every row has ended)."""
    return generate_with_logprobs(
        policy, prompt_ids, prompt_mask, replace(sampling, lean_decode=False), eos_token_id, pad_token_id, batch_size
    )[0]


def train_config(algorithm: str, total_rollouts: int, **keys):
    """The typed config of `algorithm` (its class in rloo/algorithms/registry.py) from conf/train.yaml with `keys`
    set, checked as rloo.train checks them."""
    overrides = [f"algo={algorithm}", "judge=none"] + [f"{key}={value}" for key, value in keys.items()]
    cfg = compose_train_config(overrides)
    validate_train_config(cfg)
    return algorithm_config(cfg, total_rollouts)


def toy_split(path):
    """A split of the embedded task's jsonl layout, as conf/data/toy.yaml reads it."""
    from rloo.data.prompts import SplitSpec

    return SplitSpec(path=str(path), split="train", prompt_column="prompt", reference_column="reference")


def judge_from_conf(name: str, **settings):
    """The judge of conf/judge/<name>.yaml with `settings` over its defaults, as a run builds it."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from rloo.run.cli import CONF_DIR

    cfg = OmegaConf.load(CONF_DIR / "judge" / f"{name}.yaml")
    settings = {key: str(value) if hasattr(value, "__fspath__") else value for key, value in settings.items()}
    return instantiate(OmegaConf.merge(cfg, settings), _convert_="all")
