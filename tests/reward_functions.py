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
