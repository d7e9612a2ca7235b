"""One episode service for training and held-out evaluation: rows in, episodes out, scored into a `Rollout` stamped
with the policy version that sampled it.

    play_episodes           environments started (one per episode), their first observations appended to the
                            prompts, the episodes sampled by the rollout engine (or rollout='s harness), the
                            environments closed
    EpisodeService.rollout  k episodes per prompt of a batch (play_episodes), then the reference's log-probs, the
                            reward model's scores and the reward functions of reward= once, in TRL's form

Training calls `rollout` (inline, or in a producer process: rloo.service.producer); evaluation calls `play_episodes`
at its own sampling settings and scores the episodes its own way (rloo.evaluation.heldout). No Lightning here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from rloo.data.chat import observed_prompts
from rloo.generation.episodes import Sampled, close_all, completion_token_ids, episode_returns, reward_completions
from rloo.generation.rollout import PhaseTimer, Rollout, sample_rollout, scored_rollout
from rloo.generation.settings import SamplingConfig
from rloo.rewards.scoring import Reward, is_conversational


@dataclass
class Played:
    """One pass of episodes: the engine's record, and what the reward functions read beside it."""

    sampled: Sampled
    prompts: list | None  # each episode's prompt as the reward functions get it (an observation appended); None:
    chat: bool  # nothing reads them
    environments: list  # each episode's environment (closed), in row order; [] for plain completions
    extras: dict  # an external rollout's fields for the reward functions
    repeats: int  # rows per prompt as sampled: k, or 1 where observations made each episode's prompt its own


@dataclass
class RolloutNotes:
    """What a rollout leaves for the step's metrics and samples beside its tensors."""

    episodes: list = field(default_factory=list)  # rloo.generation.episodes.Episode, one per row
    reward_logged: dict[str, float] = field(default_factory=dict)  # the reward functions' log_metric means
    reward_columns: dict[str, list] = field(default_factory=dict)  # and their log_extra columns (samples.jsonl)
    reward_terms: dict[str, float] = field(default_factory=dict)  # each term's mean (Reward.last_term_means)
    not_applicable: dict[str, int] = field(default_factory=dict)  # completions a function returned None for


@dataclass
class EpisodeService:
    """Everything a rollout needs besides the policy that samples it: the tokenizer, the frozen reference and reward
    model, the settings of conf/train.yaml it reads, and the run's reward functions (`reward`, None: the reward
    model alone), environment (`environment`, an EnvironmentSpec; None: plain completions) and external harness
    (`external_rollout`, rollout=; None: the policy samples)."""

    tokenizer: object
    reference: torch.nn.Module | None  # None: the policy's base with its LoRA adapters switched off
    reward_model: torch.nn.Module | None
    k: int
    sampling: SamplingConfig  # the rollout's
    generation_batch_size: int
    shared_prefix: bool
    reward: Reward | None = None
    environment: object | None = None
    external_rollout: object | None = None  # (prompts, harness) -> (Sampled, extra fields)

    @property
    def reads_prompts(self) -> bool:
        """Whether anything of a rollout reads its prompts as the data has them (not only their token ids)."""
        return bool(self.environment or self.reward or self.external_rollout)

    def rollout(
        self,
        policy,
        batch: dict,
        timer: PhaseTimer,
        version: int,
        sampler=None,
        harness=None,
        trainer_state=None,
    ) -> tuple[Rollout, RolloutNotes]:
        """The one rollout every algorithm uses: k episodes of each prompt of `batch` (the data module's collate),
        sampled by `policy` (or `sampler`: algo=dpo's frozen reference, for offline pairs) and stamped `version`,
        the reference's log-probs, the reward model's scores, then the reward functions of reward= once, in TRL's
        form (`trainer_state` for those that take it)."""
        reward_model = self.reward_model if self.reward is None or self.reward.uses_model else None
        prompts = batch_prompts(batch, self.tokenizer) if self.reads_prompts else None
        played = play_episodes(
            sampler or policy,
            self.tokenizer,
            self.environment,
            prompts,
            batch["prompt_ids"],
            batch["prompt_mask"],
            self.k,
            batch.get("columns") or [],
            self.sampling,
            self.generation_batch_size,
            timer,
            self.external_rollout,
            harness,
        )
        sampled, external = played.sampled, self.external_rollout is not None
        # a group's rows share one prompt, unless observations or an external rollout made them differ
        group = self.k if self.shared_prefix and played.repeats == self.k and not external else 1
        rollout = scored_rollout(
            policy,
            self.reference,
            reward_model,
            sampled,
            self.sampling.temperature,
            self.generation_batch_size,
            timer,
            group,
            version,
        )
        notes = RolloutNotes(sampled.episodes)
        if self.reward is not None:  # the functions of reward= get TRL's arguments: completions decoded, and the
            with timer("reward_functions"):  # prompts as the data has them (chat messages, or text decoded)
                rollout.scores = self.function_scores(batch, played, rollout.scores, trainer_state)
                notes.reward_logged, notes.reward_columns = self.reward.log.take()
                notes.reward_terms = dict(self.reward.last_term_means)
                notes.not_applicable = dict(self.reward.last_not_applicable)
        return rollout, notes

    def function_scores(self, batch: dict, played: Played, model_scores: Tensor, trainer_state) -> Tensor:
        """reward= over the played episodes `[N]`: each prompt's data columns k times, the episodes' environments
        and an external rollout's fields by name, the reward model's `model_scores` where it is a term."""
        rows = [row for row in batch.get("columns", []) for _ in range(self.k)]  # each prompt's, k times
        columns = {name: [row[name] for row in rows] for name in (rows[0] if rows else {})}
        if played.environments:  # TRL's reward functions may read the episodes' environments
            columns["environments"] = [e.user_environment for e in played.environments]
        columns |= played.extras
        self.reward.trainer_state = trainer_state
        sampled = played.sampled
        scores = self.reward(
            played.prompts,
            reward_completions(sampled, self.tokenizer, played.chat),
            model_scores,
            columns,
            episode_returns(sampled.episodes),
            completion_ids=completion_token_ids(sampled) if self.reward.asks_for("completion_ids") else None,
        )
        return scores.to(model_scores.device)


