"""The command line of a `python -m rloo.*` entry point as Hydra reads it, before Hydra runs: its flags by Hydra's own
argument parser, every `key=value` by Hydra's override parser (quotes, escapes, sweeps and `~`/`+` as Hydra takes
them), and the config groups by Hydra's config loader along the command line's search path (rloo's conf/, then
--config-dir, then hydra.searchpath, in Hydra's order). Nothing here splits a string.

On top, rloo's conventions: `group=none` leaves an optional group out, and `model=X` alone runs the model's published
recipe (the experiment that selects it). The value every guard reads is the value Hydra will use.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from omegaconf import open_dict

from rloo.run import hydra_internals
from rloo.utils.errors import ConfigError
from rloo.utils.keys import CONF_DIR

OPTIONAL_GROUPS = ("experiment", "debug", "bootstrap")  # group=none (or null) runs without one
NOT_CHOICES = ("hydra", "paths")  # groups of conf/ that a command line does not choose an option of


FLAGS_GO = (
    "key=value overrides, or Hydra's flags (--help lists them; a flag's value, as in --config-dir DIR, follows it)"
)


def hydra_arguments() -> argparse.ArgumentParser:
    """Hydra's own parser of its flags (--config-dir, -m, --cfg, --info ...), its errors one line."""
    parser = hydra_internals.args_parser()

    def error(message: str):
        raise ConfigError(f"{message}: {FLAGS_GO}")

    parser.error = error
    return parser


@dataclass
class CommandLine:
    """A command line as Hydra reads it: its flags and its overrides, each parsed by Hydra."""

    flags: argparse.Namespace
    overrides: list[Override]

    @classmethod
    def parse(cls, argv: list[str]) -> "CommandLine":
        flags = hydra_arguments().parse_intermixed_args(argv)  # flags and overrides in any order, as Hydra's docs
        parser = OverridesParser.create()
        overrides = []
        for line in flags.overrides:
            try:
                overrides += parser.parse_overrides([line])
            except Exception:  # Hydra's OverrideParseException, several lines long
                raise ConfigError(
                    f"{line!r} is not an override: write key=value (e.g. k=4), group=option (e.g. algo=ppo) or ~key "
                    "(Hydra's grammar: quote a value with spaces or special characters, 'like this')"
                ) from None
        return cls(flags, overrides)

    @property
    def lines(self) -> list[str]:
        return [override.input_line for override in self.overrides]

    @property
    def multirun(self) -> bool:
        return bool(self.flags.multirun)

    @property
    def prints_only(self) -> bool:
        """Hydra prints the config, its info or help and runs nothing."""
        flags = self.flags
        return bool(flags.cfg or flags.info or flags.help or flags.hydra_help or flags.shell_completion)

    def given(self, key: str) -> Override | None:
        """The last override that sets `key` (Hydra applies them in order), or None."""
        found = [o for o in self.overrides if o.key_or_group == key and o.type != OverrideType.DEL]
        return found[-1] if found else None

    def value(self, key: str):
        """The value Hydra will give `key` from this command line (unquoted and unescaped as Hydra does); None where
        the command line does not set it."""
        override = self.given(key)
        return None if override is None or override.is_sweep_override() else override.value()

    def choices(self, override: Override) -> list[str]:
        """Every value an override takes: one, or each of a sweep's (a,b / choice(...) / range(...))."""
        if override.is_sweep_override():
            return list(override.sweep_string_iterator())
        value = override.value()
        return ["null" if value is None else str(value)]

    @cached_property
    def configs(self) -> "ConfigTree":
        return ConfigTree(
            self.flags.config_dir, [o.input_line for o in self.overrides if o.key_or_group == "hydra.searchpath"]
        )


