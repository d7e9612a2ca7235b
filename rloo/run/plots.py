"""The figures rloo draws: a run's learning curves (`curves.png` in its run dir, written as every run ends, a failed or
stopped one's up to where it got; `python -m rloo.report <run dir>` draws them again) and a sweep's
(`python -m rloo.report <sweep dir>`, rloo.report).

Each PNG carries a description of what it draws in its text chunk `rloo`: every axes with its title and labels, each
line with its label and points, each interval's ends, each note written on an axes, all read off the figure's own
artists as it is saved. `described(path)` reads it back (what the tests check, and what a tool can read without
looking at pixels).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from contextlib import contextmanager
from pathlib import Path

from rloo.evaluation.intervals import PROPORTIONS  # held-out metrics in [0, 1], besides the win rate

CURVES = "curves.png"
NOTE = "rloo"  # the PNG text chunk holding the description


# ---- figures and their descriptions ---------------------------------------------------------------------------
@contextmanager
def figure_file(
    path: Path, panels: int = 1, columns: int = 1, size: tuple[float, float] = (5.5, 3.8), margins: dict | None = None
):
    """`panels` axes in a grid of `columns` for the caller to draw on (a list, or the one axes); the figure is then
    laid out so that no label is cut (constrained layout, or fixed `margins` as subplots_adjust takes them: a
    run's grid of panels, drawn as every run ends, where the automatic layout would cost half its time), saved with
    its description and closed (no display)."""
    import matplotlib

    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font cache notice, once per machine
    import matplotlib.pyplot as plt

    rows = math.ceil(panels / columns)
    layout = None if margins else "constrained"
    figure, grid = plt.subplots(rows, columns, figsize=size, dpi=120 if layout else 100, layout=layout, squeeze=False)
    if margins:
        figure.subplots_adjust(**margins)
    axes = [a for row in grid for a in row]
    for unused in axes[panels:]:
        unused.remove()
    try:
        yield axes[:panels] if panels > 1 else axes[0]
        from matplotlib.ticker import AutoLocator, MaxNLocator

        for a in axes[:panels]:
            a.grid(alpha=0.3)
            if type(a.xaxis.get_major_locator()) is AutoLocator:  # where the caller set no ticks of its own:
                a.xaxis.set_major_locator(MaxNLocator(integer=True))  # rollouts, episodes: whole numbers
        staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # whole or absent, as every file a run writes
        try:
            figure.savefig(staged, format="png", metadata={NOTE: json.dumps(description(figure))})
            os.replace(staged, path)
        finally:
            staged.unlink(missing_ok=True)
    finally:
        plt.close(figure)


def description(figure) -> dict:
    """What `figure` draws, from its artists: per axes its title, labels, lines (label, x, y), intervals (label, x,
    low, high) and notes."""
    from matplotlib.container import ErrorbarContainer

    out = []
    for axes in figure.axes:
        bars, in_bars = [], set()
        for container in axes.containers:
            if isinstance(container, ErrorbarContainer):
                data_line, _, collections = container.lines
                in_bars.add(id(data_line))
                segments = collections[0].get_segments() if collections else []
                bars.append(
                    {
                        "label": container.get_label(),
                        "x": floats(data_line.get_xdata()),
                        "y": floats(data_line.get_ydata()),
                        "low": [float(s[0][1]) for s in segments],
                        "high": [float(s[1][1]) for s in segments],
                    }
                )
        lines = [
            {
                "label": line.get_label(),
                "x": [float(x) for x in line.get_xdata()],
                "y": [float(y) for y in line.get_ydata()],
            }
            for line in axes.get_lines()
            if id(line) not in in_bars and not line.get_label().startswith("_")
        ]
        out.append(
            {
                "title": axes.get_title(),
                "xlabel": axes.get_xlabel(),
                "ylabel": axes.get_ylabel(),
                "lines": lines,
                "intervals": bars,
                "notes": [text.get_text() for text in axes.texts],
                "legend": [t.get_text() for t in axes.get_legend().get_texts()] if axes.get_legend() else [],
            }
        )
    return {"axes": out}


def floats(values) -> list[float]:
    return [float(v) for v in values]


def described(path: Path) -> dict:
    """The description a PNG rloo drew carries (figure_file), read back from the file."""
    from PIL import Image

    with Image.open(path) as image:
        return json.loads(image.text[NOTE])


def note(axes, text: str) -> None:
    """Words in an axes that has nothing to draw, said where the curve would be."""
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, fontsize=8, wrap=True)


# ---- a run's learning curves ----------------------------------------------------------------------------------


def metric_rows(run_dir: Path) -> list[dict] | None:
    """csv/metrics.csv as rows of floats (empty cells left out); None where the run kept none (logger=none)."""
    path = run_dir / "csv" / "metrics.csv"
    if not path.is_file():
        return None
    rows = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            parsed = {}
            for key, value in row.items():
                try:
                    parsed[key] = float(value)
                except (TypeError, ValueError):
                    continue
            if "step" in parsed:
                rows.append(parsed)
    return rows


def series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(rollouts, values) of `key`, finite values only."""
    points = [(r["step"], r[key]) for r in rows if key in r and math.isfinite(r[key])]
    return [p[0] for p in points], [p[1] for p in points]


def training_panels(rows: list[dict]) -> list[tuple[str, str, list[str]]]:
    """(title, y label, keys) of each training panel: the score and each reward term, the KL, the lengths, the clip
    fractions, and with a producer process or is_correction the staleness and the fraction the correction cut; each
    with the keys of it the run logged (a panel with none says so)."""
    keys = {k for r in rows for k in r}
    terms = sorted(k for k in keys if k.startswith("reward/") and not k.startswith(("reward/none/", "reward/masked")))
    panels = [
        ("score and reward terms", "mean per completion", ["objective/scores", *terms]),
        ("KL to the reference", "KL (nats per completion)", ["objective/kl"]),
        ("completion length", "tokens", ["completions/mean_length"]),
        ("clip fractions", "fraction", ["policy/clipfrac_avg", "policy/token_clipfrac_avg"]),
    ]
    staleness = ["async/staleness_mean", "async/staleness_max", "is/cut_frac"]
    if keys.intersection(staleness):  # a producer process: how stale the rollouts were, what the correction cut
        panels.append(("staleness and correction", "versions behind; fraction cut", staleness))
    return [(title, ylabel, [k for k in wanted if k in keys]) for title, ylabel, wanted in panels]


def held_out_keys(rows: list[dict]) -> tuple[list[str], list[str]]:
    """The held-out metrics the run evaluated with their intervals: the proportions (win rate, accuracy, pass@k,
    majority vote) and the rest (a reward function's mean, the environment's return)."""
    keys = sorted(
        {k.removesuffix("_ci_low") for r in rows for k in r if k.startswith("eval/") and k.endswith("_ci_low")}
    )
    proportions = [k for k in keys if k.removeprefix("eval/").startswith(("win_rate", *PROPORTIONS))]
    return proportions, [k for k in keys if k not in proportions]


def draw_run(run_dir: Path) -> tuple[Path | None, str]:
    """curves.png in `run_dir` from its csv/metrics.csv: the training panels and the held-out metrics with their
    95% intervals at each evaluation, against rollouts. Returns (the file, or None, and a line saying what it drew
    or why it drew nothing)."""
    rows = metric_rows(run_dir)
    if rows is None:
        return None, "curves.png: not drawn: the run kept no csv/metrics.csv (logger=none)"
    if not rows:
        return None, "curves.png: not drawn: csv/metrics.csv has no rows yet"
    training = training_panels(rows)
    proportions, others = held_out_keys(rows)
    panels = len(training) + 2
    path = run_dir / CURVES
    margins = {"left": 0.06, "right": 0.985, "bottom": 0.08, "top": 0.95, "wspace": 0.28, "hspace": 0.38}
    with figure_file(path, panels, columns=3, size=(13.5, 7.0), margins=margins) as axes:
        for a, (title, ylabel, keys) in zip(axes, training):
            draw_training(a, rows, title, ylabel, keys)
        draw_held_out(axes[-2], rows, proportions, "held-out proportions", "mean [95% CI]")
        draw_held_out(axes[-1], rows, others, "held-out rewards", "mean [95% CI]")
    drawn = sum(bool(a["lines"] or a["intervals"]) for a in described(path)["axes"])
    return path, f"curves.png: {drawn} panels of {panels} drawn from {len(rows)} rows of csv/metrics.csv"


def draw_training(axes, rows: list[dict], title: str, ylabel: str, keys: list[str]) -> None:
    axes.set_title(title, fontsize=9)
    axes.set_xlabel("rollout")
    axes.set_ylabel(ylabel)
    if not keys:
        note(axes, "not logged by this run")
        return
    for key in keys:
        xs, ys = series(rows, key)
        axes.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=key)
    axes.legend(fontsize=7)


