"""Multi-turn episodes (`env=`): the policy samples a turn, the environment answers, and the loop repeats until the
environment says done, `max_turns` turns or `max_episode_tokens` tokens. Everything after the prompt is one
completion in rollout layout, `[pad.. prompt | turn 1 | reply 1 | turn 2 ..pad]`: `completion_mask` marks the model's
own tokens (the loss, the KL and the importance ratios count only them), `episode_mask` every real token (what the
forward passes attend to). The k episodes of a prompt are one group, as k completions are.

Where the lean decode serves the policy, each episode keeps one KV cache across its turns, the environment's replies
prefilled into it (rloo.generation.episode_decode); elsewhere each turn is sampled by HF generate from the whole
episode so far. A reply enters the episode as the tokenizer's chat template renders it for
chat prompts (a turn of `reply_role`, with whatever the template puts between turns), and as its text for text
prompts.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from rloo.data.padding import left_pad
from rloo.generation.decode import prepared_weights, supports_lean_decode
from rloo.generation.episode_decode import EpisodeCache
from rloo.generation.rollout import PhaseTimer, Rollout, sample_completions, scored_rollout
from rloo.generation.sampling import sample_tokens
from rloo.generation.settings import EpisodeSettings, SamplingConfig

_SENTINEL = "rloo-turn-5c1e"


@dataclass
class Episode:
    """One episode as it grows: its tokens after the prompt, which are the model's, and what the environment said."""

    tokens: list[int] = field(default_factory=list)
    own: list[int] = field(default_factory=list)  # 1: the model's token, 0: the environment's
    logprobs: list[float] = field(default_factory=list)  # the sampler's, 0 on the environment's tokens
    messages: list[dict] = field(default_factory=list)  # the turns and replies as chat messages
    rewards: list[float] = field(default_factory=list)
    turns: int = 0
    done: bool = False  # the environment ended it
    last_turn_ended: bool = False  # the model's last turn ended with its stop token

    @property
    def episode_return(self) -> float:
        """The sum of the environment's rewards: 0 for an episode it gave none (cut off by max_turns or the token
        budget before its end)."""
        return float(sum(self.rewards))


