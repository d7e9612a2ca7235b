"""What a config key is, as a field of a dataclass: its resume policy and its range or choices (`key`), an open group
of keys (`group`), or a field no key sets (`derived`). rloo.config.schema walks a composed config against such
fields; the algorithms' config classes (rloo/algorithms/configs.py) declare their keys with them. And a key that does
nothing where it is set is refused (`refuse_inert`). It imports nothing of rloo but its errors.
"""

from __future__ import annotations

from dataclasses import field
from functools import lru_cache
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rloo.utils.errors import ConfigError

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

# a resume that changes a FIXED key is refused; an APPLIED key takes effect from the resumed rollout on
FIXED, APPLIED = "fixed", "applied"


def key(
    resume: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    choices: tuple | None = None,
):
    """A key's field: its resume policy and its range ([low, high], or (low, high] with low_open) or choices."""
    return field(metadata={"resume": resume, "low": low, "high": high, "low_open": low_open, "choices": choices})


def derived():
    """A field of an algorithm's config that no key sets: rloo.config.checks.algorithm_config makes it (the sampling
    settings, the number of rollouts). The schema leaves it out."""
    return field(metadata={"derived": True})


def group(resume: str):
    """An open group: any keys below it (Lightning Trainer arguments, logger and judge settings), one policy."""
    return field(metadata={"resume": resume, "open": True})


def looks_local(value: str) -> bool:
    """A config value that names a local path (not a hub id): it starts as a path does, or ends as a data file."""
    return value.startswith((".", "/", "~")) or Path(value).suffix in (".jsonl", ".json", ".parquet", ".csv", ".arrow")


def settings(cls: type, node, **given):
    """The settings dataclass `cls` from a checked config node: the fields in `given` as given, every other read
    from `node` by its own name (a field with a default may be absent there). A runtime setting is thus a key of the
    schema by name, never a copy of one under another; tests/test_config.py holds each class to the schema."""
    from dataclasses import MISSING, fields

    values = {}
    for f in fields(cls):
        if f.name in given:
            values[f.name] = given[f.name]
        elif f.name in node:
            values[f.name] = node[f.name]
        elif f.default is MISSING and f.default_factory is MISSING:
            raise KeyError(f"{cls.__name__}.{f.name}: no config key of that name and nothing given")
    unknown = set(given) - {f.name for f in fields(cls)}
    if unknown:
        raise TypeError(f"{cls.__name__} has no field {sorted(unknown)[0]!r}")
    return cls(**values)


def refuse_inert(cfg: DictConfig, key: str, setting: str, what_it_does: str, defaults: str = "train") -> None:
    """`key` does nothing under `setting`: set away from its value in `defaults` (a config of conf/ as Hydra composes it
    alone: "train", or "algo/<name>" for an algorithm's own values), it is refused rather than ignored."""
    value, default = OmegaConf.select(cfg, key), OmegaConf.select(composed_defaults(defaults), key)
    if value is not None and value != default:
        raise ConfigError(f"{key}={value} does nothing with {setting} ({what_it_does}); remove it")


@lru_cache(maxsize=None)
def composed_defaults(config_name: str) -> DictConfig:
    """conf/<config_name>.yaml composed by Hydra with no override: each group's default placed as Hydra places it.
    Inside a Hydra run, along that run's search path; elsewhere, from rloo's conf/."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return compose(config_name)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name)
