"""The config class of every algorithm: the keys it reads, each with its type, range or choices and resume policy
(rloo.utils.keys.key), and the rules that span its keys (`check`, called by rloo.config.checks before any model
loads). The same class, built from a checked config, is the typed settings its LightningModule reads: a key cannot
validate and then reach no code. Values and their documentation are in the YAML (conf/train.yaml, conf/algo/).

This module imports neither Lightning nor torch: composing and validating a config loads no framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from omegaconf import DictConfig

from rloo.generation.settings import SamplingConfig
from rloo.service.staleness import STALENESS_MODES
from rloo.utils.errors import ConfigError
from rloo.utils.keys import APPLIED, FIXED, derived, key, looks_local, refuse_inert

LR_SCHEDULES = ("linear", "constant", "cosine")
LR_SCHEDULE_PER = ("optimizer_step", "rollout")
OLD_LOGPROBS = ("recompute", "generation")
KL_ESTIMATORS = ("k1", "k2", "k3")
BUDGETS = ("trained", "sampled")
IS_CORRECTIONS = ("none", "tis_token", "tis_sequence", "mask_token", "mask_sequence", "geometric")


@dataclass(frozen=True)
class OnlineRLConfig:
    """The keys of conf/train.yaml every algorithm reads (documented there, with their defaults). Built from a checked
    config by rloo.config.checks.algorithm_config; `derived` fields are made there."""

    # the one policy-gradient step's algorithms take any rollout the engine samples (an environment's episodes, an
    # external harness's rollouts); the others (a value model, pairs) read plain completions of their own
    samples_any_rollout: ClassVar[bool] = False

    k: int = key(FIXED, low=1)
    missing_eos_penalty: float | None = key(FIXED, low=0)
    missing_eos_score: float | None = key(FIXED)
    num_ppo_epochs: int = key(FIXED, low=1)
    num_mini_batches: int = key(FIXED, low=1)
    rollout_batch_size: int = key(FIXED, low=1)
    micro_batch_size: int = key(FIXED, low=1)
    generation_batch_size: int = key(APPLIED, low=1)
    lr: float = key(APPLIED, low=0, low_open=True)
    weight_decay: float = key(APPLIED, low=0)
    adam_eps: float = key(APPLIED, low=0, low_open=True)
    warmup_ratio: float = key(APPLIED, low=0, high=1)
    lr_schedule: str = key(APPLIED, choices=LR_SCHEDULES)
    lr_schedule_per: str = key(FIXED, choices=LR_SCHEDULE_PER)  # optimizer_step | rollout
    max_grad_norm: float | None = key(APPLIED, low=0, low_open=True)
    budget: str = key(FIXED, choices=BUDGETS)  # what total_episodes counts
    log_every: int = key(APPLIED, low=1)
    max_bad_steps: int = key(APPLIED, low=1)
    max_no_signal_steps: int = key(APPLIED, low=1)
    shared_prefix: bool = key(APPLIED)
    sampling: SamplingConfig = derived()  # from conf/sampling.yaml's keys (rloo.config.checks.rollout_sampling)
    total_rollouts: int = derived()  # from total_episodes, rollout_batch_size and the devices

    @property
    def updates_per_rollout(self) -> int:
        return self.num_ppo_epochs * self.num_mini_batches

    @property
    def reuses_rollout(self) -> bool:
        return self.updates_per_rollout > 1

    @classmethod
    def check(cls, cfg: DictConfig, world_size: int) -> None:
        """The rules that span this algorithm's keys, on the composed config (one-line ConfigError); none here."""


@dataclass(frozen=True)
class PolicyGradientConfig(OnlineRLConfig):
    """Plus conf/algo/shared/policy_gradient.yaml: the algorithms that sample from the policy (the REINFORCE family,
    PPO): the KL penalty, the clip and the rollout / training mismatch corrections."""

    kl_coef: float = key(APPLIED, low=0)
    kl_estimator: str = key(FIXED, choices=KL_ESTIMATORS)
    normalize_advantages: bool = key(FIXED)
    clip_range: float = key(APPLIED, low=0, low_open=True)
    old_logprobs: str = key(FIXED, choices=OLD_LOGPROBS)
    is_correction: str = key(FIXED, choices=IS_CORRECTIONS)
    is_cap: float = key(FIXED, low=0, low_open=True)
    is_low: float = key(FIXED, low=0, high=1, low_open=True)
    is_high: float = key(FIXED, low=1)
    log_histograms: bool = key(APPLIED)


