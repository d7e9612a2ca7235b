"""What the rollout engine (rloo.generation.episodes) asks of an environment, and the one it plays a plain completion
with. An environment, one instance per episode:

    reset(row) -> str | None     a new episode for one data row ({"prompt": as the data has it, **its columns});
                                 it may return a first observation, appended to the prompt (for chat prompts to
                                 the last user message, as TRL does) before the first turn
    step(action_text) -> Step    the model's turn as text -> what the environment says: a reply (text, chat
                                 messages such as tool results, or None), a reward (a number or None), whether the
                                 episode ended (terminated) or was cut short (truncated), and info (numbers, logged
                                 as their means)
    get_reward() -> float        optional: the finished episode's reward (ended or cut), added to its return
    close()                      optional: runs once the episode is over, also when the run fails

`step` may return a `Step` or a tuple (reply, reward, done) or (reply, reward, terminated, truncated[, info]). The
engine cuts an episode at `max_turns` turns or `max_episode_tokens` tokens and says so (`Episode.truncated`). Plain
torch-free data; what guards a user's environment (timeouts, one-line errors) lives above, in rloo.environments.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

_SENTINEL = "rloo-turn-5c1e"


@dataclass(frozen=True)
class Step:
    """What an environment said to one turn."""

    reply: str | list[dict] | None  # text, or chat messages ({"role": "tool", "name": ..., "content": ...})
    reward: float | None
    terminated: bool
    truncated: bool = False
    info: dict = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class OneTurn:
    """A plain completion as an episode: it ends after the model's first turn and says nothing."""

    reads_actions = False  # the engine need not decode the turn for it
    plain = True  # its episodes end by their stop token alone (the missing-EOS penalty reads that)

    def step(self, action: str) -> Step:
        return Step(None, None, terminated=True)

    def close(self) -> None:
        pass


def reply_text(tokenizer, reply: str | list[dict], role: str, turn_ended: bool, chat: bool) -> str:
    """The text a reply adds after a model turn: for chat prompts what the template renders between the turn's
    content and the next assistant turn's first token (the turn's own end token left out where the model sampled
    it), the reply a message of `role` (or its own messages, tool results say); for text prompts the reply's text."""
    messages = [{"role": role, "content": reply}] if isinstance(reply, str) else list(reply)
    if not chat:
        return "\n".join(str(m.get("content", "")) for m in messages)
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}, *messages],
        tokenize=False,
        add_generation_prompt=True,
    )
    after = rendered.split(_SENTINEL, 1)[1]
    eos = tokenizer.eos_token or ""
    return after[len(eos) :] if turn_ended and eos and after.startswith(eos) else after


_LONGEST_TOKEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tokenizer -> its longest token's length


def longest_token_chars(tokenizer) -> int:
    """The most characters one token of the tokenizer's vocabulary decodes to (at least 1), measured once per
    tokenizer."""
    if tokenizer not in _LONGEST_TOKEN:
        _LONGEST_TOKEN[tokenizer] = max([1, *(len(t) for t in tokenizer.get_vocab())])
    return _LONGEST_TOKEN[tokenizer]


def reply_tokens(tokenizer, text: str, room: int) -> list[int]:
    """At most `room` tokens of a reply's text. The text is cut before it is tokenized, to (room + 2) times the
    longest token's characters, so a 1 MB reply costs what its first tokens cost; the tokens kept are the text's own
    (a cut inside one unbroken run of letters longer than two tokens can change that run's last tokens)."""
    if room <= 0:
        return []
    text = text[: (room + 2) * longest_token_chars(tokenizer)]
    return tokenizer(text, add_special_tokens=False).input_ids[:room]
