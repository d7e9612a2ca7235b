"""A fast multi-turn environment on the embedded task, for the tests and the first look: the model names the post's
topic words over up to `turns` turns; after a turn that missed some, the environment asks for more. The episode's
reward, at its end: the fraction of topics named, less half a point per other word, per topic (as
rloo.toy.rule_rewards.topic_recall scores one turn)."""

from __future__ import annotations

import time

from rloo.data.chat import prompt_text
from rloo.toy.task import EOS_TEXT, post_topics

MORE = " more\n\nTL;DR:"  # the environment's reply while topics are missing: words of the task's own vocabulary


class TopicRecall:
    def __init__(self, turns: int = 3, latency_s: float = 0.0):
        self.turns = turns
        self.latency_s = latency_s  # seconds each step waits first, as a sandbox or an API grader does

    def reset(self, row: dict) -> None:
        self.topics, self.named, self.others, self.turn = set(post_topics(prompt_text(row["prompt"]))), set(), 0, 0

    def step(self, action: str) -> tuple[str | None, float | None, bool]:
        if self.latency_s:
            time.sleep(self.latency_s)
        self.turn += 1
        words = action.split(EOS_TEXT, 1)[0].split()
        self.named |= self.topics.intersection(words)
        self.others += sum(1 for w in words if w not in self.topics)
        if self.named == self.topics or self.turn >= self.turns:
            return None, (len(self.named) - 0.5 * self.others) / max(len(self.topics), 1), True
        return MORE, None, False