# ---- the one policy-gradient step (rloo.algorithms.policy_gradient) ----------------------------------------------
GROUP_ADVANTAGES = ("leave_one_out", "group_mean", "group_std", "group_mean_batch_std")
PER_TOKEN_ADVANTAGES = ("return_to_go_batch_std", "group_mean_batch_std")  # REINFORCE++, REINFORCE++-baseline
ADVANTAGES = (*GROUP_ADVANTAGES, "return_to_go_batch_std", "moving_average", "none", "best_of_k")
LOSSES = ("ppo_clip", "reinforce")
RATIO_LEVELS = ("token", "sequence")
SEQUENCE_RATIOS = ("sum", "mean")
AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "token_sum_norm")
KL_PLACEMENTS = ("reward", "loss")
OVERLONG = ("none", "shape", "mask")
RAFT_RANKINGS = ("reward", "score")  # R (KL-penalised) | the score alone
PRODUCERS = ("auto", "inline", "process")


def produced_in_a_process(cfg) -> bool:
    """producer=process, or auto with max_staleness above 0."""
    return cfg.producer == "process" or (cfg.producer == "auto" and cfg.max_staleness > 0)


@dataclass(frozen=True)
class EstimatorConfig(PolicyGradientConfig):
    """The choices of the one policy-gradient step, conf/algo/shared/estimator.yaml (documented there): RLOO, RAFT,
    REINFORCE, vanilla PG and the GRPO family (GRPO, Dr. GRPO, DAPO, REINFORCE++, GSPO) are values of these keys.
    clip_range is the lower clip (TRL's epsilon), clip_range_high the upper (epsilon_high)."""

    samples_any_rollout: ClassVar[bool] = True

    advantage: str = key(FIXED, choices=ADVANTAGES)
    std_eps: float = key(FIXED, low=0, low_open=True)
    baseline_decay: float = key(FIXED, low=0, high=1)
    raft_rank_by: str = key(FIXED, choices=RAFT_RANKINGS)
    loss: str = key(FIXED, choices=LOSSES)
    ratio_level: str = key(FIXED, choices=RATIO_LEVELS)
    sequence_ratio: str = key(FIXED, choices=SEQUENCE_RATIOS)
    loss_aggregation: str = key(FIXED, choices=AGGREGATIONS)
    aggregation_constant: float | None = key(FIXED, low=0, low_open=True)
    clip_range_high: float | None = key(APPLIED, low=0, low_open=True)
    kl_in: str = key(FIXED, choices=KL_PLACEMENTS)
    dynamic_sampling: bool = key(FIXED)
    dynamic_sampling_rounds: int = key(APPLIED, low=0)
    overlong: str = key(FIXED, choices=OVERLONG)
    overlong_buffer: float = key(FIXED, low=0, high=1, low_open=True)
    max_staleness: int = key(FIXED, low=0)
    staleness_mode: str = key(FIXED, choices=STALENESS_MODES)
    producer: str = key(FIXED, choices=PRODUCERS)
    producer_threads: int | None = key(APPLIED, low=1)

    @property
    def producer_process(self) -> bool:
        """Rollouts sampled and scored in a producer process (rloo.service.producer), not inline."""
        return produced_in_a_process(self)

    @property
    def clip_high(self) -> float:
        return self.clip_range if self.clip_range_high is None else self.clip_range_high

    @property
    def kl_in_loss(self) -> bool:
        return self.kl_in == "loss" and self.kl_coef > 0

    @property
    def kl_in_reward(self) -> bool:
        return self.kl_in == "reward" and self.kl_coef > 0

    @property
    def per_token_advantage(self) -> bool:
        return self.advantage in PER_TOKEN_ADVANTAGES

    @property
    def batch_wide_advantage(self) -> bool:
        """A row's advantage depends on rows outside its group (a whitening over the batch)."""
        return self.advantage.endswith("batch_std") or self.normalize_advantages

    @property
    def overlong_cache_tokens(self) -> float:
        """DAPO's L_cache in tokens: overlong_buffer of the generation budget (the paper: 4,096 of 20,480)."""
        return self.overlong_buffer * self.sampling.max_new_tokens

    @property
    def aggregation_denominator(self) -> float:
        """token_sum_norm's constant: aggregation_constant, or the generation budget (response_length)."""
        return self.aggregation_constant or self.sampling.max_new_tokens

    @classmethod
    def check(cls, cfg: DictConfig, world_size: int) -> None:
        """A key the chosen forms do not read, set away from its algorithm's value, is refused (conf/algo/<name>.yaml
        as Hydra composes it); so are the mixes that cannot be formed."""
        for name, inert, setting, what in ESTIMATOR_INERT:
            if inert(cfg):
                refuse_inert(cfg, name, setting.format(**cfg), what, defaults=f"algo/{cfg.algorithm}")
        if cfg.advantage in (*GROUP_ADVANTAGES, "best_of_k") and cfg.k < 2:
            raise ConfigError(
                f"k={cfg.k} is not allowed: an integer >= 2 with advantage={cfg.advantage} (it compares each "
                "completion with the others of its prompt)"
            )
        if cfg.advantage in PER_TOKEN_ADVANTAGES and cfg.ratio_level == "sequence":
            raise ConfigError(
                f"ratio_level=sequence needs one advantage per completion, but advantage={cfg.advantage} gives one "
                "per token; use ratio_level=token or another advantage"
            )
        if cfg.loss == "reinforce" and cfg.num_ppo_epochs * cfg.num_mini_batches > 1:
            raise ConfigError(
                f"loss='reinforce' is exactly on-policy: it needs num_ppo_epochs=1 and num_mini_batches=1, "
                f"got {cfg.num_ppo_epochs} and {cfg.num_mini_batches}; use loss=ppo_clip to reuse a rollout"
            )
        if cfg.budget == "sampled" and cfg.dynamic_sampling and cfg.lr_schedule != "constant":
            raise ConfigError(
                f"budget=sampled stops a dynamic_sampling run at a rollout no one knows in advance, so "
                f"lr_schedule={cfg.lr_schedule} would not reach its end; use lr_schedule=constant (for every method "
                "it is compared with)"
            )
        check_asynchrony(cfg, world_size)
        if cfg.dynamic_sampling and world_size > 1:
            raise ConfigError(
                f"dynamic_sampling=true runs on one device (ranks would sample different numbers of rounds), got "
                f"{world_size} devices; use dynamic_sampling=false or one device"
            )