def draw_held_out(axes, rows: list[dict], keys: list[str], title: str, ylabel: str) -> None:
    axes.set_title(title, fontsize=9)
    axes.set_xlabel("rollouts trained before the evaluation")
    axes.set_ylabel(ylabel)
    plain = [k for k in ("eval/score",) if title == "held-out rewards" and any(k in r for r in rows)]
    if not keys and not plain:
        note(axes, "none evaluated by this run")
        return
    for key in plain:  # the reward model's score: a mean over the rows it scored finitely, no interval kept
        xs, ys = series(rows, key)
        axes.plot(xs, ys, marker="s", markersize=3, label=f"{key.removeprefix('eval/')} (reward model)")
    for key in keys:
        points = [
            (r["step"], r[key], r.get(f"{key}_ci_low", r[key]), r.get(f"{key}_ci_high", r[key]))
            for r in rows
            if key in r and math.isfinite(r[key])
        ]
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        errors = [[half(y - p[2]) for y, p in zip(ys, points)], [half(p[3] - y) for y, p in zip(ys, points)]]
        axes.errorbar(xs, ys, yerr=errors, marker="o", markersize=3, capsize=3, label=key.removeprefix("eval/"))
    axes.legend(fontsize=7)


def half(width: float) -> float:
    """One side of an interval as an error bar: 0 where there is none (one row: no spread to measure)."""
    return width if math.isfinite(width) and width > 0 else 0.0


