"""Helpers for the subprocess tests: tiny bootstrap and run settings, and the entry points run as a user would."""

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# a guard against a hung subprocess, never a time limit: a loaded 2-core machine takes minutes where an idle one takes
# seconds, and a test must not fail for it. Every subprocess test waits at most this long.
HANG_GUARD_S = 3600

FAST = ["debug=fast"]  # conf/debug/fast.yaml: the tiny bootstrap (bootstrap=fast) and three 8-completion steps
METRICS = [
    "objective/scores",
    "objective/kl",
    "objective/rlhf_reward",
    "objective/non_score_reward",
    "objective/entropy",
    "policy/entropy_avg",
    "policy/clipfrac_avg",
    "policy/approxkl_avg",
    "loss/policy_avg",
    "val/ratio",
    "val/ratio_var",
    "val/num_eos_tokens",
    "completions/mean_length",
    "completions/eos_frac",
    "completions/clipped_ratio",
    "frac_reward_zero_std",
    "reward_std",
    "time/rollout",
    "time/update",
    "time/tokens_per_second",
    "lr",
    "eps",
    "train/rollout",
    "episode",
    "train/epoch",
]


def run_module(
    module: str, *args: str, cwd: Path = ROOT, cache: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m <module> <args>` as a user runs it, from `cwd`: W&B offline, no hub, the embedded task's cache at
    `cache`; stdout and stderr captured."""
    environment = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", **(env or {})}
    if cache is not None:
        environment["RLOO_CACHE_DIR"] = str(cache)
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


def train(run_dir: Path, cache: Path, *overrides: str) -> subprocess.CompletedProcess:
    return run_module("rloo.train", f"hydra.run.dir={run_dir}", *FAST, *overrides, cache=cache)


def evaluate(run_dir: Path, cache: Path, *overrides: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_module(
        "rloo.evaluate",
        f"hydra.run.dir={run_dir}",
        "bootstrap=fast",
        "response_length=8",
        *overrides,
        cache=cache,
        env=env,
    )


def train_error(run_dir: Path, cache: Path, *overrides: str) -> str:
    """The one-line ConfigError `python -m rloo.train` stops with (exit 2) for these settings, run in-process: the
    entry point's checks of the command line, then the run itself up to the error. Asserts nothing was trained."""
    import pytest

    from rloo.run.cli import compose_train_config, preflight
    from rloo.run.pipeline import run
    from rloo.utils.errors import ConfigError

    argv = [*FAST, f"paths.output_dir={run_dir}", f"paths.cache_dir={cache}", *overrides]
    with pytest.raises(ConfigError) as caught:
        run(compose_train_config(preflight(argv)))
    message = str(caught.value)
    assert "\n" not in message and not (run_dir / "policy").exists()
    return f"error: {message}"


def one_rollout(assets: Path, run_dir: Path, *overrides: str) -> dict:
    """One rollout of `rloo.run.pipeline.run`, in-process, on saved models and jsonl splits in `assets` (policy/,
    reward_model/, train.jsonl, validation.jsonl), without the embedded bootstrap; returns the summary."""
    from rloo.run.cli import compose_train_config, preflight
    from rloo.run.pipeline import run

    settings = [
        "bootstrap=none",
        "logger=csv",
        "judge=none",
        f"model.policy={assets / 'policy'}",
        f"model.reward_model={assets / 'reward_model'}",
        f"data.train.path={assets / 'train.jsonl'}",
        f"data.validation.path={assets / 'validation.jsonl'}",
        "data.validation.split=train",
        f"paths.output_dir={run_dir}",
        "response_length=6",
        "rollout_batch_size=8",
        "micro_batch_size=4",
        "generation_batch_size=8",
        "total_episodes=8",
        "eval.before=false",
        "eval.after=false",
        "checkpoint_every=0",
        "sample_every=0",
    ]
    return run(compose_train_config(preflight([*settings, *overrides])))


# ---- training processes in the background, for tests that signal or kill them --------------------------------
def start(run_dir: Path, cache_dir: Path, *overrides: str, env: dict | None = None) -> tuple[subprocess.Popen, Path]:
    """`python -m rloo.train` in the background, its output to a file (a pipe nobody reads would fill and block)."""
    log = run_dir.with_name(run_dir.name + f".{time.monotonic_ns()}.out")
    environment = {**os.environ, "RLOO_CACHE_DIR": str(cache_dir), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "rloo.train", f"hydra.run.dir={run_dir}", *FAST, "logger=csv", *overrides],
        cwd=ROOT,
        env={**environment, **(env or {})},
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the test can reach every rank through the process group
    )
    return process, log


def finish(process: subprocess.Popen, log: Path) -> tuple[int, str, float]:
    started = time.monotonic()
    code = process.wait(timeout=HANG_GUARD_S)
    return code, log.read_text(), time.monotonic() - started


def wait_for(condition, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not condition():
        assert process.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def group_alive(process: subprocess.Popen) -> bool:
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


def free_port() -> int:
    """A TCP port free on loopback now, for a process group's rendezvous."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


HOLD = """
import sys, time
from rloo.utils import ownership
ownership.take(sys.argv[1], log=print)
print("held", flush=True)
time.sleep(600)
"""


@contextmanager
def live_holder(run_dir: Path):
    """A process that holds `run_dir` (rloo.utils.ownership) while the block runs, then is killed as a run that dies
    holding it: its record stays, the kernel drops the lock. Yields the process."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()
