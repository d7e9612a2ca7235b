"""Oracle-labelled preference pairs for reward-model training.

Candidates come from a corruption process around the ideal summary, so the
reward model sees the whole space a policy might wander into (dropped,
hallucinated, repeated, reordered, truncated, copied-from-post words), plus
some ideal and some human-style summaries so it learns to rank the top end.
"""

import random

from rloo.toy.task import (
    DEFAULT_SHAPE,
    FILLER_WORDS,
    TIC_WORDS,
    TOPIC_WORDS,
    format_completion,
    format_prompt,
    human_summary_words,
    oracle_score,
    sample_post,
)

IDEAL_CANDIDATE_PROB = 0.1
HUMAN_CANDIDATE_PROB = 0.15
MAX_CORRUPTIONS = 3


def _drop(rng, words, post):
    if words:
        words.pop(rng.randrange(len(words)))


def _insert(rng, words, word):
    words.insert(rng.randint(0, len(words)), word)


def _insert_tic(rng, words, post):
    _insert(rng, words, rng.choice(TIC_WORDS))


def _insert_post_filler(rng, words, post):
    fillers = [w for w in post if w in FILLER_WORDS]
    _insert(rng, words, rng.choice(fillers or FILLER_WORDS))


def _hallucinate(rng, words, post):
    _insert(rng, words, rng.choice([t for t in TOPIC_WORDS if t not in post]))


def _duplicate(rng, words, post):
    if words:
        _insert(rng, words, rng.choice(words))


def _swap(rng, words, post):
    if len(words) >= 2:
        i, j = rng.sample(range(len(words)), 2)
        words[i], words[j] = words[j], words[i]


def _truncate(rng, words, post):
    del words[rng.randint(0, len(words)) :]


def _copy_post(rng, words, post):
    # An untrained policy often just parrots a chunk of the post.
    start = rng.randrange(len(post))
    words[:] = post[start : rng.randint(start + 1, len(post))]


CORRUPTIONS = (
    _drop,
    _insert_tic,
    _insert_post_filler,
    _hallucinate,
    _duplicate,
    _swap,
    _truncate,
    _copy_post,
)


def sample_candidate(rng, post):
    """One candidate summary (completion text) for the given post words."""
    topics = [w for w in post if w in TOPIC_WORDS]
    r = rng.random()
    if r < IDEAL_CANDIDATE_PROB:
        return format_completion(topics)
    if r < IDEAL_CANDIDATE_PROB + HUMAN_CANDIDATE_PROB:
        return format_completion(human_summary_words(rng, topics))
    words = list(topics)
    for _ in range(rng.randint(1, MAX_CORRUPTIONS)):
        rng.choice(CORRUPTIONS)(rng, words, post)
    return format_completion(words)


def make_preference_pairs(n, seed, shape=DEFAULT_SHAPE):
    """n {prompt, chosen, rejected} pairs labelled by oracle_score.

    Ties (equal oracle score, including identical candidates) are skipped and
    redrawn, so exactly n strict preferences come back.  Deterministic given seed.
    """
    rng = random.Random(seed)
    pairs = []
    while len(pairs) < n:
        post = sample_post(rng, shape)
        prompt = format_prompt(post)
        a, b = sample_candidate(rng, post), sample_candidate(rng, post)
        score_a, score_b = oracle_score(prompt, a), oracle_score(prompt, b)
        if abs(score_a - score_b) < 1e-9:
            continue
        chosen, rejected = (a, b) if score_a > score_b else (b, a)
        pairs.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return pairs
