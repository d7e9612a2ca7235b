"""python -m rloo.bench: RLOO vs PPO (and vs TRL's trainers when installed), side by side, one process each.

    python -m rloo.bench                                   # presets tiny, small, pythia-160m on CPU
    python -m rloo.bench --presets small --steps 3         # one preset, fewer steps
    python -m rloo.bench --presets pythia-1b --device cuda --precision bf16-true
    python -m rloo.bench logprobs                          # the log-prob pass: whole vs chunked LM head
    python -m rloo.bench strategies --presets pythia-160m  # memory per rank: one process, ddp, fsdp2 (CPU)

Writes <out>/results.json and <out>/results.md (default out: outputs/bench/<date>/<time>) and prints the table.
Every configuration runs in a fresh interpreter, so one's memory never counts against another's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from rloo.bench.presets import GRPO_FAMILY, PRESETS, get_preset
from rloo.run.cli import OneLineParser
from rloo.utils import ownership
from rloo.utils.errors import ConfigError

DEFAULT_PRESETS = ("tiny", "small", "pythia-160m")
MODE_PRESETS = {
    "stability": "pythia-160m",
    "strategies": "pythia-160m",
    "decode": "long-160m",
    "async": "long-160m",
}  # their own defaults


def parse_args(argv=None) -> argparse.Namespace:
    parser = OneLineParser(prog="python -m rloo.bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "mode",
        nargs="?",
        default="speed",
        choices=("speed", "quality", "stability", "logprobs", "strategies", "gpu", "decode", "episodes", "async"),
        help="speed: time and memory per step; quality: RLOO vs PPO win rate at equal wall clock; "
        "stability: the bf16 mismatch, peer-like vs rloo defaults; logprobs: peak memory of the "
        "log-prob pass, whole vs chunked LM head, at a 50k vocabulary; strategies: peak memory per rank and "
        "time of real rloo.train runs in one process, under ddp and under fsdp2; gpu: the GPU check (decode "
        "tokens/s, step time, planned vs measured memory at 1B-sized Pythia and Llama in bf16, the embedded task's "
        "bf16 mismatch; reduced sizes on CPU); decode: the lean decode's ms per token and read rate against "
        "torch.sum's, and its per-op profile (default preset long-160m); episodes: rloo's episode rollout against TRL "
        "1.16's GRPOTrainer with environment_factory on the calculator task (SmolLM2-135M, --trl-python); async: the "
        "synchronous loop against exact lag N=1 and bounded N=2 (default preset long-160m, and the embedded task's "
        "episodes with --latency seconds per environment step): seconds per rollout, each side's busy seconds, memory",
    )
    parser.add_argument(
        "overrides",
        nargs="*",
        help="quality, stability, gpu, strategies: extra `python -m rloo.train` overrides for every run on the "
        "embedded task; speed: train.yaml keys for every rloo worker (as its --set)",
    )
    parser.add_argument(
        "--presets",
        default=None,
        help=f"comma-separated, from: {', '.join(PRESETS)} (default: {','.join(DEFAULT_PRESETS)}; "
        + "; ".join(f"{mode}: {preset}" for mode, preset in MODE_PRESETS.items())
        + ")",
    )
    parser.add_argument(
        "--precisions", default="fp32,bf16", help="stability: comma-separated, from fp32, bf16, bf16-true"
    )
    parser.add_argument(
        "--latency", type=float, default=0.5, help="async: seconds each environment step waits in the episode rows"
    )
    parser.add_argument("--workloads", default="long-160m,episodes", help="async: long-160m, episodes, or both")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per configuration, after the warm-up")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    parser.add_argument(
        "--ppo-epochs", default="4", help="comma-separated PPO epochs to run (TRL's default: 4), or none"
    )
    parser.add_argument(
        "--grpo",
        default="none",
        help="comma-separated from grpo, dr_grpo, dapo, or none: also time rloo's algo=<name> against TRL's "
        "GRPOTrainer at loss_type=<name> (the same models, prompts, k = num_generations, lengths), where TRL is found",
    )
    parser.add_argument(
        "--rloo-schedule",
        default="1x1",
        help="RLOO epochs x mini-batches per rollout, for rloo and TRL alike (the published recipe: 2x2)",
    )
    parser.add_argument("--precision", default="32-true", help="Lightning precision of our runs (TRL runs fp32 on CPU)")
    parser.add_argument(
        "--rollout-precision",
        choices=("same", "bf16"),
        default="same",
        help="speed and decode: rloo's rollout at the training precision, or from bfloat16 copies of the weights "
        "(rollout_precision=bf16; TRL's rows are unchanged)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads in every configuration")
    parser.add_argument(
        "--peers",
        choices=("auto", "none"),
        default="auto",
        help="auto: also run TRL's trainers where an interpreter with TRL is found",
    )
    parser.add_argument(
        "--trl-python",
        default=os.environ.get("RLOO_BENCH_TRL_PYTHON"),
        help="interpreter with TRL (>= 1.16) for RLOOTrainer (default: this one, if it has TRL)",
    )
    parser.add_argument(
        "--trl-lm-head",
        choices=("compact", "as-shipped"),
        default="compact",
        help="TRL RLOO's LM head on CPU: compact (completion positions only, as TRL runs on a GPU) or "
        "as-shipped (its CPU fallback scores every position, prompts included)",
    )
    parser.add_argument(
        "--trl-ppo-python",
        default=os.environ.get("RLOO_BENCH_TRL_PPO_PYTHON"),
        help="interpreter with a TRL that still has PPOTrainer (1.12) (default: this one, if it has it)",
    )
    parser.add_argument("--out", default=None, help="output dir (default: outputs/bench/<date>/<time>)")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per configuration")
    for flag, key, what in (
        ("--prompt-length", "P", "tokens per prompt"),
        ("--response-length", "T", "new tokens per completion"),
        ("--k", "k", "completions per prompt"),
    ):
        parser.add_argument(
            flag,
            default=None,
            help=f"{what}, comma-separated: every preset runs at each (their product), for rloo and TRL alike; "
            f"the same as naming a preset with a shape, e.g. small@{key}=128",
        )
    args = parser.parse_intermixed_args(argv)
    if args.presets is None:
        args.presets = MODE_PRESETS.get(args.mode, ",".join(DEFAULT_PRESETS))
    for precision in args.precisions.split(","):
        if precision not in ("fp32", "bf16", "bf16-true"):
            parser.error(f"--precisions: {precision!r} is not one of fp32, bf16, bf16-true")
    args.presets = ",".join(reshaped(args.presets.split(","), args, parser))
    for name in args.presets.split(","):
        try:
            preset = get_preset(name)
        except ValueError as error:
            parser.error(f"--presets: {error}")
        if preset.needs_gpu and args.device != "cuda":
            parser.error(f"--presets: {name!r} is sized for a GPU; add --device cuda or choose a CPU preset")
    if args.overrides and args.mode in ("decode", "logprobs"):
        parser.error(f"overrides {' '.join(args.overrides)!r}: the {args.mode} mode runs no training and reads none")
    if args.rollout_precision != "same" and args.mode not in ("speed", "decode"):
        parser.error(f"--rollout-precision: the {args.mode} mode does not read it (speed and decode do)")
    args.grpo = [] if args.grpo == "none" else args.grpo.split(",")
    if unknown := [name for name in args.grpo if name not in GRPO_FAMILY]:
        parser.error(f"--grpo: {unknown[0]!r} is not one of {', '.join(GRPO_FAMILY)}, or none")
    try:
        args.ppo_epochs = [] if args.ppo_epochs == "none" else [int(e) for e in args.ppo_epochs.split(",")]
    except ValueError:
        parser.error(f"--ppo-epochs: {args.ppo_epochs!r} is not a comma-separated list of integers")
    return args


SHAPE_FLAGS = (("P", "prompt_length"), ("T", "response_length"), ("k", "k"))


def reshaped(names: list[str], args, parser) -> list[str]:
    """Each preset at every combination of the shapes given (--prompt-length, --response-length, --k), as
    `name@P=..+T=..+k=..`."""
    import itertools

    axes = []
    for key, attribute in SHAPE_FLAGS:
        value = getattr(args, attribute)
        if value is None:
            continue
        values = value.split(",")
        if not all(v.isdigit() and int(v) >= 1 for v in values):
            flag = "--" + attribute.replace("_", "-")
            parser.error(f"{flag}: {value!r} is not a comma-separated list of integers >= 1")
        axes.append([f"{key}={v}" for v in values])
    combos = ["+".join(combo) for combo in itertools.product(*axes)] if axes else [""]
    return [name + ("+" if "@" in name else "@") + combo if combo else name for name in names for combo in combos]


def configurations(args) -> list[dict]:
    """Every (preset, implementation, algorithm) to run, with the command that runs it."""
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
    peers = {}
    if args.peers == "auto" and args.device == "cpu":
        from rloo.bench.peers import trl_version

        for algorithm, python in (
            ("rloo", args.trl_python or sys.executable),
            ("ppo", args.trl_ppo_python or sys.executable),
        ):
            version = trl_version(python)
            if version is not None:
                peers[algorithm] = (python, version)
    runs = []
    for preset in args.presets.split(","):
        ours = [
            sys.executable,
            "-m",
            "rloo.bench.worker",
            "--preset",
            preset,
            *common,
            "--precision",
            args.precision,
            "--device",
            args.device,
            *[flag for key in worker_settings(args) for flag in ("--set", key)],
        ]
        epochs, _, minis = args.rloo_schedule.partition("x")
        micro = get_preset(preset).completions_per_step // int(minis)
        schedule = (
            [
                "--set",
                f"num_ppo_epochs={epochs}",
                "--set",
                f"num_mini_batches={minis}",
                "--set",
                f"micro_batch_size={micro}",
            ]
            if args.rloo_schedule != "1x1"
            else []
        )
        runs.append(
            dict(
                preset=preset,
                implementation="rloo",
                algorithm="rloo",
                schedule=args.rloo_schedule,
                command=[*ours, "--algorithm", "rloo", *schedule],
            )
        )
        for name in args.grpo:
            runs.append(
                dict(preset=preset, implementation="rloo", algorithm=name, command=[*ours, "--algorithm", name])
            )
        for epochs in args.ppo_epochs:
            runs.append(
                dict(
                    preset=preset,
                    implementation="rloo",
                    algorithm="ppo",
                    ppo_epochs=epochs,
                    command=[*ours, "--algorithm", "ppo", "--ppo-epochs", str(epochs)],
                )
            )
        theirs = ["-m", "rloo.bench.peers", "--preset", preset, *common]
        if "rloo" in peers:
            python, version = peers["rloo"]
            runs.append(
                dict(
                    preset=preset,
                    implementation=f"trl-{version}",
                    algorithm="rloo",
                    schedule=args.rloo_schedule,
                    command=[
                        python,
                        *theirs,
                        "--algorithm",
                        "rloo",
                        "--rloo-schedule",
                        args.rloo_schedule,
                        "--lm-head",
                        args.trl_lm_head,
                    ],
                )
            )
        if "rloo" in peers:  # GRPOTrainer ships with RLOOTrainer (TRL 1.16)
            python, version = peers["rloo"]
            for name in args.grpo:
                command = [python, *theirs, "--algorithm", name, "--lm-head", args.trl_lm_head]
                runs.append(dict(preset=preset, implementation=f"trl-{version}", algorithm=name, command=command))
        if "ppo" in peers:
            python, version = peers["ppo"]
            for epochs in args.ppo_epochs:
                runs.append(
                    dict(
                        preset=preset,
                        implementation=f"trl-{version}",
                        algorithm="ppo",
                        ppo_epochs=epochs,
                        command=[python, *theirs, "--algorithm", "ppo", "--ppo-epochs", str(epochs)],
                    )
                )
    return runs


def worker_settings(args) -> list[str]:
    """The train.yaml keys every rloo worker of a speed run sets: the positional overrides and the rollout's
    precision."""
    precision = [f"rollout_precision={args.rollout_precision}"] if args.rollout_precision != "same" else []
    return [*args.overrides, *precision]


def run_one(run: dict, out_dir: Path, timeout: int) -> dict:
    name = (
        f"{run['preset']}-{run['implementation']}-{run['algorithm']}"
        + (f"-{run['ppo_epochs']}ep" if "ppo_epochs" in run else "")
        + (f"-{run['schedule']}" if run.get("schedule", "1x1") != "1x1" else "")
    )
    result_path = out_dir / "runs" / f"{name}.json"
    result_path.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]),
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "disabled",
        "HF_HUB_OFFLINE": "1",
    }
    print(f"bench: {name} ...", flush=True)
    started = time.time()
    try:
        proc = subprocess.run(
            [*run["command"], "--out", str(result_path)], env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {**_identity(run), "name": name, "error": f"timed out after {timeout} s"}
    (out_dir / "runs" / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not result_path.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**_identity(run), "name": name, "error": f"exit {proc.returncode}: {tail[0]}"}
    result = json.loads(result_path.read_text())
    print(
        f"bench: {name}: {result['step_seconds_median']:.3f} s/step, peak RSS {result['peak_rss_mb']:.0f} MB "
        f"({time.time() - started:.0f} s)",
        flush=True,
    )
    return {**result, **_identity(run), "name": name}


def _identity(run: dict) -> dict:
    return {k: run[k] for k in ("preset", "implementation", "algorithm", "ppo_epochs", "schedule") if k in run}


def memory_mb(result: dict) -> float | None:
    """The memory compared in the ratios: GPU peak allocated on GPU; on CPU the peak RSS above the post-import
    baseline (what the training itself costs, as max_memory_allocated leaves out the CUDA context)."""
    if result.get("peak_gpu_mb") is not None:
        return result["peak_gpu_mb"]
    return result.get("peak_rss_above_baseline_mb")


def ratios(results: list[dict]) -> list[dict]:
    """Per preset: our RLOO over our PPO (each epoch count) and over TRL's RLOO, and each of our GRPO family over
    TRL's GRPOTrainer at the same loss type, time and memory. A GRPO pair whose loss settings differ (`unfair`)
    gets no ratio: the row names the first setting that differs."""
    rows = []
    ok = [r for r in results if "error" not in r]
    for preset in dict.fromkeys(r["preset"] for r in ok):
        for ours in [
            r for r in ok if r["preset"] == preset and r["implementation"] == "rloo" and r["algorithm"] != "ppo"
        ]:
            for other in ok:
                if other["preset"] != preset or other is ours or not comparable(ours, other):
                    continue
                rows.append(ratio_row(preset, ours, other))
    return rows


def comparable(ours: dict, other: dict) -> bool:
    """Our RLOO against our PPO (the same rollout code) and TRL's RLOO; our GRPO family against TRL's same loss."""
    if other["implementation"] == "rloo":
        return ours["algorithm"] == "rloo" and other["algorithm"] == "ppo"
    return other["algorithm"] == ours["algorithm"]


def unfair(ours: dict, other: dict) -> str | None:
    """Where two GRPO runs' loss settings differ, the first difference; None where they agree (or carry none)."""
    mine, theirs = ours.get("algorithm_settings"), other.get("algorithm_settings")
    if mine is None or theirs is None:
        return None if mine is theirs else "one side did not report its loss settings"
    for key in mine:
        if theirs.get(key) != mine[key]:
            return f"{key}: rloo {mine[key]!r}, {other['implementation']} {theirs.get(key)!r}"
    return None