class ConfigTree:
    """rloo's conf/ with a command line's --config-dir and hydra.searchpath, read by Hydra's config loader."""

    def __init__(self, config_dir: str | None = None, searchpath_overrides: list[str] | None = None):
        if config_dir is not None and not os.path.isdir(os.path.expanduser(config_dir)):
            raise ConfigError(f"--config-dir={config_dir}: {os.path.abspath(config_dir)} is not a dir")
        self.loader = hydra_internals.config_loader(str(CONF_DIR), config_dir)
        self.searchpath = searchpath_overrides or []

    def options(self, group: str) -> list[str]:
        """The options of a config group along the search path."""
        return sorted(self.loader.get_group_options(group, config_name="train", overrides=self.searchpath))

    def groups(self) -> list[str]:
        """The config groups a command line chooses an option of (algo, model, experiment ..., and nested ones of a
        --config-dir such as rloo_to_grpo/std)."""
        found, parents = [], [""]
        while parents:
            parent = parents.pop()
            for name in self.loader.list_groups(parent):
                path = f"{parent}/{name}" if parent else name
                if path not in NOT_CHOICES:
                    found.append(path)
                    parents.append(path)
        return found

    @cached_property
    def dirs(self) -> list[Path]:
        """The dirs of the search path, in Hydra's order (a pkg:// entry as its package's dir; Hydra's own left out):
        the loader's sources, then the last hydra.searchpath override's entries, which Hydra appends."""
        entries = [f"{s.scheme()}://{s.path}" for s in self.loader.get_sources() if s.provider != "hydra"]
        if self.searchpath:
            entries += [str(e) for e in OverridesParser.create().parse_overrides(self.searchpath[-1:])[0].value()]
        dirs = []
        for entry in entries:
            scheme, _, path = entry.partition("://")
            dirs += [Path(path)] if scheme == "file" else _package_dir(path) if scheme == "pkg" else []
        return dirs

    def defaults(self, overrides: list[str]):
        """Hydra's defaults list of conf/train.yaml under `overrides` (which config each group composes)."""
        from hydra.types import RunMode

        return self.loader.compute_defaults_list("train", self.searchpath + overrides, RunMode.RUN)

    def compose(self, overrides: list[str], config_name: str = "train"):
        """A config as Hydra composes it (its `hydra` node left out)."""
        from hydra.types import RunMode

        cfg = self.loader.load_configuration(config_name, self.searchpath + overrides, RunMode.RUN)
        with open_dict(cfg):
            cfg.pop("hydra", None)
        return cfg

    def describe(self, group: str) -> str:
        """Where a group's options are looked for, for a one-line error."""
        return " or ".join(f"rloo's conf/{group}/" if d == CONF_DIR else f"{d / group}/" for d in self.dirs)

    def recipe_of(self, model: str) -> str | None:
        """The experiment `model=<model>` runs: of the single-turn ones that select the model (themselves or through
        the recipe they build on), the one no other builds on (tldr_pythia1b, rloo's recipe on top of TRL's
        published ones). A multi-turn recipe (one that chooses an env=) is run by its name only
        (experiment=calculator_smollm2)."""
        default = self.defaults([]).overrides.known_choices.get("model")
        selects, bases = {}, {}
        for option in self.options("experiment"):
            defaults = self.defaults([f"experiment={option}"])
            choices = defaults.overrides.known_choices
            selects[option] = choices.get("model") if choices.get("env") in (None, "none") else None
            paths = {d.config_path for d in defaults.defaults if d.config_path}
            bases[option] = {p.split("/", 1)[1] for p in paths if p.startswith("experiment/")} - {option}
        candidates = [o for o, chosen in selects.items() if chosen == model and chosen != default]
        built_on = set().union(*(bases[o] for o in candidates)) if candidates else set()
        tops = [o for o in candidates if o not in built_on]
        return tops[0] if len(tops) == 1 else None


def _package_dir(package: str) -> list[Path]:
    """The dir of an installed package named by a pkg:// entry (none where it is not installed)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(package.strip("/").replace("/", "."))
    except (ImportError, ValueError):
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])][:1] if spec else []
