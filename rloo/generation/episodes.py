"""The rollout engine: every row of a rollout or an evaluation pass is an episode. The policy samples a turn, the
environment answers, and the loop repeats until the environment ends the episode, `max_turns` turns or
`max_episode_tokens` tokens cut it (`truncated`). A plain completion is the one-turn case: its environment
(rloo.generation.environment.OneTurn) ends it after the first turn and says nothing.

Everything after the prompt is one completion in rollout layout, `[pad.. prompt | turn 1 | reply 1 | turn 2 ..pad]`:
`completion_mask` marks the model's own tokens (the loss, the KL and the importance ratios count only them),
`episode_mask` every real token (what the forward passes attend to). The k episodes of a prompt are one group, as k
completions are. The turns are drawn by one sampler (rloo.generation.samplers): the lean decode, which keeps each
episode's KV cache across its turns (finished rows leave the batch; the environment's replies are prefilled into the
cache they continue), or HF generate over the whole episode so far. A reply enters the episode as the tokenizer's chat
template renders it for chat prompts (a turn of `reply_role`, with whatever the template puts between turns), and as
its text for text prompts, cut to the episode's room before it is tokenized.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from rloo.generation.environment import OneTurn, Step, reply_text, reply_tokens
from rloo.generation.samplers import samplers_for, truncate_after_stop
from rloo.generation.settings import EpisodeSettings, SamplingConfig
from rloo.models.sharding import sampling_weights

MAX_CONCURRENT_STEPS = 16  # environment calls of one turn running at once


@dataclass
class Episode:
    """One episode as it grows: its tokens after the prompt, which are the model's, and what the environment said."""

    tokens: list[int] = field(default_factory=list)
    own: list[int] = field(default_factory=list)  # 1: the model's token, 0: the environment's
    logprobs: list[float] = field(default_factory=list)  # the sampler's, 0 on the environment's tokens
    messages: list[dict] = field(default_factory=list)  # the turns and replies as chat messages, with their roles
    rewards: list[float] = field(default_factory=list)
    info: dict[str, float] = field(default_factory=dict)  # the environment's info of its last step (numbers)
    turns: int = 0
    terminated: bool = False  # the environment ended it
    truncated: bool = False  # max_turns or the token budget cut it (or the environment said so)
    last_turn_ended: bool = False  # the model's last turn ended with its stop token
    plain: bool = False  # a plain completion: ended only by its stop token (OneTurn ends every one)

    @property
    def over(self) -> bool:
        return self.terminated or self.truncated

    @property
    def episode_return(self) -> float:
        """The sum of the environment's rewards: 0 for an episode it gave none (cut off by max_turns or the token
        budget before its end)."""
        return float(sum(self.rewards))

    @property
    def replied(self) -> bool:
        return 0 in self.own


@dataclass
class Sampled:
    """What a rollout sampled, in rollout layout (rows prompt-major: rows p*k .. p*k+k-1 share a prompt), and the
    episodes it came from. rloo.generation.rollout scores it into a `Rollout`."""

    prompt_ids: Tensor  # [N, P] left-padded
    prompt_mask: Tensor  # [N, P]
    completion_ids: Tensor  # [N, T] pad after the episode
    completion_mask: Tensor  # [N, T] 1 on the model's tokens, stop tokens included
    episode_mask: Tensor  # [N, T] 1 on every real token after the prompt (the environment's replies too)
    ended: Tensor  # [N] bool: the environment ended it, or the model's last turn ended with its stop token
    generation_logprobs: Tensor  # [N, T] the sampler's log-probs (float32), 0 off the model's tokens
    episodes: list[Episode]

    @property
    def input_ids(self) -> Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], 1)

    @property
    def attention_mask(self) -> Tensor:
        return torch.cat([self.prompt_mask, self.episode_mask], 1)


def plain_completion(settings: SamplingConfig) -> EpisodeSettings:
    """The episode a plain completion is: one turn of at most max_new_tokens."""
    return EpisodeSettings(max_turns=1, max_episode_tokens=settings.max_new_tokens)


