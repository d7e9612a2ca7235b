"""A sweep that is a full 2^m factorial (sweeps/rloo_to_grpo.yaml: GRPO's three differences from RLOO, each on or
off): which settings are its cells, and each main effect and interaction as a contrast of the cells' means over
seeds, with its 95% interval (rloo.evaluation.intervals.contrast_interval).

With factors A, B, ... each at a first level (the sweep's first value: 0) and a second (1), the effect of a set S of
factors is the contrast with coefficient prod_{f in S} (+1 at f's second level, -1 at its first) / 2^(m - |S|) on each
cell: for one factor, the mean over the other factors' levels of (second - first); for two, the mean of the
difference of differences ((A at B's second) - (A at B's first)), 0 where the two changes add up; for three, the
difference of that between the levels of the third.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from rloo.evaluation.intervals import contrast_interval


@dataclass(frozen=True)
class Factorial:
    factors: tuple[tuple[str, str, str], ...]  # (key, first value, second value), in the sweep's order
    cells: dict[tuple[int, ...], str]  # levels (0 first, 1 second) -> the setting that ran them

    def effects(self, values: dict[str, list[float]]) -> list[tuple[str, tuple[float, float, float]]]:
        """Every main effect and interaction of the `values` (setting -> one value per seed), as (name, (estimate,
        low, high)); names join the factors' keys with ' x '."""
        m, out = len(self.factors), []
        for size in range(1, m + 1):
            for subset in itertools.combinations(range(m), size):
                levels = sorted(self.cells)
                coefficients = [_sign(levels_of, subset) / 2 ** (m - size) for levels_of in levels]
                groups = [values[self.cells[cell]] for cell in levels]
                name = " x ".join(_short(self.factors[i][0]) for i in subset)
                out.append((name, contrast_interval(groups, coefficients)))
        return out

    def first_cell(self) -> str:
        return self.cells[(0,) * len(self.factors)]

    def one_change(self, i: int) -> str:
        return self.cells[tuple(int(j == i) for j in range(len(self.factors)))]

    def all_changes(self) -> str:
        return self.cells[(1,) * len(self.factors)]


def _sign(levels: tuple[int, ...], subset: tuple[int, ...]) -> float:
    sign = 1.0
    for i in subset:
        sign *= 1.0 if levels[i] else -1.0
    return sign


def _short(key: str) -> str:
    return key.rsplit("/", 1)[-1]


def factorial_of(settings: dict[str, list[str]]) -> Factorial | None:
    """The factorial that `settings` (name -> its overrides other than seed, in job order) form: every key that takes
    exactly two values, each combination run by exactly one setting, and nothing else varying; None otherwise.
    Overrides are read by Hydra's parser."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser, parsed = OverridesParser.create(), {}
    for name, overrides in settings.items():
        parsed[name] = {o.key_or_group: o.get_value_element_as_str() for o in parser.parse_overrides(overrides)}
    values: dict[str, list[str]] = {}
    for chosen in parsed.values():
        for key, value in chosen.items():
            values.setdefault(key, [])
            if value not in values[key]:
                values[key].append(value)
    if not values or any(len(v) != 2 for v in values.values()) or len(parsed) != 2 ** len(values):
        return None
    factors = tuple((key, v[0], v[1]) for key, v in values.items())
    cells = {}
    for name, chosen in parsed.items():
        if set(chosen) != set(values):
            return None
        cells[tuple(values[key].index(chosen[key]) for key, _, _ in factors)] = name
    return Factorial(factors, cells) if len(cells) == len(parsed) else None