def play_episodes(
    policy,
    tokenizer,
    environment,
    prompts: list | None,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    repeats: int,
    columns: list[dict],
    sampling: SamplingConfig,
    batch_size: int,
    timer: PhaseTimer,
    external_rollout=None,
    harness=None,
) -> Played:
    """`repeats` episodes of each row, prompt-major: `prompts` as the data has them (None where nothing reads them),
    `prompt_ids` / `prompt_mask` `[B, P]` left-padded, `columns` each row's other data columns. With `environment`
    (an EnvironmentSpec; None: plain completions) one is reset per episode with {"prompt": ..., **columns} of its
    row; where a reset returned a first observation, each episode's own prompt has it appended
    (rloo.data.chat.observed_prompts). `external_rollout` samples in the policy's place, handed `harness`."""
    every = None if prompts is None else [p for p in prompts for _ in range(repeats)]
    chat = every is not None and is_conversational(every)
    environments = []
    if environment is not None:
        rows = [{"prompt": p, **c} for p, c in zip(prompts, columns or [{}] * len(prompts))]
        with timer("environment"):
            environments = environment.start_all([row for row in rows for _ in range(repeats)])
    if any(getattr(e, "observation", None) is not None for e in environments):
        ids = [i[m.bool()].tolist() for i, m in zip(prompt_ids, prompt_mask) for _ in range(repeats)]
        observations, device = [e.observation for e in environments], prompt_ids.device
        every, prompt_ids, prompt_mask = observed_prompts(every, ids, observations, tokenizer, environment.tools)
        prompt_ids, prompt_mask, repeats = prompt_ids.to(device), prompt_mask.to(device), 1
    extras = {}
    try:
        with timer("generate"):
            if external_rollout is not None:  # rollout=module:function samples in the policy's place
                sampled, extras = external_rollout(every, harness)
            else:
                sampled = sample_rollout(
                    policy,
                    prompt_ids,
                    prompt_mask,
                    repeats,
                    sampling,
                    tokenizer.eos_token_id,
                    tokenizer.pad_token_id,
                    batch_size,
                    environments=environments or None,
                    settings=None if environment is None else environment.episode,
                    tokenizer=tokenizer,
                    chat=chat,
                )
    finally:
        close_all(environments)
    return Played(sampled, every, chat, environments, extras, repeats)


def batch_prompts(batch: dict, tokenizer) -> list:
    """Each prompt of a batch as the data has it: its chat messages, or its text (decoded)."""
    messages = batch.get("prompt_messages") or []
    if messages and all(m is not None for m in messages):
        return list(messages)
    return tokenizer.batch_decode(batch["prompt_ids"], skip_special_tokens=True)