def sample_episodes(
    policy,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    sampling: SamplingConfig,
    batch_size: int,
    eos_token_id: int,
    pad_token_id: int,
    *,
    environments: list | None = None,
    settings: EpisodeSettings | None = None,
    tokenizer=None,
    chat: bool = False,
) -> Sampled:
    """One episode for each row of `prompt_ids`, `prompt_mask` `[N, P]`, in chunks of `batch_size` rows, each
    chunk's episodes played to their ends together. `environments`: one reset environment per row (None: plain
    completions); `settings`: the episode's shape (None: one turn of max_new_tokens); `tokenizer` decodes the turns
    for the environments and tokenizes their replies; `chat`: the prompts are chat messages."""
    settings = settings or plain_completion(sampling)
    environments = environments if environments is not None else [OneTurn() for _ in range(len(prompt_ids))]
    episodes = [Episode() for _ in range(len(prompt_ids))]
    stop_id = eos_token_id if sampling.stop_at_eos else None
    with sampling_weights(policy, sampling.lean_decode):  # sharded: gathered whole once for the whole pass
        make = samplers_for(
            policy,
            sampling,
            min(batch_size, len(prompt_ids)),
            prompt_ids.shape[1] + settings.max_episode_tokens,
            eos_token_id,
            pad_token_id,
            episodes=settings.max_turns > 1,
            capacity=settings.max_episode_tokens if settings.max_turns > 1 else sampling.max_new_tokens,
        )
        for start in range(0, len(prompt_ids), batch_size):
            part = slice(start, start + batch_size)
            sampler = make(prompt_ids[part], prompt_mask[part])
            play(
                sampler, episodes[part], environments[part], sampling, settings, stop_id, pad_token_id, tokenizer, chat
            )
    made = episode_tensors(episodes, pad_token_id, prompt_ids.device)
    return Sampled(prompt_ids, prompt_mask, **made, episodes=episodes)


def play(sampler, episodes, environments, sampling, settings, stop_id, pad_token_id, tokenizer, chat) -> None:
    """The turn loop: every live episode of the chunk draws a turn, the environments answer it, and the replies of
    the episodes that go on are fed into the sampler, until none is live."""
    for _ in range(settings.max_turns):
        live = [i for i, e in enumerate(episodes) if not e.over]
        if not live:
            break
        room = [settings.max_episode_tokens - len(episodes[i].tokens) for i in live]
        max_new = min(sampling.max_new_tokens, max(room))
        limits = torch.tensor(room) if min(room) < max_new else None
        ids, logprobs = sampler.turn(torch.tensor(live), max_new, limits)
        _, mask, ended = truncate_after_stop(ids, stop_id, pad_token_id)
        lengths, ended, ids, logprobs = mask.sum(1).tolist(), ended.tolist(), ids.tolist(), logprobs.tolist()
        for row, i in enumerate(live):
            take = min(lengths[row], room[row])
            episodes[i].tokens += ids[row][:take]
            episodes[i].own += [1] * take
            episodes[i].logprobs += logprobs[row][:take]
            episodes[i].last_turn_ended = ended[row] and take == lengths[row]
        texts = [turn_text(episodes[i], environments[i], tokenizer) for i in live]
        steps = step_all([environments[i] for i in live], texts)
        chunks = [
            answer(episodes[i], environments[i], step, text, tokenizer, settings, chat)
            for i, step, text in zip(live, steps, texts)
        ]
        going_on = [(i, chunk) for i, chunk in zip(live, chunks) if not episodes[i].over]
        if going_on:
            sampler.append(torch.tensor([i for i, _ in going_on]), [chunk for _, chunk in going_on])


def turn_text(episode: Episode, environment, tokenizer) -> str:
    """The episode's last turn as text, for its environment (none where it reads no actions: a plain completion)."""
    if not getattr(environment, "reads_actions", True):
        return ""
    turn_start = len(episode.own) - 1 - episode.own[::-1].index(0) if 0 in episode.own else -1
    return tokenizer.decode(episode.tokens[turn_start + 1 :], skip_special_tokens=True)


def step_all(environments: list, texts: list[str]) -> list[Step]:
    """Each environment's step on its text, the calls of one turn run concurrently (at most MAX_CONCURRENT_STEPS at
    once; each still under its own guard); a failure is raised as the first failing row's, in row order."""
    if len(environments) < 2 or not all(getattr(e, "reads_actions", True) for e in environments):
        return [environment.step(text) for environment, text in zip(environments, texts)]
    with ThreadPoolExecutor(min(MAX_CONCURRENT_STEPS, len(environments)), thread_name_prefix="rloo-env") as pool:
        futures = [pool.submit(environment.step, text) for environment, text in zip(environments, texts)]
        return [future.result() for future in futures]