def check_asynchrony(cfg: DictConfig, world_size: int) -> None:
    """A producer process: one CPU device so far, no second sampling round inside a step, and a behaviour policy
    that the loss names (never the current policy silently standing in for it)."""
    if cfg.producer == "inline" and cfg.max_staleness > 0:
        raise ConfigError(
            f"max_staleness={cfg.max_staleness} samples ahead of the learner, in a producer process: use producer=auto "
            "or producer=process (producer=inline is the synchronous loop, max_staleness=0)"
        )
    if not produced_in_a_process(cfg):
        return
    setting = f"max_staleness={cfg.max_staleness}" if cfg.max_staleness else "producer=process"
    if world_size > 1 or cfg.trainer.accelerator not in ("cpu", "auto"):
        raise ConfigError(
            f"{setting} runs the producer beside one CPU learner so far, got {world_size} devices on "
            f"trainer.accelerator={cfg.trainer.accelerator}; use one CPU device, or max_staleness=0 producer=auto"
        )
    if cfg.dynamic_sampling:
        raise ConfigError(
            f"{setting} samples each rollout once, ahead of the step, but dynamic_sampling=true samples again inside "
            "the step; use dynamic_sampling=false"
        )
    if cfg.max_staleness > 0 and cfg.is_correction == "none" and cfg.old_logprobs == "recompute":
        raise ConfigError(
            f"max_staleness={cfg.max_staleness} samples with policies up to {cfg.max_staleness} versions old, and "
            "is_correction=none with old_logprobs=recompute would treat them as the current one: choose "
            "is_correction=tis_token | tis_sequence | mask_token | mask_sequence | geometric (the decoupled loss: the "
            "clip against the learner's policy, pi_learner / pi_behaviour weighed), or old_logprobs=generation (the "
            "clip against the behaviour policy itself)"
        )


