"""A deterministic toy summarisation task that mirrors TL;DR.

A "post" is a short sequence of filler words (6-12 by default) with 2-4
distinct topic words scattered in it (``PostShape``; bootstrap=hard draws
longer posts with more topics); the ideal "TL;DR" lists the topic words in order of
appearance.  Human references are systematically imperfect (see the HUMAN_*
constants) so the mode of the reference distribution is NOT the optimum:
SFT on references learns the human habits, and RL against a reward model
trained on oracle-labelled preferences (``preferences.py``) can do better.
``oracle_score`` / ``oracle_judge`` play the role of the GPT-4 judge.

All randomness goes through ``random.Random`` instances, never global state.
"""

import random
import re
import zlib
from dataclasses import dataclass

TOPIC_WORDS = (
    "cat",
    "dog",
    "boat",
    "rain",
    "car",
    "tree",
    "house",
    "phone",
    "book",
    "coffee",
    "train",
    "bike",
    "pizza",
    "river",
    "guitar",
    "garden",
    "laptop",
    "beach",
    "snow",
    "horse",
    "movie",
    "lamp",
    "bread",
    "ticket",
)
FILLER_WORDS = (
    "the",
    "really",
    "then",
    "so",
    "my",
    "today",
    "was",
    "and",
    "very",
    "just",
    "it",
    "we",
    "a",
    "but",
    "is",
    "on",
    "yes",
    "again",
    "there",
    "with",
)
# Words humans sprinkle into summaries; they never occur in posts.
TIC_WORDS = ("basically", "anyway", "lol", "idk")
ALL_WORDS = TOPIC_WORDS + FILLER_WORDS + TIC_WORDS
_TOPIC_SET = frozenset(TOPIC_WORDS)


@dataclass(frozen=True)
class PostShape:
    """How posts are drawn: a length (words, both ends included) and a number of distinct topic words."""

    length: tuple[int, int] = (6, 12)
    topics: tuple[int, ...] = (2, 3, 4)

    def __post_init__(self):
        low, high = self.length
        if not 1 <= low <= high:
            raise ValueError(f"post length must be 1 <= low <= high, got {self.length}")
        if not self.topics or min(self.topics) < 1 or max(self.topics) > min(low, len(TOPIC_WORDS)):
            raise ValueError(f"topic counts must be 1..min(shortest post, {len(TOPIC_WORDS)}), got {self.topics}")


DEFAULT_SHAPE = PostShape()  # the default task: the main job's

# Human reference habits (applied independently, in this order).
HUMAN_DROP_LAST_PROB = 0.6  # lazy: the last topic word is left out
HUMAN_SWAP_PROB = 0.1  # two adjacent topic words swapped (needs >= 2 left)
HUMAN_TIC_PROB = 0.35  # one tic word inserted at a random position

EOS_TEXT = "<|endoftext|>"
_POST_RE = re.compile(r"POST:(.*?)\n\nTL;DR:", re.S)


def format_prompt(post_words):
    """Render post words as the prompt text."""
    return "POST: " + " ".join(post_words) + "\n\nTL;DR:"


def format_completion(summary_words):
    """Render summary words as completion text (leading space, no EOS)."""
    return " " + " ".join(summary_words) if summary_words else ""


def post_words(prompt):
    """Parse the post words back out of a prompt (also inside a chat template)."""
    match = _POST_RE.search(prompt)
    if match is None:
        raise ValueError(f"not a toy-task prompt: {prompt!r}")
    return match.group(1).split()


def post_topics(prompt):
    """Topic words of the post, in order of appearance."""
    return [w for w in post_words(prompt) if w in _TOPIC_SET]


def ideal_summary(prompt):
    """The optimal completion: the post's topic words in post order."""
    return format_completion(post_topics(prompt))


def modal_human_summary(prompt):
    """The single most likely human reference: last topic dropped, no tic/swap."""
    return format_completion(post_topics(prompt)[:-1])


