"""A cluster's preemption. SLURM sends a job a signal before it kills it (`sbatch --signal=USR1@90`: SIGUSR1, 90 s
ahead), and a job may requeue itself (`scontrol requeue`). Under SLURM, rloo takes that signal as it takes SIGTERM:
every rank stops at the end of the rollout it is in (the ranks agree where they all meet, as each rollout starts),
`interrupted.ckpt` is written at that one point, and the first rank requeues the job. The requeued job, started
again in the same run dir with `resume=auto`, continues bit-identically.

Lightning's own SLURM handler is switched off (`auto_requeue=False`): it saves a checkpoint from inside the signal
handler, wherever each rank stands, which is not a point a rollout can continue from.
"""

from __future__ import annotations

import os
import signal
import subprocess

REQUEUE_SIGNAL = signal.SIGUSR1  # the signal SLURM's docs and Lightning send ahead of the kill


def on_slurm() -> bool:
    """A job SLURM launched (Lightning's test: SLURM_NTASKS set, not an interactive `bash` / `interactive` job)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return SLURMEnvironment.detect()


def cluster_plugins() -> list:
    """The Trainer's cluster environment under SLURM, with Lightning's requeue handler off (rloo's stops the ranks
    at a rollout's end instead); nothing elsewhere."""
    if not on_slurm():
        return []
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)]


def job_id() -> str | None:
    """The job to requeue: an array task as `<array job>_<task>`, else SLURM_JOB_ID."""
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array_job}_{task}" if array_job and task else os.environ.get("SLURM_JOB_ID")


def requeue() -> str:
    """`scontrol requeue <job>`; what happened, as the end of the run's last line."""
    job = job_id()
    if job is None:
        return "no SLURM_JOB_ID to requeue: resubmit the job with resume=auto"
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"scontrol requeue {job} failed ({type(error).__name__}: {error}): resubmit the job with resume=auto"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        why = lines[-1] if lines else f"exit {done.returncode}"
        return f"scontrol requeue {job} failed ({why}): resubmit the job with resume=auto"
    return f"requeued job {job} (scontrol requeue {job}); with resume=auto it continues from there"


def watch_requeue_signal(on_signal) -> object:
    """Call `on_signal()` when the requeue signal comes (nothing more happens inside the handler); returns the handler
    it replaced, for `signal.signal(REQUEUE_SIGNAL, previous)`."""

    def handler(signum, frame) -> None:
        on_signal()

    return signal.signal(REQUEUE_SIGNAL, handler)
