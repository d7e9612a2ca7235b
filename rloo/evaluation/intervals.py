"""95% intervals: a proportion over rows (Wilson's score interval; the win rate of a judge's verdicts); over seeds, a
mean (Student's t), the difference of two means (Welch), and any linear contrast of several settings' means (Welch-
Satterthwaite), such as the main effects and interactions of a factorial sweep."""

from __future__ import annotations

import math
import statistics

Z_95 = 1.959963984540054  # standard normal two-sided 95% quantile
# evaluation outcomes in [0, 1] (with the win rate), whose intervals are Wilson's
PROPORTIONS = ("pass@", "majority_vote", "accuracy", "replied", "truncated")


def proportion_interval(mean: float, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval for a proportion: the mean `mean` of n values in [0, 1] (0/1 outcomes: correct,
    majority vote right; or fractions: a tie as half a win, pass@k's unbiased estimate per row). Inside [0, 1]
    by construction, and its coverage holds at small n and near 0 or 1 where the normal interval's does not
    (Brown, Cai & DasGupta 2001). For fractions the binomial variance p (1 - p) bounds theirs, so it is
    conservative there. n = 0: (nan, nan)."""
    if n <= 0:
        return math.nan, math.nan
    p = min(max(mean, 0.0), 1.0)
    z2 = z * z
    denominator = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4 * n * n)) / denominator
    low, high = max(0.0, centre - half), min(1.0, centre + half)
    return (0.0 if p == 0.0 else low), (1.0 if p == 1.0 else high)  # exact ends where rounding misses them


# two-sided 95% quantiles of Student's t by degrees of freedom (seeds - 1); beyond the table, the normal's
T_975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


def t_975(df: float) -> float:
    """Student's t two-sided 95% quantile at the largest tabled degrees of freedom <= df (conservative between
    entries); the normal's 1.96 beyond the table. A df that float sums leave a hair below an integer counts as it."""
    df += 1e-9
    return T_975[max(d for d in T_975 if d <= df)] if df <= max(T_975) else 1.96


def seed_interval(values: list[float], within: tuple[float, float] | None = None) -> tuple[float, float, float]:
    """Mean and 95% interval over seeds (Student's t on their standard error); one seed: no interval. `within`: the
    range the mean cannot leave (a proportion's (0, 1)), to which the interval is cut: the cut keeps every mean
    the interval covered."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = t_975(len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
    low, high = mean - half, mean + half
    if within is not None:
        low, high = max(low, within[0]), min(high, within[1])
    return mean, low, high


def difference_interval(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """mean(a) - mean(b) and its 95% interval (Welch: unequal variances and seed counts, Welch-Satterthwaite
    degrees of freedom). Whether two methods differ is read here: two 95% intervals that touch can still come from
    means whose difference excludes 0. Needs two seeds on each side."""
    return contrast_interval([a, b], [1.0, -1.0])


def contrast_interval(groups: list[list[float]], coefficients: list[float]) -> tuple[float, float, float]:
    """sum_g c_g * mean(group g) and its 95% interval: variance sum_g c_g^2 s_g^2 / n_g, degrees of freedom by
    Welch-Satterthwaite, (sum_g v_g)^2 / sum_g v_g^2 / (n_g - 1). Every group needs two values or more."""
    estimate = sum(c * statistics.fmean(g) for c, g in zip(coefficients, groups))
    parts = [(c * c * statistics.variance(g) / len(g), len(g)) for c, g in zip(coefficients, groups) if c != 0]
    variance = sum(v for v, _ in parts)
    if variance == 0:
        return estimate, estimate, estimate
    df = variance**2 / sum(v * v / (n - 1) for v, n in parts if v > 0)
    half = t_975(max(df, 1)) * variance**0.5
    return estimate, estimate - half, estimate + half


def win_rate_summary(outcomes: list[float | None]) -> dict[str, float | int]:
    """Win rate of the candidate with a tie counted as half, over the valid judgements, with its 95% interval:
    Wilson's score interval at that rate and the number judged (rloo.evaluation.intervals.proportion_interval),
    inside [0, 1] at any n. Invalid judgements are counted, and left out of the rate (never a win)."""
    valid = [s for s in outcomes if s is not None]
    wins, ties, losses = (sum(s == v for s in valid) for v in (1.0, 0.5, 0.0))
    n = len(valid)
    summary = {"wins": wins, "ties": ties, "losses": losses, "invalid": len(outcomes) - n, "num_judged": n}
    if n == 0:
        return {**summary, "win_rate": float("nan"), "win_rate_ci_low": float("nan"), "win_rate_ci_high": float("nan")}
    rate = (wins + 0.5 * ties) / n
    low, high = proportion_interval(rate, n)
    return {**summary, "win_rate": rate, "win_rate_ci_low": low, "win_rate_ci_high": high}