def reply_text(tokenizer, reply: str, role: str, turn_ended: bool, chat: bool) -> str:
    """The text a reply adds after a model turn: for chat prompts what the template renders between the turn's
    content and the next assistant turn's first token (the turn's own end token left out where the model sampled
    it); for text prompts the reply itself."""
    if not chat:
        return reply
    rendered = tokenizer.apply_chat_template(
        [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": _SENTINEL},
            {"role": role, "content": reply},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    after = rendered.split(_SENTINEL, 1)[1]
    eos = tokenizer.eos_token or ""
    return after[len(eos) :] if turn_ended and eos and after.startswith(eos) else after


def run_episodes(
    policy,
    tokenizer,
    prompt_ids: list[list[int]],
    environments: list,
    sampling: SamplingConfig,
    settings: EpisodeSettings,
    batch_size: int,
    chat: bool,
    device,
) -> list[Episode]:
    """Every episode to its end, the live ones sampled together each turn. `environments`: one reset
    GuardedEnvironment per row. Where the lean decode serves the policy, each episode's KV cache continues across
    its turns (`cached_episodes`); else each turn is sampled from the whole episode so far (HF generate)."""
    longest = max(len(p) for p in prompt_ids) + settings.max_episode_tokens
    if sampling.lean_decode and supports_lean_decode(policy, longest):
        # the weights as the loop reads them, made once for every chunk (as the single-turn rollout does)
        rows, bf16 = min(batch_size, len(prompt_ids)), sampling.rollout_precision == "bf16"
        weights = prepared_weights(policy, rows, bf16)
        return [
            episode
            for start in range(0, len(prompt_ids), batch_size)
            for episode in cached_episodes(
                weights,
                tokenizer,
                prompt_ids[start : start + batch_size],
                environments[start : start + batch_size],
                sampling,
                settings,
                chat,
                device,
            )
        ]
    episodes = [Episode() for _ in prompt_ids]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    for _ in range(settings.max_turns):
        live = [i for i, e in enumerate(episodes) if not e.done and len(e.tokens) < settings.max_episode_tokens]
        if not live:
            break
        room = {i: settings.max_episode_tokens - len(episodes[i].tokens) for i in live}
        turn_sampling = replace(sampling, max_new_tokens=min(sampling.max_new_tokens, max(room.values())))
        ids, mask = left_pad([prompt_ids[i] + episodes[i].tokens for i in live], pad)
        turn_ids, turn_mask, ended, logprobs = sample_completions(
            policy, ids.to(device), mask.to(device), turn_sampling, eos, pad, batch_size
        )
        for row, i in enumerate(live):
            take = min(int(turn_mask[row].sum()), room[i])
            episode = episodes[i]
            episode.tokens += turn_ids[row, :take].tolist()
            episode.own += [1] * take
            episode.logprobs += logprobs[row, :take].tolist()
            episode.last_turn_ended = bool(ended[row]) and take == int(turn_mask[row].sum())
            environment_turn(episode, environments[i], tokenizer, settings, chat)
    return episodes


def right_padded(chunks: list[list[int]], pad_token_id: int, device) -> tuple[Tensor, Tensor]:
    """Token lists as one right-padded chunk `[N, M]` and its `real` mask (EpisodeCache.forward's input)."""
    width = max(1, max(len(c) for c in chunks))
    tokens = torch.tensor([c + [pad_token_id] * (width - len(c)) for c in chunks], dtype=torch.long, device=device)
    real = torch.tensor([[1] * len(c) + [0] * (width - len(c)) for c in chunks], dtype=torch.bool, device=device)
    return tokens, real


@torch.no_grad()
def cached_episodes(weights, tokenizer, prompt_ids, environments, sampling, settings, chat, device) -> list[Episode]:
    """run_episodes on one EpisodeCache over the policy's `weights` (rloo.generation.decode.prepared_weights): the
    prompts prefilled once, each turn drawn a token a step (each drawn token fed back at once), each reply prefilled
    into the same cache as one chunk; only the live rows draw, in row order."""
    rows, pad, eos = len(prompt_ids), tokenizer.pad_token_id, tokenizer.eos_token_id
    cache = EpisodeCache(weights, rows, max(map(len, prompt_ids)) + settings.max_episode_tokens + 8, device)
    logits = cache.forward(*right_padded(prompt_ids, pad, device))
    episodes = [Episode() for _ in range(rows)]
    for _ in range(settings.max_turns):
        drawing = [i for i, e in enumerate(episodes) if not e.done and len(e.tokens) < settings.max_episode_tokens]
        if not drawing:
            break
        turn = {i: [] for i in drawing}
        for _ in range(sampling.max_new_tokens):
            drawing = [i for i in drawing if turn[i] is not None]
            if not drawing:
                break
            tokens, logprobs = sample_tokens(logits[drawing], sampling)
            fed = [[] for _ in range(rows)]
            for i, token, logprob in zip(drawing, tokens.tolist(), logprobs.tolist()):
                episode = episodes[i]
                episode.tokens.append(token)
                episode.own.append(1)
                episode.logprobs.append(logprob)
                turn[i].append(token)
                fed[i] = [token]
                stop = (sampling.stop_at_eos and token == eos) or len(episode.tokens) >= settings.max_episode_tokens
                if stop or len(turn[i]) >= sampling.max_new_tokens:
                    episode.last_turn_ended = sampling.stop_at_eos and token == eos
                    turn[i] = None  # this turn is over: its tokens are in `episode`
            chunk, real = right_padded(fed, pad, device)
            logits = torch.where(real.any(1, keepdim=True), cache.forward(chunk, real), logits)
        replies = [[] for _ in range(rows)]
        for i in turn:  # the rows that took a turn, in row order
            replies[i] = environment_turn(episodes[i], environments[i], tokenizer, settings, chat)
        if any(replies):
            chunk, real = right_padded(replies, pad, device)
            logits = torch.where(real.any(1, keepdim=True), cache.forward(chunk, real), logits)
    return episodes


def environment_turn(episode: Episode, environment, tokenizer, settings: EpisodeSettings, chat: bool) -> list[int]:
    """The environment's answer to the episode's last turn: its reward and whether it ends are recorded, and its
    reply's tokens (within the episode's token budget) appended as the environment's and returned ([] for none)."""
    turn_start = len(episode.own) - 1 - episode.own[::-1].index(0) if 0 in episode.own else -1
    text = tokenizer.decode(episode.tokens[turn_start + 1 :], skip_special_tokens=True)
    episode.turns += 1
    episode.messages.append({"role": "assistant", "content": text})
    step = environment.step(text)
    if step.reward is not None:
        episode.rewards.append(step.reward)
    episode.done = step.done
    if step.done or step.reply is None or episode.turns >= settings.max_turns:
        return []
    episode.messages.append({"role": settings.reply_role, "content": step.reply})
    said = tokenizer(
        reply_text(tokenizer, step.reply, settings.reply_role, episode.last_turn_ended, chat), add_special_tokens=False
    ).input_ids[: settings.max_episode_tokens - len(episode.tokens)]
    episode.tokens += said
    episode.own += [0] * len(said)
    episode.logprobs += [0.0] * len(said)
    return said


def episode_tensors(episodes: list[Episode], pad_token_id: int, device) -> dict[str, Tensor]:
    """The episodes in rollout layout, right-padded: completion ids, the model's-token mask, the episode mask, the
    sampler's log-probs `[N, T]`, and whether each ended `[N]` (the environment said done, or the model's last turn
    ended with its stop token)."""
    width = max(1, max(len(e.tokens) for e in episodes))

    def rows(values, fill, dtype):
        return torch.stack([F.pad(torch.tensor(v, dtype=dtype), (0, width - len(v)), value=fill) for v in values]).to(
            device
        )

    return {
        "completion_ids": rows([e.tokens for e in episodes], pad_token_id, torch.long),
        "completion_mask": rows([e.own for e in episodes], 0, torch.long),
        "episode_mask": rows([[1] * len(e.tokens) for e in episodes], 0, torch.long),
        "generation_logprobs": rows([e.logprobs for e in episodes], 0.0, torch.float32),
        "ended": torch.tensor([e.done or e.last_turn_ended for e in episodes], dtype=torch.bool, device=device),
    }


@torch.no_grad()
def collect_episodes(
    policy,
    reference,
    reward_model,
    tokenizer,
    prompt_ids: Tensor,
    prompt_mask: Tensor,
    k: int,
    sampling: SamplingConfig,
    environments: list,
    settings: EpisodeSettings,
    chat: bool,
    forward_batch_size: int,
    timer: PhaseTimer,
    shared_prefix: bool = False,
) -> tuple[Rollout, list[Episode]]:
    """collect_rollout's record for multi-turn episodes: k episodes per prompt (prompt-major; `environments`, one
    reset environment per episode, in that order), then the reference's log-probs of the model's tokens and the
    reward model's scores from forwards over whole episodes."""
    prompt_ids, prompt_mask = prompt_ids.repeat_interleave(k, 0), prompt_mask.repeat_interleave(k, 0)
    with timer("generate"):
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(prompt_ids, prompt_mask)]
        episodes = run_episodes(
            policy, tokenizer, prompts, environments, sampling, settings, forward_batch_size, chat, prompt_ids.device
        )
        made = episode_tensors(episodes, tokenizer.pad_token_id, prompt_ids.device)
    sampled = Rollout(
        prompt_ids,
        prompt_mask,
        made["completion_ids"],
        made["completion_mask"],
        made["ended"],
        made["generation_logprobs"],
        None,
        None,
        made["episode_mask"],
    )
    rollout = scored_rollout(
        policy,
        reference,
        reward_model,
        sampled,
        sampling.temperature,
        forward_batch_size,
        timer,
        k if shared_prefix else 1,
    )
    return rollout, episodes


def episode_completions(episodes: list[Episode], tokenizer, chat: bool) -> list:
    """What reward functions get as an episode's completion: for chat prompts its messages after the prompt (the
    model's turns as assistant messages, the replies in their role), for text prompts its whole text after the
    prompt, the environment's replies included."""
    if chat:
        return [list(e.messages) for e in episodes]
    return [tokenizer.decode(e.tokens, skip_special_tokens=True) for e in episodes]


def episode_returns(episodes: list[Episode]) -> Tensor:
    """Each episode's return `[N]` (Episode.episode_return): the reward's `env` term."""
    return torch.tensor([e.episode_return for e in episodes])


@torch.no_grad()
def complete_episodes(policy, tokenizer, rows: list[dict], sampling: SamplingConfig, batch_size: int, device, spec):
    """Held-out evaluation's `complete` for multi-turn episodes: one episode per row in `spec`'s environment
    (rows as the data module makes them: prompt, prompt_ids, columns, messages). Returns complete's fields (texts:
    each episode's whole text after the prompt; length: the model's tokens; eos: ended) and the reward functions'
    `completions`, the environment's `env_return` `[N]`, `turns` `[N]` and whether it `replied` at least once `[N]`."""
    chat = all(row.get("messages") is not None for row in rows)
    prompts = [row["messages"] if chat else row["prompt"] for row in rows]
    environments = [spec.start({"prompt": p, **row.get("columns", {})}) for p, row in zip(prompts, rows)]
    episodes = run_episodes(
        policy,
        tokenizer,
        [row["prompt_ids"] for row in rows],
        environments,
        sampling,
        spec.episode,
        batch_size,
        chat,
        device,
    )
    made = episode_tensors(episodes, tokenizer.pad_token_id, device)
    ids, mask = left_pad([row["prompt_ids"] for row in rows], tokenizer.pad_token_id)
    return {
        "texts": episode_completions(episodes, tokenizer, False),
        "completions": episode_completions(episodes, tokenizer, chat),
        "input_ids": torch.cat([ids.to(device), made["completion_ids"]], 1),
        "attention_mask": torch.cat([mask.to(device), made["episode_mask"]], 1),
        "length": made["completion_mask"].sum(1).float(),
        "eos": made["ended"].float(),
        "env_return": episode_returns(episodes).to(device),
        "turns": torch.tensor([float(e.turns) for e in episodes], device=device),
        "replied": torch.tensor([float(0 in e.own) for e in episodes], device=device),
    }
