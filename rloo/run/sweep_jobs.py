"""A sweep's job dirs read into rows, one per job, as rloo.report tabulates them.

A job dir (`<n>_<overrides>/`, or a kept job's `<overrides>/`: rloo.run.kept_jobs) holds .hydra/overrides.yaml,
.hydra/config.yaml, summary.json and csv/metrics.csv. A job whose process still holds its run dir
(rloo.utils.ownership) is running; one with no summary.json failed (killed, where its holder died without a word);
one whose summary.json says it did not finish is reported by its status (interrupted, failed, evaluating), each with
the one-line error its run dir keeps.
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import yaml

from rloo.run import kept_jobs
from rloo.utils import ownership
from rloo.utils.host import describe

TAIL_STEPS = 10  # train metrics are averaged over the last steps: one step is noisy
# and pass@<k>, reward/<name>: what a held-out evaluation scored per row; of episodes (env=), the fraction the
# environment replied in (a tool call), the turns taken and the fraction cut off by the token limit
OUTCOMES = ("accuracy", "majority_vote", "replied", "turns", "truncated")


def outcomes_of(final: dict) -> dict[str, float]:
    """The verifiable outcomes of a final evaluation (without their intervals): accuracy, pass@k, majority_vote,
    reward/<name>."""
    return {
        key.removeprefix("eval/"): value
        for key, value in final.items()
        if key.removeprefix("eval/").startswith(("pass@", "reward/", *OUTCOMES))
        and not key.endswith(("_ci_low", "_ci_high", "_failed"))
        and value is not None
    }


def job_dirs(multirun_dir: Path) -> list[Path]:
    """Job dirs in job-number order: every subdir Hydra gave a .hydra/ (it writes it before the job runs), in a dir
    Hydra wrote a multirun.yaml into or under a name that starts with its job number (`<n>_<overrides>`): the
    parent of single runs is no sweep. A results dir of kept jobs (rloo.run.kept_jobs) is a sweep dir too."""
    sweep = (multirun_dir / "multirun.yaml").is_file() or kept_jobs.is_kept(multirun_dir)
    dirs = [
        d
        for d in multirun_dir.iterdir()
        if d.is_dir() and (d / ".hydra").is_dir() and (sweep or d.name.split("_")[0].isdigit())
    ]
    return sorted(
        dirs, key=lambda d: (int(d.name.split("_")[0]) if d.name.split("_")[0].isdigit() else 1 << 30, d.name)
    )


# what a reused rollout's updates did, averaged over every step of a run (updates.md)
UPDATE_METRICS = {
    "clipfrac_run": "policy/clipfrac_avg",
    "token_clipfrac_run": "policy/token_clipfrac_avg",
    "approxkl_run": "policy/approxkl_avg",
    "ratio_min_run": "policy/ratio_min",
    "ratio_max_run": "policy/ratio_max",
}


def tail_mean(rows: list[dict], key: str, steps: int | None = TAIL_STEPS) -> float | None:
    """The mean of `key` over the last `steps` logged rows that have it (None: over every one)."""
    values = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return statistics.fmean(values[-steps:] if steps else values) if values else None


def log_error(job: Path) -> str | None:
    """The one-line error a failed job's train.log ends with (`error: ...`), where it has one."""
    try:
        lines = (job / "train.log").read_text(errors="replace").splitlines()
    except OSError:
        return None
    errors = [line.split("error: ", 1)[1] for line in lines if "error: " in line]
    return errors[-1] if errors else None


def job_row(job: Path) -> dict:
    overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text()) or []
    config = yaml.safe_load((job / ".hydra" / "config.yaml").read_text()) or {}
    row = {
        "job": job.name,
        "overrides": " ".join(overrides),
        "algorithm": config.get("algorithm"),
        "seed": config.get("seed"),
        "k": config.get("k"),
        "clip_range": config.get("clip_range"),
        "kl_coef": config.get("kl_coef"),
        "budget": config.get("budget", "trained"),
        "setting": [o for o in overrides if not o.startswith("seed=")],
    }
    summary_path = job / "summary.json"
    holder = ownership.holder(job)
    if holder == "live":  # its process holds the run dir's lock: still at work
        return row | {"status": "running"}
    if not summary_path.exists():
        return row | {"status": "killed" if holder == "killed" else "failed", "error": log_error(job)}
    summary = json.loads(summary_path.read_text())
    if summary.get("status", "finished") != "finished":  # interrupted, failed, or still evaluating when it died
        status = "killed" if summary["status"] == "evaluating" and holder == "killed" else summary["status"]
        return row | {"status": status, "wall_seconds": summary.get("wall_seconds"), "error": summary.get("error")}
    final = summary.get("final") or {}
    metrics_path = job / "csv" / "metrics.csv"
    rows = list(csv.DictReader(metrics_path.open())) if metrics_path.exists() else []
    history = summary.get("eval_history") or []
    train_seconds = summary.get("train_seconds", history[-1].get("train_seconds") if history else None)
    return row | {
        "status": "ok",
        "win_rate": final.get("eval/win_rate"),
        "win_rate_ci_low": final.get("eval/win_rate_ci_low"),
        "win_rate_ci_high": final.get("eval/win_rate_ci_high"),
        "score": final.get("eval/score"),
        "episodes": summary.get("episodes"),
        "train_seconds": train_seconds,
        "reward": tail_mean(rows, "objective/rlhf_reward"),
        "kl": tail_mean(rows, "objective/kl"),
        "clipfrac": tail_mean(rows, "policy/clipfrac_avg"),
        **{name: tail_mean(rows, key, steps=None) for name, key in UPDATE_METRICS.items()},
        "sampled_per_trained": summary["sampled"] / summary["episodes"] if summary.get("sampled") else None,
        "host": describe(summary["host"]) if summary.get("host") else "not recorded",
        "wall_seconds": summary.get("wall_seconds"),
        "peak_rss_mb": summary.get("peak_rss_mb"),
        "peak_gpu_mb": summary.get("peak_gpu_mb"),
        "history": history,
        "outcomes": outcomes_of(final),
    }
