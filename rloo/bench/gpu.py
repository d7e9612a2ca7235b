"""python -m rloo.bench gpu: the GPU check, one command, for the first machine with an accelerator.

    python -m rloo.bench gpu --device cuda      # Pythia-1B- and Llama-1B-sized random models, bf16, on the GPU
    python -m rloo.bench gpu                    # the same check at a reduced size on CPU (what CI runs)

For each model: one real training step after a warm-up (rloo.bench.worker, bf16-true, a fresh interpreter each),
giving decode tokens per second, step time and peak memory, and rloo.run.memory_plan's planned peak for the same shape
beside the measured one (GPU: torch.cuda.max_memory_allocated; CPU: peak RSS above the post-import baseline); the
decode alone (rloo.bench.decode): ms per token of the eager loop and of the CUDA-graph loop beside the read floor
(the bytes a step reads over torch.sum's read rate on the same device); and TRL's RLOOTrainer at the same shape
and dtype, where the interpreter (or --trl-python) has TRL. Then the bf16 mismatch diagnostics on the embedded task
(rloo.bench.stability's embedded cells in bf16: peer-like settings against rloo's defaults). Writes gpu.json and
gpu.md into the output dir.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from rloo.bench.presets import get_preset, model_config
from rloo.generation.forward import packing_pays

MODELS = {"cuda": ("tldr-1b", "pythia-1b", "llama-1b"), "cpu": ("small", "llama-small")}
ROOT = Path(__file__).resolve().parents[2]


def planned_peak_mib(preset_name: str, precision: str) -> float:
    """rloo.run.memory_plan's peak for one worker step of the preset: every completion in one micro-batch."""
    import torch
    from transformers import AutoModelForCausalLM

    from rloo.families import architecture_from_config
    from rloo.run.memory_plan import Shape, estimate

    preset = get_preset(preset_name)
    config = model_config(preset)
    with torch.device("meta"):
        empty = AutoModelForCausalLM.from_config(config)
    packs = packing_pays(empty, preset.prompt_length, preset.response_length, preset.k)
    frozen = "float32" if precision == "32-true" else "bfloat16"
    n = preset.completions_per_step
    shape = Shape(
        precision,
        frozen,
        "auto",
        1,
        False,
        16,
        (),
        True,
        True,
        preset.k,
        n,
        n,
        preset.prompt_length,
        preset.response_length,
        shared_prefix=packs,
    )
    return estimate(architecture_from_config(config.to_dict()), shape)["peak"]


def model_row(
    out_dir: Path, preset_name: str, device: str, steps: int, warmup: int, threads: int, timeout: int
) -> dict:
    precision = "bf16-true"
    result_path = out_dir / f"{preset_name}.json"
    command = [sys.executable, "-m", "rloo.bench.worker", "--algorithm", "rloo", "--preset", preset_name]
    command += ["--steps", str(steps), "--warmup", str(warmup), "--threads", str(threads), "--device", device]
    command += ["--precision", precision, "--out", str(result_path)]
    proc, last = _subprocess_row(command, out_dir / f"{preset_name}.log", timeout)
    row = {"model": preset_name, "device": device, "precision": precision}
    if proc is None or proc.returncode != 0:
        return row | {"error": last}
    result = json.loads(result_path.read_text())
    preset = get_preset(preset_name)
    measured = result["peak_gpu_mb"] if device == "cuda" else result["peak_rss_above_baseline_mb"]
    planned = planned_peak_mib(preset_name, precision)
    generate = result["phase_seconds_median"]["generate"]
    return row | {
        "family": preset.family,
        "completions": preset.completions_per_step,
        "response_length": preset.response_length,
        "decode_tokens_per_second": preset.completions_per_step * preset.response_length / generate,
        "step_seconds": result["step_seconds_median"],
        "rollout_seconds": result["rollout_seconds_median"],
        "update_seconds": result["update_seconds_median"],
        "measured_peak_mib": measured,
        "measured_as": "torch.cuda.max_memory_allocated" if device == "cuda" else "peak RSS above baseline",
        "planned_peak_mib": planned,
        "planned_over_measured": planned / measured if measured else None,
    }


def _subprocess_row(command: list[str], log: Path, timeout: int) -> tuple[subprocess.CompletedProcess | None, str]:
    """Run one row's worker from the repo root, its output kept in `log`: the process (None if it timed out) and
    its last line of output, which names the error where it failed."""
    print(f"bench gpu: {' '.join(command[1:])}", flush=True)
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    log.write_text(proc.stdout + proc.stderr)
    return proc, ((proc.stderr or proc.stdout).strip().splitlines() or ["no output"])[-1]


def decode_row(out_dir: Path, preset_name: str, device: str, threads: int, timeout: int) -> dict:
    """rloo.bench.decode at the preset's shape on `device`, without the op profile: eager and graph ms per token,
    the read floor."""
    code = (
        "import json; from rloo.bench.decode import measure; "
        f"print(json.dumps(measure({preset_name!r}, {device!r}, {threads}, profile=False)))"
    )
    proc, last = _subprocess_row([sys.executable, "-c", code], out_dir / f"{preset_name}-decode.log", timeout)
    if proc is None or proc.returncode != 0:
        return {"error": last}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    graph = result["graph"]
    return {
        "decode_ms_per_token": result["ms_per_token"],
        "graph_ms_per_token": graph.get("ms_per_token"),
        "graph_why_not": graph.get("why_not"),
        "read_floor_ms": result["read_floor_ms"],
        "sum_gb_per_s": result["sum_gb_per_s"],
        "decode_rows": result["rows"],
    }


