"""Resuming a run: which checkpoint, whether the new settings may continue it, and the random states a
checkpoint carries so that a resumed run draws exactly what the uninterrupted one would have.

    python -m rloo.train resume=outputs/2026-12-03/10-00-00            # its last whole checkpoint, in that dir
    python -m rloo.train resume=outputs/.../checkpoints/step40.ckpt    # that checkpoint
    python -m rloo.train hydra.run.dir=outputs/my-run resume=auto      # this run dir's last checkpoint, or fresh

A checkpoint is whole when it loads and was taken between rollouts (its optimiser steps are its rollouts times
the updates per rollout); a Ctrl-C inside a rollout's updates leaves one that is not, and it is skipped.
A requeued run that had finished is left as it is (`finished_summary`); one killed after its last rollout exports
and evaluates on resume (`finish_ended_training`).
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rloo.utils.errors import ConfigError


@dataclass(frozen=True)
class ResumePoint:
    run_dir: Path | None  # the run it continues (None: a checkpoint outside a run dir; the new run gets its own)
    checkpoint: Path


def is_deepspeed_checkpoint(path: Path) -> bool:
    """A checkpoint Lightning's DeepSpeedStrategy wrote: a dir `<name>.ckpt/` naming its tag in `latest`, the tag dir
    holding the model states (with the run's state) and each rank's optimiser states."""
    return path.is_dir() and (path / "latest").is_file()


def inspect_deepspeed_checkpoint(path: Path) -> dict | str:
    """The run state a DeepSpeed checkpoint dir holds (its model states file), or why it is not whole: a write that
    was cut leaves a file missing or truncated, an optimiser state of some rank absent."""
    tag = path / (path / "latest").read_text().strip()
    # ZeRO-2 writes the model states once, ZeRO-3 one part per rank (each with the run's state)
    states = next(
        (
            f
            for f in (tag / "mp_rank_00_model_states.pt", tag / "zero_pp_rank_0_mp_rank_00_model_states.pt")
            if f.is_file()
        ),
        None,
    )
    if states is None:
        return "is a DeepSpeed checkpoint without its model states (its write was cut)"
    checkpoint = torch.load(states, map_location="cpu", mmap=True, weights_only=True)
    optimiser_states = sorted(tag.glob("*_optim_states.pt"))
    ranks = checkpoint.get("dp_world_size")
    if len(optimiser_states) != ranks:
        return f"is a DeepSpeed checkpoint with {len(optimiser_states)} of {ranks} ranks' optimiser states"
    model_states = sorted(tag.glob("zero_pp_rank_*_model_states.pt"))
    if model_states and len(model_states) != ranks:
        return f"is a DeepSpeed checkpoint with {len(model_states)} of {ranks} ranks' model states"
    for part in (
        optimiser_states + model_states
    ):  # not unpickled here: a truncated file has no zip directory (it is at the end)
        if not zipfile.is_zipfile(part):
            return f"is a DeepSpeed checkpoint whose {part.name} is cut short"
    return checkpoint


def run_dir_of(spec: str | None) -> str | None:
    """The run dir a `resume=` value continues in (None: a fresh run dir); used for hydra.run.dir."""
    if spec in (None, "auto"):
        return None
    path = Path(spec).expanduser()
    if is_deepspeed_checkpoint(path) and path.parent.name == "checkpoints":
        return str(path.parent.parent)
    if path.is_dir():
        return str(path)
    if path.parent.name == "checkpoints":
        return str(path.parent.parent)
    return None


def check_resume_argument(spec: str | None) -> None:
    """`resume=` names an existing run dir or checkpoint file, or is auto (before Hydra starts)."""
    if spec in (None, "auto", "null"):
        return
    path = Path(spec).expanduser()
    if is_deepspeed_checkpoint(path):
        return
    if path.is_dir():
        if not (path / "checkpoints").is_dir():
            if (path / "config.yaml").is_file() or (path / "summary.json").is_file():  # a run dir all the same
                raise ConfigError(
                    f"resume={spec!r}: that run stopped before its first checkpoint, so there is nothing to continue "
                    f"from; start it again in its dir: hydra.run.dir={spec} resume=auto"
                )
            raise ConfigError(f"resume={spec!r} is a dir without checkpoints/: give a run dir, a .ckpt file or auto")
        return
    if not path.is_file():
        raise ConfigError(f"resume={spec!r} does not exist: give a run dir, a .ckpt file or auto")


def checkpoint_order(path: Path) -> tuple[int, int]:
    """Newest first by file time, `step<N>` names by N: last.ckpt and interrupted.ckpt compete on content."""
    match = re.fullmatch(r"step(\d+)", path.stem)
    return (int(match.group(1)) if match else -1, path.stat().st_mtime_ns)


def inspect_checkpoint(path: Path, updates_per_rollout: int) -> tuple[int, str | None]:
    """(rollouts done, None) for a whole checkpoint; (-1, why not) otherwise. Loads lazily (mmap)."""
    try:  # weights_only: tensors and plain values only, so a planted pickle is refused, never run
        if is_deepspeed_checkpoint(path):
            checkpoint = inspect_deepspeed_checkpoint(path)
            if isinstance(checkpoint, str):
                return -1, checkpoint
        else:
            checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(error))
        what = found.group(1) if found else "an object that is not a tensor or a plain value"
        return -1, f"holds {what}, which no run writes: refused without loading it"
    except Exception as error:  # truncated, not a zip, not a checkpoint
        return -1, f"does not load ({str(error).splitlines()[0][:80]})"
    if not isinstance(checkpoint, dict):
        return -1, "is not an rloo checkpoint"
    rollouts, steps = checkpoint.get("rloo_rollouts"), checkpoint.get("global_step")
    if rollouts is None or steps is None:
        return -1, "is not an rloo checkpoint"
    if steps != rollouts * updates_per_rollout:
        return -1, f"was taken inside rollout {rollouts + 1} ({steps} optimiser steps)"
    return rollouts, None


def find_resume_point(spec: str | None, run_dir: Path, updates_per_rollout: int, log=print) -> ResumePoint | None:
    """The checkpoint `resume=` asks for, or None for a fresh start (resume=null, or auto with none yet)."""
    if spec is None:
        return None
    if spec == "auto" or (Path(spec).expanduser().is_dir() and not is_deepspeed_checkpoint(Path(spec).expanduser())):
        directory = run_dir if spec == "auto" else Path(spec).expanduser()
        candidates = []
        for candidate in (directory / "checkpoints").glob("*.ckpt"):
            if candidate.exists():
                candidates.append(candidate)
            else:  # a link whose target was deleted (keep_checkpoints, or by hand)
                log(f"resume: skipping {candidate.name}: it points at {os.readlink(candidate)}, which is gone")
        candidates.sort(key=checkpoint_order, reverse=True)
        best: tuple[int, Path] | None = None
        for candidate in candidates:
            rollouts, why_not = inspect_checkpoint(candidate, updates_per_rollout)
            if why_not:
                log(f"resume: skipping {candidate.name}: it {why_not}")
            elif best is None or rollouts > best[0]:
                best = (rollouts, candidate)
        if best is None:
            if spec == "auto":
                log(f"resume=auto: no whole checkpoint in {directory / 'checkpoints'}; starting from the beginning")
                return None
            raise ConfigError(f"resume={spec!r}: no whole checkpoint in {directory / 'checkpoints'}")
        return ResumePoint(directory, best[1])
    path = Path(spec).expanduser()
    rollouts, why_not = inspect_checkpoint(path, updates_per_rollout)
    if why_not:
        raise ConfigError(f"resume={spec!r} cannot be resumed: it {why_not}")
    return ResumePoint(Path(run_dir_of(spec)) if run_dir_of(spec) else None, path)


# ---- random states --------------------------------------------------------------------------------------------
def rng_states() -> dict:
    """Every generator a step draws from: Python, NumPy, torch CPU and each CUDA device."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    # tensors and plain values only, so that checkpoints load with torch.load(weights_only=True)
    return {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    kind, keys, position, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


# ---- what rloo.train asks before and after it resumes -----------------------------------------------------------
def finished_summary(out: Path, rollouts: int, final_evaluation: bool) -> dict | None:
    """summary.json of a run in `out` that is done: finished, all `rollouts` trained, policy/ exported and the final
    evaluation recorded (where one is asked for). None otherwise, also where the file does not parse."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    done = (
        summary.get("status") == "finished"
        and summary.get("rollouts", -1) >= rollouts
        and (out / "policy" / "config.json").is_file()
        and (summary.get("final") is not None or not final_evaluation)
    )
    return summary if done else None


def finish_ended_training(out: Path, trainer, module, export, eval_callback, log) -> None:
    """What a run killed after its last rollout had not done yet: the policy export, the final evaluation."""
    if not (out / "policy").is_dir():
        log(f"resume: training had ended after {module.state.rollouts} rollouts; exporting the policy now")
        export.on_train_end(trainer, module)
    if eval_callback.after and eval_callback.final is None:
        log("resume: training had ended without its final evaluation; running it now")
        eval_callback.on_train_end(trainer, module)


def continued_wandb_run(logger_cfg, out: Path) -> dict:
    """A resumed run logs into the same W&B run (its id, from the run dir's wandb/ folder), not a new one."""
    if not str(logger_cfg.get("_target_", "")).endswith(("WandbLogger", "WandbJobLogger")):
        return {}
    runs = sorted((out / "wandb").glob("*run-*-*"), key=lambda p: p.stat().st_mtime)
    return {"id": runs[-1].name.rsplit("-", 1)[1], "resume": "allow"} if runs else {}


def prepare_resume(spec: str | None, out: Path, updates: int, log):
    """The checkpoint `resume=` (`spec`) continues from and the rollouts it had done, or (None, 0) for a fresh start;
    what a kill mid-write left in the run dir is removed first."""
    if spec is None:
        return None, 0
    from rloo.utils.atomic import remove_stale_temps

    for directory in (out, out / "checkpoints"):  # what a kill mid-write left
        if directory.is_dir():
            remove_stale_temps(directory, log)
    point = find_resume_point(spec, out, updates, log)
    if point is None:
        return None, 0
    rollouts = inspect_checkpoint(point.checkpoint, updates)[0]
    log(f"resume: from {point.checkpoint} after {rollouts} rollouts; writing to {out}")
    return point, rollouts
