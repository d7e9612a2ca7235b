"""The embedded task's own scorer as a judge: exact, free, and the ground truth the reward model approximates."""

from __future__ import annotations

from rloo.judges.base import Judge, Verdict
from rloo.toy.task import oracle_judge


class OracleJudge(Judge):
    name = "oracle"

    def judge(self, prompts: list[str], candidates: list[str], others: list[str]) -> list[Verdict]:
        return [Verdict(oracle_judge(p, c, o)) for p, c, o in zip(prompts, candidates, others)]
