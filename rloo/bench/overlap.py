"""python -m rloo.bench async: the synchronous loop against asynchronous training (exact lag N=1, bounded N=2), real
`python -m rloo.train` runs one after another in one invocation on one host.

Two workloads:
- long-160m (random weights at Pythia-160m architecture, 512 new tokens, k=4): both sides compute on the same CPU
  cores, so the synchronous run gets all of them and each asynchronous side gets its share (learner and producer
  one thread each on 2 cores);
- the embedded task's episodes in the toy environment with a latency per step (env=topic_recall
  env.environment.latency_s, as a sandbox or an API grader waits): the producer waits on the environment while the
  learner computes.

Per row: seconds per rollout (the learner's step: its rollout or its wait for one, and its update), each side's busy
seconds per rollout (the learner's: its step less its wait for the producer; the producer's: sampling and scoring),
and the peak resident memory of each process. The first `warmup` rollouts (the producer's start) are left out.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from statistics import mean

ASYNC = ["is_correction=tis_token", "trainer.num_threads=1", "producer_threads=1"]
ROWS = (  # label, workload, overrides
    ("synchronous", "long-160m", ["trainer.num_threads=2"]),
    ("exact lag N=1", "long-160m", ["max_staleness=1", *ASYNC]),
    ("bounded N=2", "long-160m", ["max_staleness=2", "staleness_mode=bounded", *ASYNC]),
    ("synchronous", "episodes", ["trainer.num_threads=2"]),
    ("exact lag N=1", "episodes", ["max_staleness=1", *ASYNC]),
    ("bounded N=2", "episodes", ["max_staleness=2", "staleness_mode=bounded", *ASYNC]),
)
EPISODES = [  # the embedded task's episodes, each environment step waiting latency_s first; each rollout used for
    # 4 epochs x 2 mini-batches (a reused rollout, as PPO-style schedules run), so the learner has work to overlap
    "env=topic_recall",
    "num_ppo_epochs=4",
    "num_mini_batches=2",
    "micro_batch_size=32",
    "reward=env",
    "judge=none",
    "logger=csv",
    "eval.before=false",
    "eval.after=false",
    "checkpoint_every=0",
]


def run(
    out_dir,
    preset_name: str = "long-160m",
    rollouts: int = 4,
    warmup: int = 1,
    latency_s: float = 0.5,
    workloads: tuple[str, ...] = ("long-160m", "episodes"),
) -> dict:
    """Every row of `workloads` in its own `python -m rloo.train`; writes async.json and async.md to `out_dir`."""
    from rloo.bench.presets import get_preset
    from rloo.bench.strategies import host_line, launch, run_settings, write_inputs

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    host = host_line()  # before the runs, with nothing else running
    preset = get_preset(preset_name)
    paths = write_inputs(preset_name, out / "inputs")
    shared = {
        preset_name: [s for s in run_settings(preset, paths, rollouts, 1) if not s.startswith("trainer.num_threads")],
        "episodes": [*EPISODES, f"env.environment.latency_s={latency_s}", f"total_episodes={64 * rollouts}"],
    }
    results = []
    for label, workload, overrides in [row for row in ROWS if row[1] in workloads]:
        workload = preset_name if workload == "long-160m" else workload
        run_dir = out / f"run-{workload}-{label.replace(' ', '-').replace('=', '')}"
        launch([*shared[workload], *overrides, f"hydra.run.dir={run_dir}"], 1, f"{workload}, {label}")
        results.append({"workload": workload, "run": label, **measured(run_dir, warmup)})
    report = {"preset": preset_name, "latency_s": latency_s, "rollouts": rollouts, "warmup": warmup, "host": host}
    report["results"] = results
    (out / "async.json").write_text(json.dumps(report, indent=2))
    (out / "async.md").write_text(markdown(report))
    print(markdown(report))
    return report


def measured(run_dir: Path, warmup: int) -> dict:
    """A run's seconds per rollout, each side's busy seconds per rollout and peak memory, after `warmup` rollouts."""
    rows = [r for r in csv.DictReader((run_dir / "csv" / "metrics.csv").open()) if r.get("time/update")]
    rows = rows[warmup:]

    def per_rollout(name: str) -> float:
        return mean(float(r[name] or 0.0) for r in rows)

    step = mean(float(r["time/rollout"]) + float(r["time/update"]) for r in rows)
    produced = bool(rows[0].get("async/producer_busy_s"))
    wait = per_rollout("async/learner_wait_s") if produced else 0.0
    return {
        "rollouts_timed": len(rows),
        "seconds_per_rollout": step,
        "learner_busy_s": step - wait,
        "producer_busy_s": per_rollout("async/producer_busy_s") if produced else None,
        "learner_wait_s": wait,
        "staleness_mean": per_rollout("async/staleness_mean") if produced else 0.0,
        "learner_peak_rss_mb": max(float(r["memory/peak_rss_mb"]) for r in rows),
        "producer_peak_rss_mb": max(float(r["memory/producer_peak_rss_mb"]) for r in rows) if produced else None,
    }


def markdown(report: dict) -> str:
    """The table: each row beside its workload's synchronous run, and beside its own busier side."""
    lines = [
        f"{report['host']}. `python -m rloo.bench async`: {report['rollouts']} rollouts per run, the first "
        f"{report['warmup']} left out; episodes: the embedded task in env=topic_recall, {report['latency_s']} s per "
        "environment step, each rollout used for 4 epochs x 2 mini-batches. Asynchronous runs: learner and producer "
        "one thread each, is_correction=tis_token; "
        "synchronous runs: one process, two threads.",
        "",
        "| workload | run | s per rollout | vs synchronous | learner busy s | producer busy s | vs busier side | "
        "learner wait s | staleness | learner peak MiB | producer peak MiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        sync = next(s for s in report["results"] if s["workload"] == r["workload"] and s["run"] == "synchronous")
        busier = max(r["learner_busy_s"], r["producer_busy_s"] or 0.0)
        producer = "-" if r["producer_busy_s"] is None else f"{r['producer_busy_s']:.2f}"
        producer_mb = "-" if r["producer_peak_rss_mb"] is None else f"{r['producer_peak_rss_mb']:,.0f}"
        lines.append(
            f"| {r['workload']} | {r['run']} | {r['seconds_per_rollout']:.2f} | "
            f"{r['seconds_per_rollout'] / sync['seconds_per_rollout']:.2f} | {r['learner_busy_s']:.2f} | {producer} | "
            f"{r['seconds_per_rollout'] / busier:.2f} | {r['learner_wait_s']:.2f} | {r['staleness_mean']:.2f} | "
            f"{r['learner_peak_rss_mb']:,.0f} | {producer_mb} |"
        )
    return "\n".join(lines) + "\n"
