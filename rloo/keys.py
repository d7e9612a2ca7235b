"""What a config key is, as a field of a dataclass: its resume policy and its range or choices (`key`), an open group
of keys (`group`), or a field no key sets (`derived`). rloo.schema walks a composed config against such fields; the
algorithms' config classes (rloo/algorithms/) declare their keys with them. A leaf: it imports nothing of rloo.
"""

from __future__ import annotations

from dataclasses import field

# a resume that changes a FIXED key is refused; an APPLIED key takes effect from the resumed rollout on
FIXED, APPLIED = "fixed", "applied"


def key(
    resume: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    choices: tuple | None = None,
):
    """A key's field: its resume policy and its range ([low, high], or (low, high] with low_open) or choices."""
    return field(metadata={"resume": resume, "low": low, "high": high, "low_open": low_open, "choices": choices})


def derived():
    """A field of an algorithm's config that no key sets: rloo.config.algorithm_config makes it (the sampling
    settings, the number of rollouts). The schema leaves it out."""
    return field(metadata={"derived": True})


def group(resume: str):
    """An open group: any keys below it (Lightning Trainer arguments, logger and judge settings), one policy."""
    return field(metadata={"resume": resume, "open": True})
