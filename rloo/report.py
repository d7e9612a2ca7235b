"""python -m rloo.report <run dir | multirun dir>: a run's learning curves, or a sweep's tables and plots, no notebook.

    python -m rloo.report outputs/2026-12-03/08-30-00            # curves.png, drawn again (rloo.run.plots)
    python -m rloo.report outputs/multirun/2026-12-03/08-30-00   # the sweep: docs/sweeps.md lists what it writes

A sweep's job dirs, read into rows by rloo.run.sweep_jobs (running, failed, killed and interrupted jobs kept, each
with its one-line error: none is dropped), become: report.md and report.csv (one row per job), settings.md (per
setting: the headline metric's mean over seeds with its Student-t 95% interval, `n = 1` for one seed),
differences.md (every pair of settings, Welch intervals), updates.md, verifiable.md and factorial.md where they
apply, and the figures of the metrics the jobs have (sweep_plots). A results dir of kept jobs (rloo.run.kept_jobs,
`--keep`) is a sweep dir too.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

from rloo.evaluation.intervals import PROPORTIONS, difference_interval, seed_interval, t_975  # noqa: F401 (API)
from rloo.run import kept_jobs, plots
from rloo.run.sweep_jobs import (  # noqa: F401 (rloo.report's API: a job's row, its outcomes)
    OUTCOMES,
    TAIL_STEPS,
    UPDATE_METRICS,
    job_dirs,
    job_row,
    outcomes_of,
)
from rloo.utils import ownership

COLUMNS = [
    "job",
    "overrides",
    "status",
    "error",
    "algorithm",
    "seed",
    "k",
    "clip_range",
    "kl_coef",
    "win_rate",
    "win_rate_ci_low",
    "win_rate_ci_high",
    "score",
    "reward",
    "kl",
    "clipfrac",
    "episodes",
    "train_seconds",
    "wall_seconds",
    "peak_rss_mb",
    "peak_gpu_mb",
]


def failures(rows: list[dict]) -> list[str]:
    """One line per job that did not finish (running jobs aside): its dir and why."""
    return [
        f"{r['job']}: {r['status']}" + (f": {r['error']}" if r.get("error") else "")
        for r in rows
        if r["status"] not in ("ok", "running")
    ]


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def hosts_line(rows: list[dict]) -> str:
    """Which CPUs ran the jobs: figures depend on the instruction set (rloo.utils.host)."""
    counts: dict[str, int] = {}
    for r in rows:
        if r["status"] == "ok":
            counts[r["host"]] = counts.get(r["host"], 0) + 1
    return "Hosts: " + "; ".join(f"{host} ({n} jobs)" for host, n in counts.items()) + "\n"


def markdown(rows: list[dict]) -> str:
    lines = [
        hosts_line(rows),
        "| job | status | win rate [95% CI] | reward | KL | clip frac | wall s | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        win = (
            "-"
            if r.get("win_rate") is None
            else f"{r['win_rate']:.3f} [{r['win_rate_ci_low']:.3f}, {r['win_rate_ci_high']:.3f}]"
        )
        lines.append(
            f"| {r['overrides'] or r['job']} | {r['status']} | {win} | {_cell(r.get('reward'))} "
            f"| {_cell(r.get('kl'))} | {_cell(r.get('clipfrac'))} | {_cell(r.get('wall_seconds'))} "
            f"| {_cell(r.get('peak_rss_mb'))} |"
        )
    return "\n".join(lines) + "\n"


def finished_by_setting(rows: list[dict], metric: str = "win_rate") -> dict[str, list[dict]]:
    """The finished jobs that report a final `metric`, grouped by setting (their overrides other than seed)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["status"] == "ok" and metric_of(r, metric) is not None:
            groups.setdefault(r["setting"], []).append(r)
    return groups


def metric_of(job: dict, metric: str) -> float | None:
    return job.get("win_rate") if metric == "win_rate" else (job.get("outcomes") or {}).get(metric)