def answer(episode: Episode, environment, step: Step, text: str, tokenizer, settings: EpisodeSettings, chat: bool):
    """What the environment's `step` said to the episode's last turn (`text`): its reward, info and whether it ends are
    recorded, and its reply's tokens (within the episode's token budget) appended as the environment's and returned
    ([] for none). An episode that reaches max_turns or its budget before the environment ended it is truncated."""
    episode.turns += 1
    episode.plain = getattr(environment, "plain", False)
    if getattr(environment, "reads_actions", True):
        episode.messages.append({"role": "assistant", "content": text})
    if step.reward is not None:
        episode.rewards.append(step.reward)
    episode.info = dict(step.info) or episode.info
    episode.terminated, episode.truncated = step.terminated, step.truncated
    room = settings.max_episode_tokens - len(episode.tokens)
    if not episode.over and (episode.turns >= settings.max_turns or room <= 0):
        episode.truncated = True
    said = (
        []
        if episode.over or step.reply is None
        else reply_tokens(
            tokenizer, reply_text(tokenizer, step.reply, settings.reply_role, episode.last_turn_ended, chat), room
        )
    )
    if said:
        replies = [{"role": settings.reply_role, "content": step.reply}] if isinstance(step.reply, str) else step.reply
        episode.messages += [dict(m) for m in replies]
        episode.tokens += said
        episode.own += [0] * len(said)
        episode.logprobs += [0.0] * len(said)
        episode.truncated = len(episode.tokens) >= settings.max_episode_tokens  # no room left for another turn
    if episode.over and callable(final := getattr(environment, "get_reward", None)):
        reward = final()  # the finished episode's reward (TRL's get_reward), ended or cut
        if reward is not None:
            episode.rewards.append(reward)
    return [] if episode.over else said


def episode_tensors(episodes: list[Episode], pad_token_id: int, device) -> dict[str, Tensor]:
    """The episodes in rollout layout, right-padded: completion ids, the model's-token mask, the episode mask, the
    sampler's log-probs `[N, T]`, and whether each ended `[N]` (the environment said done, or the model's last turn
    ended with its stop token)."""
    width = max(1, max(len(e.tokens) for e in episodes))

    def rows(values, fill, dtype):
        return torch.stack([F.pad(torch.tensor(v, dtype=dtype), (0, width - len(v)), value=fill) for v in values]).to(
            device
        )

    ended = [e.last_turn_ended or (e.terminated and not e.plain) for e in episodes]
    return {
        "completion_ids": rows([e.tokens for e in episodes], pad_token_id, torch.long),
        "completion_mask": rows([e.own for e in episodes], 0, torch.long),
        "episode_mask": rows([[1] * len(e.tokens) for e in episodes], 0, torch.long),
        "generation_logprobs": rows([e.logprobs for e in episodes], 0.0, torch.float32),
        "ended": torch.tensor(ended, dtype=torch.bool, device=device),
    }


def close_all(environments: list) -> None:
    """Every environment's close(), where it has one: all are closed, the first failure raised after."""
    failure = None
    for environment in environments:
        try:
            close = getattr(environment, "close", None)
            if callable(close):
                close()
        except Exception as error:  # noqa: BLE001 (the rest are still closed)
            failure = failure or error
    if failure is not None:
        raise failure


def reward_completions(sampled: Sampled, tokenizer, chat: bool) -> list:
    """What reward functions get as each episode's completion: for chat prompts of multi-turn episodes its messages
    after the prompt (the model's turns as assistant messages, the replies in their role), else its text after the
    prompt (the environment's replies included)."""
    if chat and any(e.messages for e in sampled.episodes):
        return [list(e.messages) for e in sampled.episodes]
    return tokenizer.batch_decode(sampled.completion_ids, skip_special_tokens=True)


def completion_token_ids(sampled: Sampled) -> list[list[int]]:
    """Each completion's token ids as TRL's reward functions get them (`completion_ids`): every real token after the
    prompt (an episode's environment replies too), no padding."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(sampled.completion_ids, sampled.episode_mask)]


def episode_returns(episodes: list[Episode]) -> Tensor:
    """Each episode's return `[N]` (Episode.episode_return): the reward's `env` term."""
    return torch.tensor([e.episode_return for e in episodes])
