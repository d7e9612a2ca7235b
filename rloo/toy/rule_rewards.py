"""Rule-based rewards for the embedded task, usable as `reward=rloo.toy.rule_rewards:<name>` (see
rloo/rewards/scoring.py).

Each takes the decoded prompts and completions and returns one float per completion. They are simpler than the
oracle (which also charges order errors and repeated words): a reward a user might write by hand.
"""

from __future__ import annotations

from rloo.data.chat import completion_text, prompt_text
from rloo.toy.task import EOS_TEXT, post_topics


def topic_recall(prompts: list, completions: list) -> list[float]:
    """Fraction of the post's topic words the summary names, minus half a point per other word, per topic. Text or
    chat messages alike (rloo.data.chat)."""
    scores = []
    for prompt, completion in zip(prompts, completions):
        topics = set(post_topics(prompt_text(prompt)))
        words = completion_text(completion).split(EOS_TEXT, 1)[0].split()
        named = topics.intersection(words)
        others = sum(1 for w in words if w not in topics)
        scores.append((len(named) - 0.5 * others) / max(len(topics), 1))
    return scores
