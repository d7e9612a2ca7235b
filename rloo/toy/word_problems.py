"""Two-step word problems whose arithmetic is past a small model's head (two-digit products), for the calculator
environment (rloo.environments.calculator): chat prompts whose system message explains the tool.

    data=word_problems env=calculator reward=env       the splits, generated into the cache on first use

Each row is {"prompt": [{"role": "system", ...}, one worked exchange (DEMO), {"role": "user", "content": question}],
"answer": "<integer>", "expression": "<the arithmetic that solves it>"}.
"""

from __future__ import annotations

import random

from rloo.toy import generated

VERSION = 2  # part of the cache path: rows written by an older generator are never read
NAMES = ("Ana", "Ben", "Chloe", "Dev", "Emma", "Finn", "Gita", "Hugo", "Iris", "Jon")
ITEMS = ("apples", "books", "coins", "marbles", "pencils", "stamps", "cards", "shells")
SYSTEM = (
    "You can use a calculator. To use it, write <calc>expression</calc>, for example <calc>12*7+5</calc>, and "
    "the result comes back. When you know the answer, write: Answer: <number>"
)


def problem(rng: random.Random) -> tuple[str, str, int]:
    """One question, the expression that solves it, and its answer."""
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(11, 39), rng.randint(11, 39), rng.randint(10, 99)
    kind = rng.randrange(3)
    if kind == 0:
        return (
            f"{name} buys {a} boxes of {item} with {b} {item} in each box and gives away {c}. "
            f"How many {item} does {name} have left?",
            f"{a}*{b}-{c}",
            a * b - c,
        )
    if kind == 1:
        return (
            f"{name} has {c} {item} and buys {a} packs of {b} {item} each. How many {item} does {name} have now?",
            f"{c}+{a}*{b}",
            c + a * b,
        )
    return (
        f"A shelf holds {a} rows of {b} {item}, and {c} more {item} are put on it. How many {item} are on the shelf?",
        f"{a}*{b}+{c}",
        a * b + c,
    )


# one worked exchange before the question: a call, its result, the answer (a 135M model follows a shown format far
# better than a described one: with it, SmolLM2-135M-Instruct calls the calculator in most greedy episodes)
DEMO = [
    {"role": "user", "content": "Tom has 3 bags of 12 apples and eats 5. How many apples are left?"},
    {"role": "assistant", "content": "<calc>3*12-5</calc>"},
    {"role": "user", "content": "Result: 31"},
    {"role": "assistant", "content": "Answer: 31"},
]


def rows(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        question, expression, answer = problem(rng)
        messages = [{"role": "system", "content": SYSTEM}, *DEMO, {"role": "user", "content": question}]
        out.append({"prompt": messages, "answer": str(answer), "expression": expression})
    return out


def split_path(cache_dir: str, split: str, seed: int = 0, log=None) -> str:
    """The jsonl of one split (rloo.toy.generated: generated into the cache once, checked on every use)."""
    return generated.split_path(
        cache_dir, split, f"word-problems-v{VERSION}", rows, "the word-problem splits", seed, log
    )