def trl_row(out_dir: Path, preset_name: str, device: str, steps: int, warmup: int, threads: int, timeout: int, python):
    """TRL's RLOOTrainer (rloo.bench.peers) at the preset's shape in bfloat16 on `device`: its step time and peak."""
    from rloo.bench.peers import trl_version

    if (version := trl_version(python)) is None:
        return {"error": f"no TRL for {python} (pip install trl, or --trl-python)"}
    path = out_dir / f"{preset_name}-trl.json"
    command = [python, "-m", "rloo.bench.peers", "--algorithm", "rloo", "--preset", preset_name, "--device", device]
    command += ["--steps", str(steps), "--warmup", str(warmup), "--threads", str(threads), "--precision", "bf16-true"]
    proc, last = _subprocess_row([*command, "--out", str(path)], out_dir / f"{preset_name}-trl.log", timeout)
    if proc is None or proc.returncode != 0:
        return {"error": last}
    result = json.loads(path.read_text())
    memory = result["peak_gpu_mb"] if device == "cuda" else result["peak_rss_above_baseline_mb"]
    return {"trl": version, "step_seconds": result["step_seconds_median"], "peak_mib": memory}


def run(
    out_dir: Path,
    device: str,
    steps: int,
    warmup: int,
    threads: int,
    timeout: int,
    mismatch: bool = True,
    overrides: list[str] = (),
    trl_python: str | None = None,
) -> dict:
    """The model rows (rloo's step, its decode, TRL's step), then the embedded task's bf16 mismatch cells
    (`overrides` added to their rloo.train runs)."""
    from rloo.bench import stability

    report: dict = {"models": [], "decode": [], "trl": [], "mismatch": []}

    def keep(row: dict, into: str) -> None:  # each finished row is on disk at once: a killed check keeps them
        report[into].append(row)
        (out_dir / "gpu.json").write_text(json.dumps(report | {"partial": True}, indent=2))

    for name in MODELS[device]:
        keep(model_row(out_dir, name, device, steps, warmup, threads, timeout), "models")
        keep({"model": name} | decode_row(out_dir, name, device, threads, timeout), "decode")
        python = trl_python or sys.executable
        keep({"model": name} | trl_row(out_dir, name, device, steps, warmup, threads, timeout, python), "trl")
    accelerator = ["trainer.accelerator=gpu", "trainer.devices=1"] if device == "cuda" else []
    for config in stability.CONFIGS if mismatch else ():
        keep(stability.embedded_cell(out_dir, "bf16", config, [*accelerator, *overrides], timeout), "mismatch")
    return report


def markdown(report: dict) -> str:
    lines = [
        "| model | device | decode tok/s | step s | rollout s | update s | peak MiB measured | planned "
        "| planned/measured |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["models"]:
        if "error" in row:
            lines.append(f"| {row['model']} | {row['device']} | failed: {row['error']} | | | | | | |")
            continue
        lines.append(
            f"| {row['model']} | {row['device']} | {row['decode_tokens_per_second']:.0f} | {row['step_seconds']:.2f} "
            f"| {row['rollout_seconds']:.2f} | {row['update_seconds']:.2f} | {row['measured_peak_mib']:.0f} "
            f"| {row['planned_peak_mib']:.0f} | {row['planned_over_measured']:.2f} |"
        )
    if report.get("decode"):
        lines += ["", decode_markdown(report)]
    if report.get("mismatch"):
        from rloo.bench import stability

        lines += ["", "bf16 mismatch on the embedded task:", "", stability.markdown({"cells": report["mismatch"]})]
    return "\n".join(lines) + "\n"


def decode_markdown(report: dict) -> str:
    """The decode beside its read floor, and rloo's step beside TRL's, per model."""
    steps = {row["model"]: row for row in report["models"]}
    trl = {row["model"]: row for row in report.get("trl", [])}
    lines = [
        "| model | decode ms/token, eager | CUDA graph | read floor ms | rloo step s | TRL step s | rloo/TRL "
        "| rloo / TRL peak MiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["decode"]:
        name = row["model"]
        if "error" in row:
            lines.append(f"| {name} | failed: {row['error']} | | | | | | |")
            continue
        graph = row["graph_ms_per_token"]
        graph_cell = f"{graph:.2f}" if graph is not None else f"not used: {row['graph_why_not']}"
        ours, theirs = steps.get(name, {}), trl.get(name, {"error": "not run"})
        step = f"{ours['step_seconds']:.2f}" if "step_seconds" in ours else "failed"
        if "error" in theirs:
            their_cells = f"{theirs['error']} | | "
        elif "step_seconds" not in ours:
            their_cells = f"{theirs['step_seconds']:.2f} | | "
        else:
            ratio = ours["step_seconds"] / theirs["step_seconds"]
            memory = f"{ours['measured_peak_mib']:.0f} / {theirs['peak_mib']:.0f}"
            their_cells = f"{theirs['step_seconds']:.2f} | {ratio:.2f} | {memory}"
        lines.append(
            f"| {name} | {row['decode_ms_per_token']:.2f} | {graph_cell} | {row['read_floor_ms']:.2f} | {step} "
            f"| {their_cells} |"
        )
    return "\n".join(lines)
