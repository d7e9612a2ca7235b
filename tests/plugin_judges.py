"""Plug-in judges, each misbehaving in one way, for the guard around judges (judge._target_=tests.plugin_judges.X)."""

import os
import time
from pathlib import Path

from rloo.judges import Judge, Verdict


class Raises(Judge):
    def judge(self, prompts, candidates, others):
        raise RuntimeError("the grader crashed")


class Exits(Judge):
    def judge(self, prompts, candidates, others):
        raise SystemExit(0)


class WrongCount(Judge):
    def judge(self, prompts, candidates, others):
        return [Verdict(1.0)] * (len(prompts) - 1)


class Floats(Judge):
    def judge(self, prompts, candidates, others):
        return [1.0] * len(prompts)


class BoolOutcomes(Judge):
    def judge(self, prompts, candidates, others):
        return [Verdict(True)] * len(prompts)


class Hangs(Judge):
    """Never returns: marks that it was entered (the file named by RLOO_TEST_HANG_MARK), then sleeps."""

    def judge(self, prompts, candidates, others):
        if os.environ.get("RLOO_TEST_HANG_MARK"):
            Path(os.environ["RLOO_TEST_HANG_MARK"]).touch()
        while True:
            time.sleep(1)


class Longest(Judge):
    """A well-behaved plug-in: the longer completion wins, equal lengths tie."""

    def judge(self, prompts, candidates, others):
        return [
            Verdict(1.0 if len(c) > len(o) else 0.5 if len(c) == len(o) else 0.0) for c, o in zip(candidates, others)
        ]
