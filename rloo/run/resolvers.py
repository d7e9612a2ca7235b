"""The OmegaConf resolvers conf/ uses: W&B offline unless set up, a multirun's W&B group and job name, run dirs that
two runs never share, and where a resumed run writes Hydra's files."""

from __future__ import annotations

import netrc
import os
from pathlib import Path

from omegaconf import OmegaConf

from rloo.utils.errors import ConfigError


def wandb_offline() -> bool:
    """Offline unless the user has set W&B up, so that a run never waits on a network that is not there."""
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode:
        return mode in ("offline", "dryrun", "disabled")
    if os.environ.get("WANDB_API_KEY"):
        return False
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is None
    except (FileNotFoundError, netrc.NetrcParseError):
        return True


def multirun_hydra_config():
    """Hydra's config of this job where it is one job of a multirun, else None (a single run, or no Hydra)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return HydraConfig.get()


def sweep_group() -> str | None:
    """The W&B group of a multirun job: the sweep's config name and start time (k_clip-2026-12-03-08-30-00),
    shared by all its jobs; None for a single run."""
    if (hydra_cfg := multirun_hydra_config()) is None:
        return None
    sweep_dir = Path(hydra_cfg.sweep.dir)
    return f"{hydra_cfg.job.config_name}-{sweep_dir.parent.name}-{sweep_dir.name}"


def sweep_job_name() -> str | None:
    """The W&B run name of a multirun job: its number and overrides, as its dir; None for a single run."""
    if (hydra_cfg := multirun_hydra_config()) is None:
        return None
    job = hydra_cfg.job
    return f"{job.num}_{one_dir_name(job.override_dirname)}"


def sweep_setting() -> str | None:
    """The W&B job type of a multirun job: its overrides without seed=, so that W&B groups a setting's seeds
    (k=4,clip_range=0.2); None for a single run."""
    if (hydra_cfg := multirun_hydra_config()) is None:
        return None
    overrides = [o for o in hydra_cfg.overrides.task if not o.lstrip("+~").startswith(("seed=", "hydra."))]
    return one_dir_name(",".join(overrides))[:64] or "defaults"  # W&B caps a job type at 64 characters


def one_dir_name(text: str) -> str:
    """A multirun job's overrides as one dir name: a path-valued override (data.train.path=/a/b.jsonl) would
    otherwise nest the job dir, where rloo.report finds no job. '/' becomes '%2F', as in a URL; the name is capped at
    200 characters (a file system allows 255) with a hash of the whole kept, so that distinct jobs stay distinct."""
    import hashlib

    name = text.replace("%", "%25").replace("/", "%2F")
    if len(name) > 200:
        name = f"{name[:180]}-{hashlib.sha1(name.encode()).hexdigest()[:12]}"
    return name


def unique_dir(path: str) -> str:
    """`path`, or `path_2`, `path_3`, ... : the first that did not exist, created here so that two runs started in
    the same second (or on two machines sharing the disk) never share a dir. Cached: resolved once per run."""
    for n in range(1, 10_000):
        candidate = Path(path if n == 1 else f"{path}_{n}")
        try:
            candidate.mkdir(parents=True)
            return str(candidate)
        except FileExistsError:
            continue
    raise ConfigError(f"hydra.run.dir: {path} and 9999 variants exist already")


def run_dir(resume: str | None, fresh: str) -> str:
    """hydra.run.dir: the run dir `resume=` continues, else a new unique one."""
    from rloo.utils.resume import run_dir_of

    return run_dir_of(resume) or unique_dir(fresh)


def hydra_subdir(resume: str | None, now: str) -> str:
    """hydra.output_subdir: .hydra, or for a resumed run .hydra/resumed-HH-MM-SS, so the first run's is kept."""
    return ".hydra" if resume is None else f".hydra/resumed-{now}"


def arithmetic_split(cache_dir: str, split: str) -> str:
    """data=arithmetic's split files, generated into the cache on first use (rloo.toy.arithmetic)."""
    from rloo.toy.arithmetic import split_path

    return split_path(cache_dir, split)


def word_problems_split(cache_dir: str, split: str) -> str:
    """data=word_problems's split files, generated into the cache on first use (rloo.toy.word_problems)."""
    from rloo.toy.word_problems import split_path

    return split_path(cache_dir, split)


def register_resolvers() -> None:
    for name, resolver in (
        ("wandb_offline", wandb_offline),
        ("sweep_group", sweep_group),
        ("sweep_job_name", sweep_job_name),
        ("sweep_setting", sweep_setting),
        ("one_dir_name", one_dir_name),
        ("unique_dir", unique_dir),
        ("run_dir", run_dir),
        ("hydra_subdir", hydra_subdir),
        ("arithmetic_split", arithmetic_split),
        ("word_problems_split", word_problems_split),
    ):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, resolver, use_cache=name in ("unique_dir", "run_dir"))
