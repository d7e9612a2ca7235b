"""A verifiable task written here, beside the summarisation-like one: arithmetic and short multi-step word problems
with integer answers, as chat prompts, and the correctness reward that checks the answer.

    data=arithmetic                                   the splits, generated into the cache on first use
    reward=rloo.toy.arithmetic:correct               1 if the completion's last number is the row's answer, else 0

Each row is {"prompt": [{"role": "system", ...}, {"role": "user", "content": question}], "answer": "<integer>"};
the reward function reads the `answer` column by name (rloo.rewards.scoring passes a row's columns to the functions that
ask for them).
"""

from __future__ import annotations

import random
import re

from rloo.data.chat import completion_text
from rloo.toy import generated

NAMES = ("Ana", "Ben", "Chloe", "Dev", "Emma", "Finn", "Gita", "Hugo", "Iris", "Jon")
ITEMS = ("apples", "books", "coins", "marbles", "pencils", "stamps", "cards", "shells")
INSTRUCTION = "Answer with the number only."
# a short system message of our own: without one, SmolLM2's chat template puts in its fixed one (longer, and it
# invites a chat answer)
SYSTEM = "You are a calculator. Reply with the final number only."
VERSION = 2  # part of the cache path: rows written by an older generator are never read
NUMBER = re.compile(r"-?\d+")


def problem(rng: random.Random) -> tuple[str, int]:
    """One question and its answer: a sum, a difference or a small product, or a two-step word problem."""
    kind = rng.choice(("add", "subtract", "multiply", "story"))
    if kind == "add":
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        return f"What is {a} + {b}?", a + b
    if kind == "subtract":
        a, b = sorted((rng.randint(10, 99), rng.randint(10, 99)), reverse=True)
        return f"What is {a} - {b}?", a - b
    if kind == "multiply":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"What is {a} * {b}?", a * b
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    start, more = rng.randint(5, 40), rng.randint(2, 20)
    given = rng.randint(1, start + more - 1)
    question = (
        f"{name} has {start} {item}. {name} gets {more} more and then gives {given} away. "
        f"How many {item} does {name} have now?"
    )
    return question, start + more - given


def rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        question, answer = problem(rng)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{question} {INSTRUCTION}"}]
        out.append({"prompt": messages, "answer": str(answer)})
    return out


def split_path(cache_dir: str, split: str, seed: int = 0, log=None) -> str:
    """The jsonl of one split (rloo.toy.generated: generated into the cache once, checked on every use)."""
    return generated.split_path(cache_dir, split, f"arithmetic-v{VERSION}", rows, "the arithmetic splits", seed, log)


def final_number(completion: str) -> str | None:
    found = NUMBER.findall(completion.replace(",", ""))
    return found[-1] if found else None


def correct(prompts: list, completions: list, answer: list[str]) -> list[float]:
    """The correctness reward: 1.0 where the completion's last number is the row's answer, else 0.0. Completions as
    text or, for these chat prompts, as TRL's assistant message lists (rloo.data.chat.completion_text)."""
    return [float(final_number(completion_text(c)) == str(a)) for c, a in zip(completions, answer)]
