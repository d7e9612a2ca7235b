"""Evaluation for verifiable rewards from n sampled completions per prompt: pass@k with the unbiased estimator
(Chen et al. 2021) and majority-vote accuracy. Pure Python over counts and answers;
rloo.evaluation.heldout samples and scores."""

from __future__ import annotations

from collections import Counter
from math import comb


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The probability that at least one of k completions drawn without replacement from n, of which `correct` are
    correct, is correct: 1 - C(n - c, k) / C(n, k). Unbiased for the pass@k of the policy (never 1 - (1 - c/n)^k)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= correct <= n:
        raise ValueError(f"correct must lie in [0, n={n}], got {correct}")
    return 1.0 - comb(n - correct, k) / comb(n, k)  # comb(m, k) = 0 for m < k: some correct one is always drawn


def majority_vote(answers: list, correct: list[bool]) -> bool:
    """Whether the most frequent answer among a prompt's samples is correct (ties: the answer seen first; a sample
    without an answer, None, does not vote). The correctness of an answer is that of its first sample."""
    votes = Counter(a for a in answers if a is not None)
    if not votes:
        return False
    top = max(votes.values())
    winner = next(a for a in answers if a is not None and votes[a] == top)
    return bool(correct[answers.index(winner)])
