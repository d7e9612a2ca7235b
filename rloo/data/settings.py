"""One split's keys of conf/data/*.yaml, declared once: the schema checks a config against these fields
(rloo.config.schema's DataKeys) and the data module reads them. Plain data, no torch."""

from __future__ import annotations

from dataclasses import dataclass

from rloo.utils.keys import FIXED, key


@dataclass
class SplitSpec:
    """One split's keys of conf/data/*.yaml (documented there)."""

    path: str | None = key(FIXED)  # null without the bootstrap: check_sources_given names it
    split: str = key(FIXED)
    prompt_column: str = key(FIXED)
    reference_column: str | None = key(FIXED)