def write_curves(run_dir: Path, log) -> str:
    """curves.png for a run that ends (finished, failed or stopped): what was drawn, or why nothing was, in one line
    (the log has it where nothing was drawn; summary.json's `curves` always). Never raises: a figure is no reason to
    lose the run's own ending."""
    try:
        path, line = draw_run(run_dir)
    except Exception as error:  # a full disk, a broken font cache: said, and the run ends as it would
        path, line = None, f"curves.png: not drawn: {type(error).__name__}: {str(error).strip().splitlines()[0]}"
    if path is None:
        log(line)
    return line


# ---- a sweep's figures (python -m rloo.report) ------------------------------------------------------------------
def interval_over_seeds(values: list[float], within: tuple[float, float] | None) -> tuple[float, float, float]:
    """Mean and 95% interval over seeds; one seed: (mean, nan, nan), no interval (drawn without a bar, "n = 1")."""
    from rloo.evaluation.intervals import seed_interval

    if len(values) < 2:
        return values[0], float("nan"), float("nan")
    return seed_interval(values, within)


def draw_setting_points(axes, xs: list[float], cells: list[list[float]], label: str, within, joined=True) -> None:
    """One setting's line through the mean over seeds at each x, its 95% intervals as bars; a setting run with one
    seed says n = 1 in its label, and draws no bar (a zero-width one would claim certainty)."""
    withins = within if isinstance(within, list) else [within] * len(cells)  # a range per x, or one for all
    stats = [interval_over_seeds(values, limits) for values, limits in zip(cells, withins)]
    seeds = sorted({len(values) for values in cells})
    label = f"{label} (n = {'/'.join(map(str, seeds))})"
    means = [m for m, _, _ in stats]
    style = {"marker": "o", "markersize": 4, "label": label, "linestyle": "-" if joined else "none"}
    if seeds == [1]:
        axes.plot(xs, means, **style)
        return
    errors = [[half(m - low) for m, low, _ in stats], [half(high - m) for m, _, high in stats]]
    axes.errorbar(xs, means, yerr=errors, capsize=3, **style)


def plot_against_k(path: Path, lines: dict[str, dict[int, list[float]]], ylabel: str, within=None) -> None:
    """A final metric against k: one line per setting (the overrides other than k and seed), the mean over seeds at
    each k with its 95% interval."""
    with figure_file(path, size=(6.0, 4.0)) as axes:
        for setting, by_k in sorted(lines.items()):
            ks = sorted(by_k)
            draw_setting_points(axes, ks, [by_k[k] for k in ks], setting, within)
        axes.set_xticks(sorted({k for by_k in lines.values() for k in by_k}))  # the k that ran, no others
        axes.set_xlabel("k (completions per prompt)")
        axes.set_ylabel(ylabel)
        axes.legend(fontsize=7)


def plot_outcomes(path: Path, groups: dict[str, dict[str, list[float]]], metrics: list[str], ranges: dict) -> None:
    """Each final outcome's mean per setting with its 95% interval over seeds, settings side by side at each."""
    with figure_file(path, size=(7.0, 4.0)) as axes:
        width = 0.8 / max(len(groups), 1)
        for n, setting in enumerate(sorted(groups)):
            xs = [i - 0.4 + width * (n + 0.5) for i in range(len(metrics))]
            cells = [groups[setting].get(metric) or [float("nan")] for metric in metrics]
            draw_setting_points(axes, xs, cells, setting, [ranges[m] for m in metrics], joined=False)
        axes.set_xticks(range(len(metrics)), metrics)
        axes.set_ylabel("final, mean over seeds [95% CI]")
        axes.legend(fontsize=7)


def plot_curves(path: Path, groups: dict[str, list[list[tuple[float, float]]]], xlabel: str, ylabel: str) -> None:
    """A held-out metric against `x` at each evaluation: one line per setting, the mean over its seeds (the
    evaluations every seed has)."""
    import statistics

    with figure_file(path, size=(6.0, 4.0)) as axes:
        for setting, runs in sorted(groups.items()):
            points = min(len(run) for run in runs)
            xs = [statistics.fmean(run[i][0] for run in runs) for i in range(points)]
            ys = [statistics.fmean(run[i][1] for run in runs) for i in range(points)]
            axes.plot(xs, ys, marker="o", markersize=3, label=f"{setting} (n = {len(runs)})")
        axes.set_xlabel(xlabel)
        axes.set_ylabel(ylabel)
        if groups:
            axes.legend(fontsize=7)
