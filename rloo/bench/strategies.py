"""python -m rloo.bench strategies: memory per rank and time of real `python -m rloo.train` runs under each CPU
strategy (one process; ddp, fsdp2 and DeepSpeed ZeRO-2 / ZeRO-3 on 2 gloo processes), at one preset's architecture
with random weights, in one invocation on one host.

Every run has the same per-rank work: `rollout_batch_size` completions per rank and rollout, the lean decode (under
fsdp2 and ZeRO-3 from the policy's weights gathered once per rollout), one thread per process; one fsdp2 row samples
with HF generate through the sharded model instead (lean_decode=false: each step gathers every block), the path a run
takes where the gathered copy would not fit. Memory: the peak resident size up to the last training step
(memory/peak_rss_mb, averaged over ranks), and rank 0's over the whole run (summary.json), which includes the final
checkpoint and export. The DeepSpeed rows need deepspeed installed (`pip install -e ".[deepspeed]"`); without it they
are left out, and the table says so.
"""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

STRATEGIES = (  # label, trainer.strategy, nodes, processes per node, overrides
    ("single process", "auto", 1, 1, []),
    ("ddp", "ddp", 1, 2, []),
    ("ddp, 2 nodes", "ddp", 2, 1, []),  # two launchers on loopback, as two machines start a run
    ("fsdp2, HF generate", "fsdp2", 1, 2, ["lean_decode=false"]),
    ("fsdp2", "fsdp2", 1, 2, []),
    ("deepspeed_stage_2", "deepspeed_stage_2", 1, 2, []),
    ("deepspeed_stage_3", "deepspeed_stage_3", 1, 2, []),
)
MMAP_THRESHOLD = "131072"  # bytes: every allocation above it is its own mapping, returned to the system when freed


