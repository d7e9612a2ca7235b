"""`python -m rloo.bench stability`: does bf16 null the batch? The peer-like configuration against rloo's
defaults, in fp32 and bf16, same seeds.

    peer-like     old log-probs from the sampler, bf16 logits, sequence PPO-clip 0.2, two epochs per rollout
                  (the peer's 2024 RLOO trainer)
    rloo default  old log-probs recomputed by the training forward, fp32 LM head, one on-policy update

On the embedded task each cell is a real `python -m rloo.train` run (so it ends with an oracle win rate); on
a random-weight Pythia architecture each is a benchmark worker (mismatch and clipping only: random weights
have no win rate). Reported per cell: the nulled-sequence fraction (policy/clipfrac_avg, over every update),
the token-level clip fraction on the same ratios, the mismatch statistics, step time and the win rate.
"""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CONFIGS = {
    "peer-like": [
        "old_logprobs=generation",
        "fp32_lm_head=false",
        "num_ppo_epochs=2",
        "clip_range=0.2",
        "loss=ppo_clip",
    ],
    "rloo default": [],
}
PRECISIONS = {"fp32": "32-true", "bf16": "bf16-mixed", "bf16-true": "bf16-true"}  # train.yaml name -> Lightning


def _mean(values):
    return statistics.fmean(values) if values else None


def summarise(per_step: list[dict[str, float]]) -> dict:
    """Step metrics -> the cell's figures (means over steps; extremes over steps for the ranges)."""

    def series(key):
        return [m[key] for m in per_step if m.get(key) is not None]

    step_seconds = [
        m["time/rollout"] + m["time/update"] for m in per_step if "time/rollout" in m and "time/update" in m
    ]
    return {
        "nulled_fraction": _mean(series("policy/clipfrac_avg")),
        "nulled_fraction_first_epoch": _mean(series("policy/clipfrac_first_epoch")),
        "token_clip_fraction": _mean(series("policy/token_clipfrac_avg")),
        "logprob_abs_mean": _mean(series("mismatch/logprob_abs_mean")),
        "logprob_abs_max": max(series("mismatch/logprob_abs_max"), default=None),
        "token_mult_prob_error": _mean(series("mismatch/token_mult_prob_error")),
        "seq_log_ratio_min": min(series("mismatch/seq_log_ratio_min"), default=None),
        "seq_log_ratio_max": max(series("mismatch/seq_log_ratio_max"), default=None),
        "ratio_min": min(series("policy/ratio_min"), default=None),
        "ratio_max": max(series("policy/ratio_max"), default=None),
        "step_seconds": statistics.median(step_seconds) if step_seconds else None,
        "steps": len(per_step),
    }


def read_metrics_csv(path: Path) -> list[dict[str, float]]:
    steps = []
    for row in csv.DictReader(path.open()):
        values = {k: float(v) for k, v in row.items() if v not in ("", None)}
        if "objective/scores" in values:  # a training step's row (eval rows hold eval/* only)
            steps.append(values)
    return steps


