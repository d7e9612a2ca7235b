"""The generated tasks' split files (data=arithmetic, data=word_problems): every split of one seed written once into
a cache entry (rloo.utils.cache: under a lock, staged privately, checked against its hashes on every use, a damaged
one written again), a few ms, the same rows for the same seed."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

SPLITS = {"train": (2048, 0), "validation": (256, 1), "test": (256, 2)}  # rows, seed offset


def split_path(
    cache_dir: str, split: str, name: str, rows: Callable[[int, int], list[dict]], what: str, seed: int = 0, log=None
) -> str:
    """The jsonl of one split of the task `name` (its entry `<name>-<seed>` holds all three, said as `what`);
    `rows(n, seed)` generates a split."""
    from rloo.utils import cache

    root = Path(cache_dir).expanduser() / f"{name}-{seed}"

    def build(staging: Path) -> dict:
        for split_name, (n, offset) in SPLITS.items():
            split_rows = rows(n, 1000 * seed + offset)
            (staging / f"{split_name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in split_rows))
        return {"seed": seed, "rows": {split_name: n for split_name, (n, _) in SPLITS.items()}}

    say = log or (lambda line: print(f"rloo: {line}", file=sys.stderr))
    cache.entry(root, build, what, say)
    return str(root / f"{split}.jsonl")