def metric_range(metric: str) -> tuple[float, float] | None:
    """(0, 1) for a proportion (the win rate, accuracy, pass@k, majority vote), whose intervals stay inside it;
    None for a reward function's mean, which may lie anywhere."""
    return (0.0, 1.0) if metric == "win_rate" or metric.startswith(PROPORTIONS) else None


def spread(low: float, high: float) -> bool:
    """Whether an interval over seeds has width: a zero-wide one (no seed differed) separates nothing."""
    return high - low > 1e-12


def differences_markdown(rows: list[dict], metric: str = "win_rate") -> str:
    """Every pair of settings with two seeds or more, the better first: the difference of their mean final `metric`
    (the win rate, or a verifiable outcome) and its 95% interval (difference_interval); "yes" where the interval
    excludes 0. Where neither setting's seeds spread (each seed scored the same: a greedy evaluation on a fixed
    held-out set can), Welch's interval is zero-wide and says nothing: the pair reads "no spread over seeds", never
    "yes"."""
    rates = {}
    for setting, jobs in finished_by_setting(rows, metric).items():
        if len(jobs) >= 2:
            rates[setting] = [metric_of(j, metric) for j in jobs]
    ranked = sorted(rates, key=lambda s: -statistics.fmean(rates[s]))
    name = "win rates" if metric == "win_rate" else metric
    lines = [
        f"| better | worse | difference of mean final {name} [95% CI, Welch] | separated |",
        "|---|---|---|---|",
    ]
    for i, a in enumerate(ranked):
        for b in ranked[i + 1 :]:
            diff, low, high = difference_interval(rates[a], rates[b])
            verdict = "no spread over seeds" if not spread(low, high) else "yes" if low > 0 else "no"
            lines.append(f"| {a} | {b} | {diff:+.3f} [{low:+.3f}, {high:+.3f}] | {verdict} |")
    return "\n".join(lines) + "\n"


def headline_metric(rows: list[dict]) -> str:
    """What settings.md ranks by: the final win rate where a judge gave one, else the first verifiable outcome."""
    if any(r["status"] == "ok" and r.get("win_rate") is not None for r in rows):
        return "win_rate"
    return (verifiable_metrics(rows) or ["win_rate"])[0]


def by_setting(rows: list[dict]) -> list[dict]:
    """The finished jobs grouped by their overrides other than seed: one row per setting (a method, say), the final
    win rate (or, with no judge, the first verifiable outcome: headline_metric) as mean and 95% interval over its
    seeds, the other columns as means."""
    table, metric = [], headline_metric(rows)
    for setting, jobs in finished_by_setting(rows, metric).items():
        mean, low, high = seed_interval([metric_of(j, metric) for j in jobs], metric_range(metric))
        averaged = {
            key: statistics.fmean(values) if (values := [j[key] for j in jobs if j.get(key) is not None]) else None
            for key in ("score", "reward", "kl", "episodes", "train_seconds", "wall_seconds", "peak_rss_mb")
        }
        if averaged["train_seconds"] is not None and averaged["episodes"]:
            averaged["ms_per_episode"] = 1000 * averaged["train_seconds"] / averaged["episodes"]
        table.append(
            {
                "setting": setting,
                "metric": metric,
                "seeds": len(jobs),
                "win_rate": mean,
                "win_rate_low": low,
                "win_rate_high": high,
                **averaged,
            }
        )
    return sorted(table, key=lambda r: -r["win_rate"])


