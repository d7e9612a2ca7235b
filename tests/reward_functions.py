"""Reward functions that misbehave on purpose, for tests/test_guards.py (reward=tests.reward_functions:<name>)."""

import math


def raises(prompts, completions):
    raise ValueError("this reward function always fails")


def wrong_count(prompts, completions):
    return [0.0] * (len(completions) - 1)


def nan_for_odd_rows(prompts, completions):
    return [math.nan if i % 2 else float(len(c.split())) for i, c in enumerate(completions)]


def not_numbers(prompts, completions):
    return ["high"] * len(completions)


def length(prompts, completions):
    return [float(len(c.split())) for c in completions]


CALLS: list[dict] = []  # what answer_matches saw, for the test to compare with the data


def answer_matches(prompts, completions, answer):
    """1 where the completion contains the row's `answer` column, else 0: a correctness reward reading a column."""
    CALLS.append({"prompts": list(prompts), "answer": list(answer)})
    return [float(str(a) in c) for a, c in zip(answer, completions)]


def needs_a_missing_column(prompts, completions, solution):
    return [0.0] * len(completions)


def exits(prompts, completions):
    raise SystemExit(0)


def bools(prompts, completions):
    return [len(c) > 3 for c in completions]


def tensor_length(prompts, completions):
    import torch

    return torch.tensor([float(len(c.split())) for c in completions])


def hangs(prompts, completions):
    """Never returns: marks that it was entered (the file named by RLOO_TEST_HANG_MARK), then sleeps."""
    import os
    import time
    from pathlib import Path

    if os.environ.get("RLOO_TEST_HANG_MARK"):
        Path(os.environ["RLOO_TEST_HANG_MARK"]).touch()
    time.sleep(3600)


def constant(prompts, completions):
    return [1.0] * len(completions)