def ratio_row(preset: str, ours: dict, other: dict) -> dict:
    row = {"preset": preset, "rloo": label(ours), "vs": label(other)}
    if why := unfair(ours, other):
        return row | {"unfair": why, "time_ratio": None, "memory_ratio": None, "peak_rss_ratio": None}
    return row | {
        "time_ratio": ours["step_seconds_median"] / other["step_seconds_median"],
        "memory_ratio": _ratio(memory_mb(ours), memory_mb(other)),
        "peak_rss_ratio": _ratio(ours.get("peak_rss_mb"), other.get("peak_rss_mb")),
        "model_state_ratio": _ratio(ours["model_state_mb"]["total"], other["model_state_mb"]["total"]),
        "sum_rate_ratio": _ratio(ours.get("sum_gb_per_s"), other.get("sum_gb_per_s")),
    }


def _ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


def label(result: dict) -> str:
    name = f"{result['implementation']} {result['algorithm'].upper()}"
    if result["algorithm"] == "ppo":
        return name + f" ({result['ppo_epochs']} ep)"
    return name + (f" ({result['schedule']})" if result.get("schedule", "1x1") != "1x1" else "")


def machine() -> dict:
    import torch

    from rloo.utils.host import cpu_identity

    identity = cpu_identity()
    return {
        "cpu": identity["cpu"],
        "cpu_family_model": f"{identity['family']}/{identity['model']}",
        "cpu_capability": identity["capability"],
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def _fmt(value, digits=3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['gpu'] or 'no GPU'}; torch {m['torch']}, "
        f"{report['args']['threads']} threads, precision {report['args']['precision']}; "
        f"median of {report['args']['steps']} steps after {report['args']['warmup']} warm-up; "
        f"RLOO schedule {report['args']['rloo_schedule']} (epochs x mini-batches); "
        f"TRL RLOO's LM head: {report['args']['trl_lm_head']}; {report['date']}.",
    ]
    on_gpu = any(r.get("peak_gpu_mb") is not None for r in report["results"])
    gpu_head, gpu_rule = (" peak GPU MB |", "---|") if on_gpu else ("", "")
    lines += [
        "",
        "| preset | trainer | s/step | rollout s | update s | tokens/s |" + gpu_head + " peak RSS MB "
        "| above baseline MB | model state MB | torch.sum GB/s | decode / torch.sum |",
        "|---|---|---|---|---|---|" + gpu_rule + "---|---|---|---|---|",
    ]
    for r in report["results"]:
        if "error" in r:
            lines.append(f"| {r['preset']} | {label(r)} | failed: {r['error']} |" + " |" * (8 + on_gpu))
            continue
        gpu_cell = f" {_fmt(r.get('peak_gpu_mb'), 0)} |" if on_gpu else ""
        lines.append(
            f"| {r['preset']} | {label(r)} | {_fmt(r['step_seconds_median'])} "
            f"| {_fmt(r.get('rollout_seconds_median'))} | {_fmt(r.get('update_seconds_median'))} "
            f"| {_fmt(r['tokens_per_second'], 0)} |{gpu_cell} {_fmt(r['peak_rss_mb'], 0)} "
            f"| {_fmt(r['peak_rss_above_baseline_mb'], 0)} | {_fmt(r['model_state_mb']['total'], 0)} "
            f"| {_fmt(r.get('sum_gb_per_s'), 1)} | {_fmt(r.get('generate_read_fraction'), 2)} |"
        )
    lines += [
        "",
        "| preset | rloo | vs | time ratio | memory ratio | peak RSS ratio | model state ratio | torch.sum ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["ratios"]:
        if "unfair" in row:
            lines.append(f"| {row['preset']} | {row['rloo']} | {row['vs']} | not compared: {row['unfair']} | | | | |")
            continue
        lines.append(
            f"| {row['preset']} | {row['rloo']} | {row['vs']} | {_fmt(row['time_ratio'], 2)} "
            f"| {_fmt(row['memory_ratio'], 2)} | {_fmt(row['peak_rss_ratio'], 2)} "
            f"| {_fmt(row['model_state_ratio'], 2)} "
            f"| {_fmt(row.get('sum_rate_ratio'), 2)} |"
        )
    lines += [
        "",
        "Memory ratio: GPU peak allocated on GPU; on CPU the peak RSS above the process's RSS after imports. "
        "torch.sum GB/s: the host's read rate, measured in each row's own process after its steps; "
        "decode / torch.sum: the bytes rloo's decode steps read over its generate phase's time "
        "(prefill and draws included: a lower bound).",
    ]
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    args = parse_args(argv)
    now = datetime.now()
    out_dir = Path(args.out or Path("outputs") / "bench" / now.strftime("%Y-%m-%d") / now.strftime("%H-%M-%S"))
    try:  # one bench at a time in its dir, as every entry point that writes one (rloo.utils.ownership)
        ownership.take(out_dir, log=lambda line: print(line, file=sys.stderr))
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    if args.mode == "quality":
        from rloo.bench import quality

        report = quality.run_quality(out_dir.resolve(), args.overrides, args.timeout)
        (out_dir / "quality.json").write_text(json.dumps(report, indent=2))
        table = quality.markdown(report)
        (out_dir / "quality.md").write_text(table)
        print("\n" + table + f"\nbench: wrote {out_dir / 'quality.json'} and {out_dir / 'quality.md'}")
        return
    if args.mode == "logprobs":
        from rloo.bench import logprobs

        logprobs.run(out_dir)
        print(f"bench: wrote {out_dir / 'logprobs.json'} and {out_dir / 'logprobs.md'}")
        return
    if args.mode == "strategies":
        from rloo.bench import strategies

        preset = args.presets.split(",")[0]
        strategies.run(out_dir.resolve(), preset, overrides=args.overrides)
        print(f"bench: wrote {out_dir / 'strategies.json'} and {out_dir / 'strategies.md'}")
        return
    if args.mode == "async":
        from rloo.bench import overlap

        preset = args.presets.split(",")[0]
        workloads = tuple(args.workloads.split(","))
        overlap.run(out_dir.resolve(), preset, args.steps + args.warmup, args.warmup, args.latency, workloads)
        print(f"bench: wrote {out_dir / 'async.json'} and {out_dir / 'async.md'}")
        return
    if args.mode == "episodes":
        from rloo.bench import episodes

        report = episodes.run(out_dir.resolve(), args.trl_python, args.steps)
        report |= {"date": now.isoformat(timespec="seconds"), "machine": machine()}
        (out_dir / "episodes.json").write_text(json.dumps(report, indent=2))
        table = f"{report['machine']['cpu']}, torch.sum {report['read_rate_gb_s']} GB/s\n\n" + episodes.markdown(report)
        (out_dir / "episodes.md").write_text(table)
        print("\n" + table + f"\nbench: wrote {out_dir / 'episodes.json'} and {out_dir / 'episodes.md'}")
        if any("error" in side for side in report["sides"]):
            raise SystemExit(f"error: bench episodes: a side failed (see {out_dir / 'episodes.md'})")
        return
    if args.mode == "decode":
        from rloo.bench import decode

        preset = args.presets.split(",")[0]
        result = decode.measure(preset, args.device, args.threads, bf16_weights=args.rollout_precision == "bf16")
        result |= {"date": now.isoformat(timespec="seconds"), "machine": machine()}
        (out_dir / "decode.json").write_text(json.dumps(result, indent=2))
        table = f"{result['machine']['cpu']}, torch {result['machine']['torch']}\n\n" + decode.markdown(result)
        (out_dir / "decode.md").write_text(table)
        print("\n" + table + f"\nbench: wrote {out_dir / 'decode.json'} and {out_dir / 'decode.md'}")
        return
    if args.mode == "gpu":
        from rloo.bench import gpu

        report = gpu.run(
            out_dir.resolve(),
            args.device,
            args.steps,
            args.warmup,
            args.threads,
            args.timeout,
            overrides=args.overrides,
            trl_python=args.trl_python,
        )
        report |= {"date": now.isoformat(timespec="seconds"), "machine": machine()}
        (out_dir / "gpu.json").write_text(json.dumps(report, indent=2))
        table = gpu.markdown(report)
        (out_dir / "gpu.md").write_text(table)
        print("\n" + table + f"\nbench: wrote {out_dir / 'gpu.json'} and {out_dir / 'gpu.md'}")
        failed = [row["model"] for row in report["models"] + report["decode"] if "error" in row]
        failed += [cell["config"] for cell in report.get("mismatch", []) if "error" in cell]
        if failed:
            raise SystemExit(f"error: bench gpu: {', '.join(failed)} failed (see {out_dir})")
        return
    if args.mode == "stability":
        from rloo.bench import stability

        report = stability.run_stability(
            out_dir.resolve(),
            args.presets.split(","),
            args.precisions.split(","),
            args.steps,
            args.warmup,
            args.threads,
            args.overrides,
            args.timeout,
        )
        report |= {"date": now.isoformat(timespec="seconds"), "machine": machine()}
        (out_dir / "stability.json").write_text(json.dumps(report, indent=2))
        table = stability.markdown(report)
        (out_dir / "stability.md").write_text(table)
        print("\n" + table + f"\nbench: wrote {out_dir / 'stability.json'} and {out_dir / 'stability.md'}")
        return
    results = [run_one(run, out_dir, args.timeout) for run in configurations(args)]
    report = {
        "date": now.isoformat(timespec="seconds"),
        "machine": machine(),
        "args": {k: v for k, v in vars(args).items() if k not in ("trl_python", "trl_ppo_python")},
        "results": results,
        "ratios": ratios(results),
    }
    (out_dir / "results.json").write_text(json.dumps(report, indent=2))
    table = markdown(report)
    (out_dir / "results.md").write_text(table)
    print("\n" + table + f"\nbench: wrote {out_dir / 'results.json'} and {out_dir / 'results.md'}")
    if any("error" in r for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