def settings_markdown(table: list[dict]) -> str:
    metric = table[0]["metric"] if table else "win_rate"
    lines = [
        f"| setting | seeds | final {metric.replace('_', ' ')}, mean [95% CI over seeds] | RM score (held-out) "
        "| reward | KL "
        "| episodes | train s | ms per episode | wall s | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in table:
        lines.append(
            f"| {r['setting']} | {r['seeds']} | {headline_cell(r)} | {_cell(r['score'])} | {_cell(r['reward'])} "
            f"| {_cell(r['kl'])} "
            f"| {_cell(r['episodes'])} | {_cell(r['train_seconds'])} | {_cell(r.get('ms_per_episode'))} "
            f"| {_cell(r['wall_seconds'])} | {_cell(r['peak_rss_mb'])} |"
        )
    return "\n".join(lines) + "\n"


def headline_cell(row: dict) -> str:
    if row["seeds"] < 2:
        return f"{row['win_rate']:.3f} (n = 1)"
    return f"{row['win_rate']:.3f} [{row['win_rate_low']:.3f}, {row['win_rate_high']:.3f}]"


def verifiable_metrics(rows: list[dict]) -> list[str]:
    """The verifiable outcomes some finished job reports, in a fixed order."""
    found = {name for r in rows if r["status"] == "ok" for name in r.get("outcomes") or {}}
    return sorted(found, key=lambda name: (not name.startswith("reward/"), name != "accuracy", name))


def verifiable_markdown(rows: list[dict]) -> str:
    """One row per setting: each verifiable outcome's mean and Student-t 95% interval over seeds."""
    metrics = verifiable_metrics(rows)
    if not metrics:
        return ""
    lines = ["| setting | seeds | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 2) + "|"]
    groups = finished_by_setting(rows, metrics[0])
    ranked = sorted(groups, key=lambda s: -statistics.fmean(metric_of(j, metrics[0]) for j in groups[s]))
    for setting in ranked:
        cells = []
        for metric in metrics:
            values = [v for j in groups[setting] if (v := metric_of(j, metric)) is not None]
            cells.append(_interval_cell(values, within=metric_range(metric)))
        lines.append(f"| {setting} | {len(groups[setting])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_outcomes(rows: list[dict], path: Path) -> None:
    """Each verifiable outcome's final mean per setting with its Student-t 95% interval over seeds, settings side
    by side at each outcome (rloo.run.plots)."""
    metrics = [m for m in verifiable_metrics(rows) if not m.startswith("reward/")] or verifiable_metrics(rows)
    groups = {
        setting: {m: [v for j in jobs if (v := metric_of(j, m)) is not None] for m in metrics}
        for setting, jobs in finished_by_setting(rows, metrics[0]).items()
    }
    plots.plot_outcomes(path, groups, metrics, {m: metric_range(m) for m in metrics})


def all_differences_markdown(rows: list[dict]) -> str:
    """differences_markdown for the win rate and for each verifiable outcome, one section each."""
    sections = [("win_rate", "## Final win rate")] + [(m, f"## {m}") for m in verifiable_metrics(rows)]
    return "\n".join(f"{title}\n\n{differences_markdown(rows, metric)}" for metric, title in sections)


def plot_curves(rows: list[dict], x_key: str, xlabel: str, path: Path, y_key: str, ylabel: str) -> None:
    """Held-out `y_key` (the win rate, or a verifiable outcome) against `x_key` of each evaluation (episodes,
    train_seconds): one line per setting, the mean over its seeds at each evaluation (rloo.run.plots)."""
    groups: dict[str, list[list[tuple[float, float]]]] = {}
    for r in rows:
        evaluations = [(h[x_key], h[y_key]) for h in r.get("history") or [] if h.get(y_key) is not None and x_key in h]
        if r["status"] == "ok" and evaluations:
            groups.setdefault(r["setting"], []).append(evaluations)
    plots.plot_curves(path, groups, xlabel, f"held-out {ylabel} (mean over seeds)")


def against_k(rows: list[dict], key: str) -> dict[str, dict[int, list[float]]]:
    """The finished jobs' `key` by setting without k (the overrides other than k and seed: an algorithm, a clip
    range) and by k: what a plot against k draws, one line per setting."""
    lines: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        value = r.get(key) if key in ("kl", "win_rate") else (r.get("outcomes") or {}).get(key)
        if r["status"] == "ok" and value is not None and r.get("k") is not None:
            setting = " ".join(o for o in r["varying"] if not o.startswith("k=")) or "(defaults)"
            lines.setdefault(setting, {}).setdefault(int(r["k"]), []).append(float(value))
    return lines


def file_stem(metric: str) -> str:
    """A metric's name in a file name: reward/topic_recall -> reward_topic_recall, pass@4 -> pass_at_4."""
    return metric.replace("/", "_").replace("@", "_at_")


def sweep_plots(rows: list[dict], out: Path) -> list[str]:
    """The sweep's figures, of the metrics its jobs have: the headline metric (the win rate where a judge gave one,
    else the first verifiable outcome) and the KL against k where k varies, the held-out curves of the win rate or
    of the verifiable outcomes, the final outcomes side by side. Returns the files written."""
    written, headline = [], headline_metric(rows)
    has_win_rate = any(r["status"] == "ok" and r.get("win_rate") is not None for r in rows)
    name = file_stem(headline)
    if len({r.get("k") for r in rows if r["status"] == "ok"}) > 1:  # against k only where k varies
        if lines := against_k(rows, headline):
            plots.plot_against_k(out / f"{name}_vs_k.png", lines, f"final {headline} [95% CI over seeds]", (0, 1))
            written.append(f"{name}_vs_k.png")
        if lines := against_k(rows, "kl"):
            plots.plot_against_k(out / "kl_vs_k.png", lines, f"KL, mean of last {TAIL_STEPS} steps")
            written.append("kl_vs_k.png")
    curves = (["win_rate"] if has_win_rate else []) + verifiable_metrics(rows)[:2]
    sampled = any(r.get("budget") == "sampled" for r in rows if r["status"] == "ok")  # what the budget counted
    x_key, x_label = (
        ("sampled", "episodes sampled (budget=sampled)")
        if sampled
        else ("episodes", "episodes (completions trained on)")
    )
    for metric in curves:
        name = file_stem(metric)
        plot_curves(
            rows,
            x_key,
            x_label,
            out / f"{name}_vs_episodes.png",
            f"eval/{metric}",
            metric.replace("_", " "),
        )
        written.append(f"{name}_vs_episodes.png")
    if has_win_rate:
        plot_curves(
            rows,
            "train_seconds",
            "seconds of training (no evaluation)",
            out / "win_rate_vs_seconds.png",
            "eval/win_rate",
            "win rate",
        )
        written.append("win_rate_vs_seconds.png")
    if verifiable_metrics(rows):
        plot_outcomes(rows, out / "verifiable.png")
        written.append("verifiable.png")
    return written


def name_settings(rows: list[dict]) -> None:
    """Each job's setting as text: its overrides other than seed, less those every job shares (logger=csv, say)."""
    shared = set.intersection(*(set(r["setting"]) for r in rows)) if rows else set()
    for r in rows:
        r["varying"] = [o for o in r["setting"] if o not in shared]
        r["setting"] = " ".join(r["varying"]) or "(defaults)"


def report(multirun_dir: Path) -> tuple[list[dict], list[str]]:
    """Every table and figure of a sweep, written into its dir: its jobs' rows, and the figures drawn."""
    rows = [job_row(job) for job in job_dirs(multirun_dir)]
    name_settings(rows)
    (multirun_dir / "report.md").write_text(markdown(rows))
    with (multirun_dir / "report.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (multirun_dir / "settings.md").write_text(settings_markdown(by_setting(rows)))
    (multirun_dir / "differences.md").write_text(all_differences_markdown(rows))
    (multirun_dir / "updates.md").write_text(updates_markdown(rows))
    if factorial := factorial_markdown(rows):
        (multirun_dir / "factorial.md").write_text(factorial)
    if verifiable_metrics(rows):
        (multirun_dir / "verifiable.md").write_text(verifiable_markdown(rows))
    for stale in multirun_dir.glob("*.png"):  # figures of an earlier report that this one may not draw
        stale.unlink()
    return rows, sweep_plots(rows, multirun_dir)


def _interval_cell(values: list[float], digits: int = 3, within: tuple[float, float] | None = None) -> str:
    """`mean [low, high]` over seeds (Student-t 95%); one seed says `(n = 1)`: it has no interval, and a zero-width
    one would claim certainty."""
    if not values:
        return "-"
    if len(values) < 2:
        return f"{values[0]:.{digits}f} (n = 1)"
    mean, low, high = seed_interval(values, within)
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def updates_markdown(rows: list[dict]) -> str:
    """One row per setting, means over its seeds with 95% intervals: what the updates of a reused rollout did (the
    clip fraction, of sequences and of tokens, the approximate KL between the policy before and after, the extreme
    ratios; each the mean over every step), the KL to the reference (last steps) and the completions sampled per
    completion trained on (above 1 where dynamic sampling dropped groups)."""
    columns = [
        ("clip fraction", "clipfrac_run"),
        ("token clip fraction", "token_clipfrac_run"),
        ("approx KL (old, new)", "approxkl_run"),
        ("ratio min", "ratio_min_run"),
        ("ratio max", "ratio_max_run"),
        ("KL to reference", "kl"),
        ("sampled per trained", "sampled_per_trained"),
    ]
    lines = ["| setting | seeds | " + " | ".join(c for c, _ in columns) + " |", "|---" * (len(columns) + 2) + "|"]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r["status"] == "ok":
            groups.setdefault(r["setting"], []).append(r)
    for setting, jobs in groups.items():
        cells = [_interval_cell([j[key] for j in jobs if j.get(key) is not None], 4) for _, key in columns]
        lines.append(f"| {setting} | {len(jobs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def factorial_markdown(rows: list[dict]) -> str:
    """Where the settings form a full 2^m factorial of two factors or more, each cell run with two seeds or more
    (rloo.evaluation.factorial): each change alone and all of them against the first cell (Welch), then every main
    effect and interaction, for the win rate and each verifiable outcome; "" otherwise."""
    from rloo.evaluation.factorial import factorial_of

    varying = {r["setting"]: r["varying"] for r in rows if r["status"] == "ok"}
    design = factorial_of(varying)
    seeds = {setting: len(jobs) for setting, jobs in finished_by_setting(rows, headline_metric(rows)).items()}
    if design is None or len(design.factors) < 2 or min(seeds.get(s, 0) for s in design.cells.values()) < 2:
        return ""  # no design, one factor (differences.md has the pair), or a cell with no spread over seeds
    metrics = [m for m in ("win_rate", *verifiable_metrics(rows)) if finished_by_setting(rows, m)]
    values = {
        m: {s: [metric_of(j, m) for j in jobs] for s, jobs in finished_by_setting(rows, m).items()} for m in metrics
    }
    header = "| | " + " | ".join(metrics) + " |\n" + "|---" * (len(metrics) + 1) + "|\n"
    base = design.first_cell()
    lines = [f"Against `{base}` (Welch 95% intervals):\n", header.rstrip("\n")]
    changed = [
        (design.factors[i][0] + "=" + design.factors[i][2], design.one_change(i)) for i in range(len(design.factors))
    ]
    for name, cell in [*changed, ("all changes", design.all_changes())]:
        cells = [_signed(difference_interval(values[m][cell], values[m][base])) for m in metrics]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Main effects and interactions (each second level against the first; 95% intervals):\n",
        header.rstrip("\n"),
    ]
    effects = {m: design.effects(values[m]) for m in metrics}
    for i, (name, _) in enumerate(effects[metrics[0]]):
        lines.append(f"| {name} | " + " | ".join(_signed(effects[m][i][1]) for m in metrics) + " |")
    return "\n".join(lines) + "\n"


def _signed(interval: tuple[float, float, float]) -> str:
    estimate, low, high = interval
    mark = " *" if (low > 0 or high < 0) and spread(low, high) else ""
    return f"{estimate:+.3f} [{low:+.3f}, {high:+.3f}]{mark}"


def latest_sweep(root: Path) -> str:
    """The newest multirun dir under `root`: <date>/<time> as conf/hydra names them, compared by name (which sorts
    by time, HH-MM-SS_2 after HH-MM-SS). Exit 2 in one line where there is none."""
    sweeps = [d for d in root.glob("*/*") if d.is_dir() and job_dirs(d)] if root.is_dir() else []
    if not sweeps:
        print(f"error: no sweep under {root}/: give a multirun dir (python -m rloo.report <dir>)", file=sys.stderr)
        sys.exit(2)
    return str(max(sweeps, key=lambda d: (d.parent.name, d.name)))


def main(argv: list[str] | None = None) -> None:
    from rloo.run.cli import OneLineParser

    parser = OneLineParser(
        prog="python -m rloo.report",
        description="A run's learning curves (curves.png in its run dir), or a sweep's tables and plots (report.md, "
        "settings.md, report.csv and the figures of the metrics its jobs have, in the multirun dir)",
    )
    parser.add_argument(
        "dir",
        nargs="?",
        help="a run dir (outputs/<date>/<time>) or a multirun dir (outputs/multirun/<date>/<time>); default: the "
        "latest sweep under outputs/multirun",
    )
    parser.add_argument(
        "--keep",
        metavar="RESULTS_DIR",
        help="copy the sweep's jobs that ended into RESULTS_DIR/<overrides>/ (their summaries, configs and metrics: "
        "rloo.run.kept_jobs), then report over RESULTS_DIR: a table run in parts, kept in git",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    given = args.dir
    if given is None:
        given = latest_sweep(Path("outputs/multirun"))
        print(f"report: the latest sweep, {given}", file=sys.stderr)
    target = Path(given)
    if not target.is_dir():
        print(f"error: {given!r} is not a dir: give a run dir or a multirun dir", file=sys.stderr)
        sys.exit(2)
    if not job_dirs(target):
        if args.keep:
            print(
                f"error: --keep takes a multirun dir; {given!r} has no job dirs (<n>_<overrides>/.hydra)",
                file=sys.stderr,
            )
            sys.exit(2)
        if (target / "summary.json").is_file() or (target / "csv" / "metrics.csv").is_file():
            return run_report(target)
        print(
            f"error: {given!r} is neither a run dir (summary.json, csv/metrics.csv) nor a multirun dir (job dirs "
            "<n>_<overrides>/.hydra)",
            file=sys.stderr,
        )
        sys.exit(2)
    if args.keep:
        kept = kept_jobs.keep(job_dirs(target), Path(args.keep), log=lambda line: print(line, file=sys.stderr))
        print(f"report: kept {len(kept)} jobs of {target} in {args.keep}", file=sys.stderr)
        target = Path(args.keep)
    sweep_report(target)


def run_report(run_dir: Path) -> None:
    """curves.png of one run, drawn again from its csv/metrics.csv (a run still going: up to where it is), and its
    status and final held-out metrics as its summary.json has them."""
    path, line = plots.draw_run(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {}
    status = "running" if ownership.holder(run_dir) == "live" else summary.get("status", "not recorded")
    print(f"report: {run_dir}: {status}" + (f": {summary['error']}" if summary.get("error") else ""))
    final = summary.get("final") or {}
    for key, value in final.items():
        if isinstance(value, float) and not key.endswith(("_ci_low", "_ci_high")):
            low, high = final.get(f"{key}_ci_low"), final.get(f"{key}_ci_high")
            interval = f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else ""
            print(f"  {key} {value:.3f}{interval}")
    print(f"report: {line}" + (f" ({path})" if path else ""))
    if path is None:
        sys.exit(1)


def sweep_report(multirun_dir: Path) -> None:
    rows, figures = report(multirun_dir)
    print(markdown(rows))
    print(settings_markdown(by_setting(rows)))
    print(updates_markdown(rows))
    print(all_differences_markdown(rows))
    print(verifiable_markdown(rows))
    for line in failures(rows):
        print(f"report: {line}", file=sys.stderr)
    running = sum(r["status"] == "running" for r in rows)
    print(
        f"report: {sum(r['status'] == 'ok' for r in rows)} of {len(rows)} jobs finished"
        f"{f', {running} running' if running else ''}; wrote report.md, "
        f"report.csv, settings.md, differences.md, updates.md"
        f"{', factorial.md' if (multirun_dir / 'factorial.md').exists() else ''}"
        f"{', verifiable.md' if verifiable_metrics(rows) else ''}"
        f"{', ' + ', '.join(figures) if figures else ''} in {multirun_dir}"
    )


if __name__ == "__main__":
    main()
