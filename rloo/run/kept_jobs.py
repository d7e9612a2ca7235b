"""A sweep's jobs kept in a results dir that git tracks (`sweeps/results/<table>/`), part by part.

A table whose jobs take longer than a session is run in parts (a seed, a method at a time), each part a multirun dir
of its own under outputs/. `python -m rloo.report <multirun dir> --keep sweeps/results/<table>` copies every job of
the part that ended into `<table>/<its overrides>/` (no job number: two parts number their jobs from 0 alike) with
the files rloo.report reads (KEPT_FILES: a few KB, never a checkpoint, a model or a picture), then reports over the
whole table. The results dir is then itself a sweep dir: `python -m rloo.report sweeps/results/<table>` writes its
tables again, byte for byte (tests/test_kept_jobs.py checks every committed one).

Each job dir is written whole or not at all (rloo.utils.atomic.save_dir); a job run again replaces its earlier copy;
two keeps into one results dir at once take turns (a lock file beside it).
"""

from __future__ import annotations

import fcntl
import json
import shutil
from pathlib import Path

from rloo.utils import atomic, ownership

# what rloo.report reads of a job (rloo.run.sweep_jobs.job_row): a few KB. Not its curves.png (about 200 KB), which
# `python -m rloo.report <results dir>/<job>` draws again from these.
KEPT_FILES = (".hydra/config.yaml", ".hydra/overrides.yaml", "summary.json", "csv/metrics.csv")
MARKER = "kept.txt"  # the results dir's list of its jobs: what makes it a sweep dir without Hydra's multirun.yaml


def kept_name(job: Path) -> str:
    """A job's dir name without Hydra's job number: `3_algo=grpo,seed=1` -> `algo=grpo,seed=1`."""
    number, _, rest = job.name.partition("_")
    return rest if number.isdigit() and rest else job.name


def keep(jobs: list[Path], results: Path, log=print) -> list[str]:
    """Copy each of `jobs` that ended (its summary.json written: finished, failed or interrupted) into
    `results/<kept_name>/`; a job still running, or killed before it wrote a summary, is named and left. Returns the
    names kept."""
    results.mkdir(parents=True, exist_ok=True)
    kept = []
    with open(results / f".{MARKER}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for job in jobs:
            if ownership.holder(job) == "live" or not (job / "summary.json").is_file():
                log(f"keep: {job.name} not kept: it has not ended (no summary.json)")
                continue
            name = kept_name(job)
            atomic.save_dir(lambda tmp, job=job: _copy(job, tmp), results / name, f"the kept job {name}")
            kept.append(name)
        names = sorted({*_listed(results), *kept})
        atomic.write_text(results / MARKER, "".join(f"{n}\n" for n in names), "the list of kept jobs")
    return kept


def _listed(results: Path) -> list[str]:
    path = results / MARKER
    listed = path.read_text().split() if path.is_file() else []
    return [name for name in listed if (results / name / ".hydra").is_dir()]


def _copy(job: Path, into: Path) -> None:
    for relative in KEPT_FILES:
        source = job / relative
        if source.is_file():
            (into / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, into / relative)
    summary = json.loads((into / "summary.json").read_text())
    (into / "summary.json").write_text(json.dumps(_without_paths(summary, job.resolve()), indent=2) + "\n")


def _without_paths(value, job: Path):
    """The summary with no absolute path of this machine in it, so that a tracked file names no one's home: a path
    in the job's dir relative to it (`.`, `policy`), any other by its last part."""
    if isinstance(value, dict):
        return {key: _without_paths(item, job) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_paths(item, job) for item in value]
    if isinstance(value, str) and value.startswith("/") and "\n" not in value:
        path = Path(value)
        return str(path.relative_to(job)) if path.is_relative_to(job) else path.name
    return value


def is_kept(results: Path) -> bool:
    return (results / MARKER).is_file()
