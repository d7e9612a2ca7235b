"""`python -m rloo.bench quality`: RLOO and PPO on the embedded task at equal wall-clock time, oracle win rate.

RLOO runs its default schedule first; PPO then gets exactly RLOO's `trainer.fit` seconds (Lightning's
`max_time`), with its own defaults (one completion per prompt, 4 epochs) and the same total_episodes budget,
so it stops where the clock says. Both evaluate before and after only (eval_every=0), on the same prompts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def train(run_dir: Path, overrides: list[str], timeout: int) -> dict:
    env = {**os.environ, "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "rloo.train", f"hydra.run.dir={run_dir}", "eval_every=0", "logger=csv", *overrides]
    print("bench quality: " + " ".join(command[1:]), flush=True)
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    (run_dir.parent / f"{run_dir.name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"python -m rloo.train {' '.join(overrides)} failed: {tail[0]}")
    return json.loads((run_dir / "summary.json").read_text())


def row(name: str, summary: dict) -> dict:
    final, initial = summary["final"], summary["initial"]
    return {
        "run": name,
        "rollouts": summary["rollouts"],
        "episodes": summary["episodes"],
        "fit_seconds": summary["fit_seconds"],
        "initial_win_rate": initial["eval/win_rate"],
        "final_win_rate": final["eval/win_rate"],
        "ci_low": final["eval/win_rate_ci_low"],
        "ci_high": final["eval/win_rate_ci_high"],
        "final_score": final["eval/score"],
        "output_dir": summary["output_dir"],
    }


def run_quality(out_dir: Path, extra: list[str], timeout: int) -> dict:
    rloo = train(out_dir / "rloo", ["algo=rloo", *extra], timeout)
    budget = rloo["fit_seconds"]
    ppo = train(out_dir / "ppo", ["algo=ppo", f"+trainer.max_time={{seconds:{budget:.2f}}}", *extra], timeout)
    rows = [row("RLOO (defaults)", rloo), row(f"PPO, same wall clock ({budget:.0f} s)", ppo)]
    return {"budget_seconds": budget, "overrides": extra, "rows": rows}


def markdown(report: dict) -> str:
    lines = [
        "| run | rollouts | episodes | fit s | win rate before | win rate after [95% CI] | score after |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['run']} | {r['rollouts']} | {r['episodes']} | {r['fit_seconds']:.0f} | {r['initial_win_rate']:.3f} "
            f"| {r['final_win_rate']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {r['final_score']:.2f} |"
        )
    return "\n".join(lines) + "\n"