def oracle_score(prompt, completion):
    """Score a completion against the post; the perfect summary scores 1.0.

    Summary words are ``completion.split()`` (anything after an EOS string is
    ignored, as generation would have stopped there).  With n_topics the
    number of topic words in the post:

    * hits: distinct post topic words present in the summary;
    * misses: n_topics - hits;
    * extras: summary words that are not post topic words (fillers, tics,
      hallucinated topics, garbage) plus every repeated occurrence of a word;
    * order_errors: 1 if the hit words (first occurrences) are not in post
      order, else 0.

    score = (hits - misses - extras - 0.5 * order_errors) / n_topics.
    E.g. dropping one of 3 topics gives 1/3; one extra word costs 1/n_topics.
    """
    topics = post_topics(prompt)
    if not topics:
        raise ValueError(f"prompt has no topic words: {prompt!r}")
    words = completion.split(EOS_TEXT, 1)[0].split()
    rank = {w: i for i, w in enumerate(topics)}
    seen, hit_order, extras = set(), [], 0
    for word in words:
        if word in seen or word not in rank:
            extras += 1
            continue
        seen.add(word)
        hit_order.append(rank[word])
    hits = len(hit_order)
    misses = len(topics) - hits
    order_errors = 0 if hit_order == sorted(hit_order) else 1
    return (hits - misses - extras - 0.5 * order_errors) / len(topics)


def oracle_judge(prompt, completion_a, completion_b):
    """1.0 if a beats b under the oracle, 0.0 if it loses, 0.5 on a tie."""
    diff = oracle_score(prompt, completion_a) - oracle_score(prompt, completion_b)
    if abs(diff) < 1e-9:
        return 0.5
    return 1.0 if diff > 0 else 0.0


def win_rate(prompts, completions_a, completions_b):
    """Mean oracle_judge verdict of a over b (ties count 0.5)."""
    verdicts = [oracle_judge(p, a, b) for p, a, b in zip(prompts, completions_a, completions_b, strict=True)]
    return sum(verdicts) / len(verdicts)


def sample_post(rng, shape=DEFAULT_SHAPE):
    """Draw post words: filler with n_topics distinct topic words at random spots."""
    length = rng.randint(*shape.length)
    n_topics = rng.choice(shape.topics)
    words = [rng.choice(FILLER_WORDS) for _ in range(length)]
    topics = rng.sample(TOPIC_WORDS, n_topics)
    for pos, topic in zip(sorted(rng.sample(range(length), n_topics)), topics):
        words[pos] = topic
    return words


def human_summary_words(rng, topics):
    """Apply the human habits to the ideal topic list (a new list)."""
    words = list(topics)
    if rng.random() < HUMAN_DROP_LAST_PROB:
        words.pop()
    # Draw the swap coin even when ineligible so the stream shape is fixed.
    if rng.random() < HUMAN_SWAP_PROB and len(words) >= 2:
        i = rng.randrange(len(words) - 1)
        words[i], words[i + 1] = words[i + 1], words[i]
    if rng.random() < HUMAN_TIC_PROB:
        words.insert(rng.randint(0, len(words)), rng.choice(TIC_WORDS))
    return words


def _example_stream(rng, shape=DEFAULT_SHAPE):
    """Infinite stream of {prompt, reference} dicts."""
    while True:
        words = sample_post(rng, shape)
        topics = [w for w in words if w in _TOPIC_SET]
        yield {
            "prompt": format_prompt(words),
            "reference": format_completion(human_summary_words(rng, topics)),
        }


def make_examples(n, seed, shape=DEFAULT_SHAPE):
    """n examples with a human reference each; deterministic given seed."""
    stream = _example_stream(random.Random(seed), shape)
    return [next(stream) for _ in range(n)]


def split_seed(seed, split):
    """Per-split seed, so splits come from unrelated generation streams."""
    return zlib.crc32(f"rloo-toy/{split}/{seed}".encode())


def make_splits(seed=0, n_train=20000, n_validation=2000, n_test=2000, shape=DEFAULT_SHAPE):
    """Canonical train/validation/test splits.

    Prompts are unique across (and within) splits: test is drawn first, then
    validation, then train, each skipping prompts already taken, so no
    evaluation prompt is ever seen in training.
    """
    taken = set()
    splits = {}
    for name, n in (("test", n_test), ("validation", n_validation), ("train", n_train)):
        stream = _example_stream(random.Random(split_seed(seed, name)), shape)
        rows = []
        while len(rows) < n:
            row = next(stream)
            if row["prompt"] not in taken:
                taken.add(row["prompt"])
                rows.append(row)
        splits[name] = rows
    return {name: splits[name] for name in ("train", "validation", "test")}


def simulated_win_rates(examples):
    """Oracle win rates vs the human reference of two fixed policies."""
    prompts = [ex["prompt"] for ex in examples]
    refs = [ex["reference"] for ex in examples]
    return {
        "ideal_vs_reference": win_rate(prompts, [ideal_summary(p) for p in prompts], refs),
        "modal_human_vs_reference": win_rate(prompts, [modal_human_summary(p) for p in prompts], refs),
    }


if __name__ == "__main__":
    validation = make_splits()["validation"]
    for key, value in simulated_win_rates(validation).items():
        print(f"{key}: {value:.4f}")