ESTIMATOR_INERT = (  # (key, when it does nothing, the setting that says so, what it does)
    ("std_eps", lambda c: c.advantage != "group_std", "advantage={advantage}", "it divides group_std's std"),
    (
        "baseline_decay",
        lambda c: c.advantage != "moving_average",
        "advantage={advantage}",
        "it moves moving_average's baseline",
    ),
    ("raft_rank_by", lambda c: c.advantage != "best_of_k", "advantage={advantage}", "it ranks best_of_k's completions"),
    (
        "sequence_ratio",
        lambda c: c.ratio_level != "sequence",
        "ratio_level={ratio_level}",
        "it forms the sequence-level ratio",
    ),
    (
        "aggregation_constant",
        lambda c: c.loss_aggregation != "token_sum_norm",
        "loss_aggregation={loss_aggregation}",
        "it is token_sum_norm's denominator",
    ),
    ("clip_range_high", lambda c: c.loss == "reinforce", "loss=reinforce", "it is the PPO clip's upper range"),
    ("kl_in", lambda c: c.kl_coef == 0, "kl_coef=0", "it places the KL penalty"),
    (
        "staleness_mode",
        lambda c: c.max_staleness == 0,
        "max_staleness=0",
        "it says which version samples a rollout ahead of the learner",
    ),
    (
        "producer_threads",
        lambda c: not produced_in_a_process(c),
        "producer={producer} max_staleness={max_staleness}",
        "it sets the producer process's threads",
    ),
    ("kl_estimator", lambda c: c.kl_coef == 0, "kl_coef=0", "it estimates the KL penalty"),
    (
        "dynamic_sampling_rounds",
        lambda c: not c.dynamic_sampling,
        "dynamic_sampling=false",
        "it caps dynamic sampling's extra rounds",
    ),
    (
        "overlong_buffer",
        lambda c: c.overlong != "shape",
        "overlong={overlong}",
        "it is overlong=shape's L_cache, a fraction of response_length",
    ),
)


# ---- PPO and DPO: their own modules on the shared base -------------------------------------------------------------
@dataclass(frozen=True)
class PPOConfig(PolicyGradientConfig):
    """The PPO keys of conf/algo/ppo.yaml on top of the shared ones (documented there)."""

    vf_coef: float = key(APPLIED, low=0)
    value_clip_range: float = key(APPLIED, low=0, low_open=True)
    gamma: float = key(FIXED, low=0, high=1)
    lam: float = key(FIXED, low=0, high=1)
    value_model: str | None = key(FIXED)  # loaded by rloo.run.assemble; null: started from the reward model

    @classmethod
    def check(cls, cfg: DictConfig, world_size: int) -> None:
        """A value model to start from, and no masked completions (GAE needs every score)."""
        from pathlib import Path

        if cfg.value_model is None and cfg.model.reward_model is None and cfg.get("bootstrap") is None:
            raise ConfigError(
                f"algo={cfg.algorithm} needs a value model: value_model=<sequence classifier dir or hub id>, or a "
                "model.reward_model to start it from (this run scores with reward functions only)"
            )
        if (
            cfg.value_model is not None
            and looks_local(str(cfg.value_model))
            and not Path(str(cfg.value_model)).exists()
        ):
            raise ConfigError(
                f"value_model={cfg.value_model!r} does not exist: a sequence classifier dir, a hub id, or null "
                "(the reward model)"
            )
        if cfg.reward_errors == "mask":
            raise ConfigError(
                f"reward_errors='mask' is not allowed with algo={cfg.algorithm}: its GAE needs every completion's "
                "score; use reward_errors=raise"
            )


@dataclass(frozen=True)
class DPOConfig(OnlineRLConfig):
    """The DPO keys of conf/algo/dpo.yaml (documented there) on top of the shared ones."""

    dpo_beta: float = key(FIXED, low=0, low_open=True)

    @classmethod
    def check(cls, cfg: DictConfig, world_size: int) -> None:
        """Pairs are whole prompts' k rows of a micro-batch, sampled from the reference (LoRA makes it the policy)."""
        if cfg.k < 2:
            raise ConfigError(f"k={cfg.k} is not allowed: an integer >= 2 with algo={cfg.algorithm} (pairs of k)")
        if cfg.micro_batch_size % cfg.k:
            raise ConfigError(
                f"micro_batch_size={cfg.micro_batch_size} is not allowed: a multiple of k={cfg.k} with "
                f"algo={cfg.algorithm}"
            )
        if cfg.model.lora:
            raise ConfigError(
                f"model.lora=true is not allowed with algo={cfg.algorithm}: its pairs are sampled from the "
                "reference, which LoRA makes the policy itself; use model.lora=false"
            )