def _env() -> dict:
    return {
        **os.environ,
        "WANDB_MODE": os.environ.get("WANDB_MODE", "offline"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def embedded_cell(out_dir: Path, precision: str, config: str, extra: list[str], timeout: int) -> dict:
    run_dir = out_dir / f"embedded-{precision}-{config.replace(' ', '-')}"
    overrides = [f"precision={precision}", *CONFIGS[config], "eval_every=0", "logger=csv", *extra]
    print(f"bench stability: python -m rloo.train {' '.join(overrides)}", flush=True)
    proc = subprocess.run(
        [sys.executable, "-m", "rloo.train", f"hydra.run.dir={run_dir}", *overrides],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    (out_dir / f"{run_dir.name}.log").write_text(proc.stdout + proc.stderr)
    cell = {"model": "embedded (tiny, trained)", "precision": precision, "config": config, "overrides": overrides}
    if proc.returncode != 0:
        return cell | {"error": ((proc.stderr or proc.stdout).strip().splitlines() or ["no output"])[-1]}
    summary = json.loads((run_dir / "summary.json").read_text())
    final = summary["final"]
    return (
        cell
        | summarise(read_metrics_csv(run_dir / "csv" / "metrics.csv"))
        | {
            "win_rate": final["eval/win_rate"],
            "win_rate_ci_low": final["eval/win_rate_ci_low"],
            "win_rate_ci_high": final["eval/win_rate_ci_high"],
            "run_dir": str(run_dir),
        }
    )


def architecture_cell(
    out_dir: Path, preset: str, precision: str, config: str, steps: int, warmup: int, threads: int, timeout: int
) -> dict:
    result_path = out_dir / f"{preset}-{precision}-{config.replace(' ', '-')}.json"
    settings = [arg for pair in CONFIGS[config] for arg in ("--set", pair)]
    command = [
        sys.executable,
        "-m",
        "rloo.bench.worker",
        "--algorithm",
        "rloo",
        "--preset",
        preset,
        "--precision",
        PRECISIONS[precision],
        "--steps",
        str(steps),
        "--warmup",
        str(warmup),
        "--threads",
        str(threads),
        *settings,
        "--out",
        str(result_path),
    ]
    print(f"bench stability: {preset} {precision} {config}", flush=True)
    proc = subprocess.run(command, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    cell = {"model": f"{preset} (random weights)", "precision": precision, "config": config}
    if proc.returncode != 0 or not result_path.exists():
        return cell | {"error": ((proc.stderr or proc.stdout).strip().splitlines() or ["no output"])[-1]}
    result = json.loads(result_path.read_text())
    per_step = [
        result["metrics_mean"]
        | {"time/rollout": result["rollout_seconds_median"], "time/update": result["update_seconds_median"]}
    ]
    figures = summarise(per_step)
    # the worker reports means over steps; its extremes are means of per-step extremes
    return cell | figures | {"steps": result["steps"], "step_seconds": result["step_seconds_median"], "win_rate": None}


def run_stability(
    out_dir: Path,
    presets: list[str],
    precisions: list[str],
    steps: int,
    warmup: int,
    threads: int,
    extra: list[str],
    timeout: int,
) -> dict:
    cells = []
    for precision in precisions:
        for config in CONFIGS:
            cells.append(embedded_cell(out_dir, precision, config, extra, timeout))
    for preset in presets:
        for precision in precisions:
            for config in CONFIGS:
                cells.append(architecture_cell(out_dir, preset, precision, config, steps, warmup, threads, timeout))
    return {"configs": CONFIGS, "cells": cells}


def _pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value, digits=4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def markdown(report: dict) -> str:
    lines = [
        "| model | precision | config | nulled seqs | nulled, 1st epoch | token clip | mean abs dlogp | max abs dlogp "
        "| mult. error "
        "| seq log-ratio range | s/step | win rate [95% CI] |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["cells"]:
        if "error" in c:
            lines.append(f"| {c['model']} | {c['precision']} | {c['config']} | failed: {c['error']} | | | | | | | | |")
            continue
        win = (
            "-"
            if c.get("win_rate") is None
            else f"{c['win_rate']:.3f} [{c['win_rate_ci_low']:.3f}, {c['win_rate_ci_high']:.3f}]"
        )
        lines.append(
            f"| {c['model']} | {c['precision']} | {c['config']} | {_pct(c['nulled_fraction'])} "
            f"| {_pct(c['nulled_fraction_first_epoch'])} | {_pct(c['token_clip_fraction'])} "
            f"| {_num(c['logprob_abs_mean'])} | {_num(c['logprob_abs_max'])} "
            f"| {_num(c['token_mult_prob_error'], 5)} "
            f"| [{_num(c['seq_log_ratio_min'], 3)}, {_num(c['seq_log_ratio_max'], 3)}] "
            f"| {_num(c['step_seconds'], 3)} | {win} |"
        )
    reductions = head_reductions(report["cells"])
    if reductions:
        lines += [
            "",
            "What the fp32 LM head removes (mean abs dlogp, peer-like / rloo default; depends on the machine's bf16 "
            "kernels):",
            "",
        ]
        lines += [f"- {model}, {precision}: {factor:.1f}x" for (model, precision), factor in reductions.items()]
    return "\n".join(lines) + "\n"


def head_reductions(cells: list[dict]) -> dict[tuple[str, str], float]:
    """Per (model, 16-bit precision): the peer-like cell's mean abs dlogp over the default's. Both measure the
    same training forward against the sampler; the peer-like one runs the LM head in bf16, the default in fp32."""
    by_cell = {(c["model"], c["precision"], c["config"]): c for c in cells if "error" not in c}
    factors = {}
    for (model, precision, config), cell in by_cell.items():
        default = by_cell.get((model, precision, "rloo default"))
        if config == "peer-like" and precision != "fp32" and default and default["logprob_abs_mean"]:
            factors[(model, precision)] = cell["logprob_abs_mean"] / default["logprob_abs_mean"]
    return factors
