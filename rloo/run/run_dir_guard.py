"""A run dir is checked and taken at the point where Hydra's dir is final, before Hydra or rloo writes anything into
it (its .hydra/ and the job log included): a Hydra callback (conf/hydra/common.yaml), so that every dir Hydra can
name is guarded, however it was named: an interpolation (`hydra.run.dir=runs/k${k}`), `..` through a dir that does
not exist yet, a symlink, `${oc.env:...}`, the run dir resolver's own.

- A single run: `on_run_start`, which Hydra calls with the composed config before it makes the run dir. The dir must
  be writable; a fresh run is refused in a dir that holds another run's outputs (RUN_OUTPUTS: its metrics would
  join the old timeline, its policy and summary be replaced), a resume= continues there; the dir is taken
  (rloo.utils.ownership) so that a live run's holder refuses this process before its files are touched.
- A multirun: `on_multirun_start`, before Hydra makes the sweep dir or writes multirun.yaml. A sweep dir is taken by
  the sweep for its whole length (a second sweep into a live one is refused), and a fresh sweep is refused where a
  job dir under it holds a run's outputs (resume=auto continues each job instead). Each job then takes its own dir
  as a single run does (rloo.run.pipeline), and a job refused there fails alone. `on_multirun_end`: a sweep with a
  failed job (rloo.run.cli.fail, or a job dir whose summary.json says failed) ends on one line naming it, exit 1.

A refusal is one line on stderr and exit status 2. The ranks after the first of a multi-process run join the dir the
first one took.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from rloo.utils.errors import ConfigError

RUN_OUTPUTS = ("summary.json", "checkpoints", "policy", "csv", "verdicts.jsonl", "reward_model")  # any entry point's
DEFAULT_OUTPUT_DIR = "${hydra:runtime.output_dir}"  # conf/paths/default.yaml: paths.output_dir is Hydra's run dir


class RunDirGuard(Callback):
    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        _refuse_in_one_line(guard_run_dirs, config)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        _refuse_in_one_line(guard_sweep_dir, config)

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        """A sweep with a failed job ends on one line naming the failed jobs, and exit status 1."""
        from rloo.run.cli import FAILED_JOBS

        sweep = resolved_dir(config, "hydra.sweep.dir")
        jobs = sorted(job for job in sweep.iterdir() if (job / ".hydra").is_dir()) if sweep.is_dir() else []
        found = {job.name: why for job in jobs if job.name not in FAILED_JOBS and (why := _failure(job))}
        failed = [f"{name}: {line}" for name, line in {**FAILED_JOBS, **found}.items()]
        FAILED_JOBS.clear()
        if failed:
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            print(
                f"error: {len(failed)} of {max(len(jobs), len(failed))} jobs failed: {failed[0]}{more}; python -m "
                f"rloo.report {sweep} lists each",
                file=sys.stderr,
            )
            sys.exit(1)


def _refuse_in_one_line(check, config: DictConfig) -> None:
    from rloo.run.cli import further_rank

    if further_rank():
        return  # the first rank took the dir; the others join it
    try:
        check(config)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)


def resolved_dir(config: DictConfig, key: str) -> Path:
    """The dir `key` names, resolved as Hydra resolves it, its `..` and symlinks followed to the real dir Hydra's
    mkdir makes; an interpolation that cannot be resolved is one line."""
    try:
        value = OmegaConf.select(config, key, throw_on_resolution_failure=True)
    except Exception as error:  # OmegaConf's InterpolationResolutionError and its kin, several lines long
        raw = OmegaConf.to_container(OmegaConf.select(config, key.rsplit(".", 1)[0]), resolve=False)
        first = str(error).strip().splitlines()[0]
        raise ConfigError(f"{key}={raw[key.rsplit('.', 1)[1]]!r} cannot be resolved: {first}") from None
    if value in (None, ""):
        raise ConfigError(f"{key} is empty: give a dir")
    return Path(os.path.realpath(Path(str(value)).expanduser()))


def run_dirs(config: DictConfig) -> list[tuple[str, Path]]:
    """(key, real dir) of the dirs a single run writes into: Hydra's run dir, and paths.output_dir where it is set
    apart from it."""
    dirs = [("hydra.run.dir", resolved_dir(config, "hydra.run.dir"))]
    if OmegaConf.to_container(config.paths, resolve=False).get("output_dir") != DEFAULT_OUTPUT_DIR:
        dirs.append(("paths.output_dir", resolved_dir(config, "paths.output_dir")))
    return dirs


def resuming(config: DictConfig) -> bool:
    return OmegaConf.select(config, "resume", default=None) not in (None, "")


def check_writable(key: str, path: Path) -> None:
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{key}={str(path)!r}: {existing} is not a writable dir (a read-only file system or no permission)"
        )


def held_outputs(path: Path) -> list[str]:
    """The outputs of another run that `path` holds; a summary.json that records only a failure before the run
    began (its status and error: a bad value, say) holds nothing to keep."""
    held = [name for name in RUN_OUTPUTS if (path / name).exists()]
    if held == ["summary.json"] and _failed_before_it_began(path / "summary.json"):
        return []
    return held


def _failure(job: Path) -> str | None:
    """The one-line error a job's summary.json records where it failed (a job run in another process: a launcher's)."""
    import json

    try:
        record = json.loads((job / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return record.get("error", "failed") if isinstance(record, dict) and record.get("status") == "failed" else None


def _failed_before_it_began(summary: Path) -> bool:
    import json

    try:
        record = json.loads(summary.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and set(record) <= {"status", "error"} and record.get("status") == "failed"


def guard_run_dirs(config: DictConfig) -> None:
    dirs = run_dirs(config)
    for key, path in dirs:
        check_fresh(key, path, resuming(config))
    for _, path in dirs:
        take(path)


def check_fresh(key: str, path: Path, resume: bool) -> None:
    """`path` can be written, and holds no other run's outputs unless the run continues there."""
    check_writable(key, path)
    if not resume and (held := held_outputs(path)):
        raise ConfigError(
            f"{key}={str(path)!r} holds another run's outputs ({', '.join(held)}): resume=auto continues that "
            "run; give a new dir for a new one"
        )


def take(path: Path) -> None:
    from rloo.utils import ownership

    ownership.take(path, log=lambda line: print(line, file=sys.stderr))


def guard_sweep_dir(config: DictConfig) -> None:
    sweep = resolved_dir(config, "hydra.sweep.dir")
    check_writable("hydra.sweep.dir", sweep)
    if not resuming(config) and sweep.is_dir():
        jobs = sorted(job.name for job in sweep.iterdir() if job.is_dir() and held_outputs(job))
        if jobs:
            raise ConfigError(
                f"hydra.sweep.dir={str(sweep)!r} holds another sweep's runs ({', '.join(jobs[:3])}"
                f"{', ...' if len(jobs) > 3 else ''}): resume=auto continues each; give a new dir for a new sweep"
            )
    take(sweep)