def write_inputs(preset_name: str, directory: Path, num_prompts: int = 64) -> dict[str, str]:
    """The preset's random-weight policy and reward model, its tokenizer and prompt files, as a user's local copies."""
    from rloo.bench.presets import build_models, build_tokenizer, get_preset

    preset = get_preset(preset_name)
    tokenizer = build_tokenizer(preset.vocab_size)
    policy, reward_model = build_models(preset)
    policy.save_pretrained(directory / "policy")
    tokenizer.save_pretrained(directory / "policy")
    reward_model.save_pretrained(directory / "reward_model")
    draw = random.Random(0)
    for split in ("train", "validation"):
        rows = [
            {
                "prompt": " ".join(f"w{draw.randrange(2, preset.vocab_size)}" for _ in range(preset.prompt_length)),
                "completion": "w2 w3",
            }
            for _ in range(num_prompts)
        ]
        (directory / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return {
        "model.policy": str(directory / "policy"),
        "model.reward_model": str(directory / "reward_model"),
        "data.train.path": str(directory / "train.jsonl"),
        "data.validation.path": str(directory / "validation.jsonl"),
    }


def run(out_dir, preset_name: str = "pythia-160m", rollouts: int = 2, overrides: list[str] | None = None) -> list[dict]:
    """Each strategy in its own `python -m rloo.train`; writes strategies.json and strategies.md to `out_dir`."""
    import importlib.util

    from rloo.bench.presets import get_preset

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    preset = get_preset(preset_name)
    paths = write_inputs(preset_name, out / "inputs")
    has_deepspeed = importlib.util.find_spec("deepspeed") is not None
    results = []
    for label, strategy, nodes, per_node, extra in STRATEGIES:
        if strategy.startswith("deepspeed") and not has_deepspeed:
            continue
        run_dir = out / f"run-{label.replace(', ', '-').replace(' ', '-')}"
        settings = run_settings(preset, paths, rollouts, nodes * per_node)
        command = [*settings, *extra, f"trainer.strategy={strategy}", f"trainer.num_nodes={nodes}"]
        command += [f"trainer.devices={per_node}", f"hydra.run.dir={run_dir}", *(overrides or [])]
        launch(command, nodes, label)
        results.append(result_row(run_dir, label, nodes, per_node))
    write_table(out, results, preset_name, preset.prompts_per_step * preset.k, rollouts, has_deepspeed)
    return results


def write_table(out: Path, results: list[dict], preset_name: str, per_rank: int, rollouts: int, has_deepspeed: bool):
    """strategies.json and strategies.md (printed too): each row beside one process and beside DDP."""
    host = host_line()
    single = results[0]["training_peak_rss_mb"]
    ddp = next(r for r in results if r["strategy"] == "ddp")
    lines = [
        f"{host}. Strategies on CPU at {preset_name} architecture (random weights, fp32), {per_rank} completions "
        f"per rank and rollout, {rollouts} rollouts, 1 thread per process, MALLOC_MMAP_THRESHOLD_={MMAP_THRESHOLD}. "
        "Training peak: the peak RSS of each rank up to its last training step, averaged over ranks "
        "(memory/peak_rss_mb); whole run: rank 0's, including the final checkpoint and export, which gather whole "
        "weights on rank 0" + ("" if has_deepspeed else "; DeepSpeed rows left out: deepspeed is not installed") + ":",
        "",
        "| strategy | nodes x processes | sampler | training peak MiB per rank | vs one process | vs ddp | "
        "whole run, rank 0 MiB | s per rollout | vs ddp |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['strategy']} | {r['layout']} | {r['sampler']} | {r['training_peak_rss_mb']:,.0f} | "
            f"{r['training_peak_rss_mb'] / single:.2f} | {r['training_peak_rss_mb'] / ddp['training_peak_rss_mb']:.2f} "
            f"| {r['peak_rss_mb_rank0']:,.0f} | {r['seconds_per_rollout']:.1f} | "
            f"{r['seconds_per_rollout'] / ddp['seconds_per_rollout']:.2f} |"
        )
    report = {"preset": preset_name, "host": host, "results": results}
    (out / "strategies.json").write_text(json.dumps(report, indent=2))
    (out / "strategies.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def run_settings(preset, paths: dict, rollouts: int, processes: int) -> list[str]:
    """The overrides every row shares: the preset's random-weight models and prompts, the same work per rank."""
    per_rank = preset.prompts_per_step * preset.k
    return [
        "~bootstrap",
        "data=tldr",
        "judge=none",
        "logger=csv",
        *[f"{key}={value}" for key, value in paths.items()],
        "data.train.prompt_column=prompt",
        "data.validation.prompt_column=prompt",
        "data.validation.reference_column=completion",
        f"data.max_prompt_length={preset.prompt_length + 8}",
        f"k={preset.k}",
        f"rollout_batch_size={per_rank}",
        f"micro_batch_size={per_rank}",
        f"generation_batch_size={per_rank}",
        f"response_length={preset.response_length}",
        f"total_episodes={per_rank * processes * rollouts}",
        "eval.before=false",
        "eval.after=false",
        "checkpoint_every=0",
        "trainer.num_threads=1",
    ]


def launch(overrides: list[str], nodes: int, label: str) -> None:
    """`python -m rloo.train` once per node (NODE_RANK, a loopback MASTER_ADDR and a free port where there are
    several, as a cluster's launcher sets them), waiting for all."""
    import socket

    # glibc's mmap threshold fixed: left dynamic, it rises after large frees and freed memory stays resident,
    # which hides what sharding frees (FSDP2 gathers and frees each block at every decode step)
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
    if nodes > 1:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(probe.getsockname()[1])}
    command = [sys.executable, "-m", "rloo.train", *overrides]
    logs = [tempfile.TemporaryFile("w+") for _ in range(nodes)]  # files, not pipes: a full pipe would stall a node
    started = [
        subprocess.Popen(command, env=env | {"NODE_RANK": str(node)}, stdout=log, stderr=subprocess.STDOUT, text=True)
        for node, log in enumerate(logs)
    ]
    for node, (process, log) in enumerate(zip(started, logs)):
        if process.wait() != 0:
            log.seek(0)
            raise RuntimeError(
                f"{label}, node {node}: python -m rloo.train exited {process.returncode}: {log.read()[-2000:]}"
            )


def result_row(run_dir: Path, label: str, nodes: int, per_node: int) -> dict:
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = list(csv.DictReader((run_dir / "csv" / "metrics.csv").open()))
    return {
        "strategy": label,
        "processes": nodes * per_node,
        "layout": f"{nodes} x {per_node}",
        "training_peak_rss_mb": max(float(r["memory/peak_rss_mb"]) for r in rows if r.get("memory/peak_rss_mb")),
        "peak_rss_mb_rank0": summary["peak_rss_mb"],
        "fit_seconds": summary["fit_seconds"],
        "episodes": summary["episodes"],
        "seconds_per_rollout": summary["fit_seconds"] / summary["rollouts"],
        "sampler": summary["fast_paths"]["sampler"]["ran"],
    }


def host_line() -> str:
    """The CPU and its read rate (torch.sum over 256 MiB), measured here, before the runs."""
    import torch

    from rloo.bench.measure import sum_read_rate
    from rloo.utils.host import cpu_identity, describe

    rate = sum_read_rate(256 * 2**20, torch.device("cpu"), torch.float32) / 1e9
    return f"{describe(cpu_identity())}, torch.sum {rate:.1f} GB/s"
