"""The only place rloo reaches into Hydra past its documented API, for the three things that API does not offer:
its flags' argument parser, a run of a task function on a command line other than sys.argv (the entry points hand
Hydra the command line as rloo expands it, sys.argv left as the user typed it), and a config loader whose search path
has a --config-dir as Hydra's main adds it. pyproject.toml pins hydra-core to the minor versions these calls are
tested against (TESTED_HYDRA); tests/test_cli.py fails on a Hydra whose internals moved.

Everything else goes through Hydra's public API: its override parser (hydra.core.override_parser), the compose API,
and callbacks (rloo.run.run_dir_guard).
"""

from __future__ import annotations

import argparse
import os

TESTED_HYDRA = "1.3"  # hydra-core's minor version these calls are written against (pyproject: >=1.3.2,<1.4)


def args_parser() -> argparse.ArgumentParser:
    """Hydra's parser of its flags (--config-dir, -m, --cfg, --info ...) and its overrides."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


def run_hydra(argv: list[str], task_function, config_dir: str, config_name: str) -> None:
    """What `@hydra.main` does with sys.argv, with `argv`: parse it with Hydra's parser and run `task_function`
    (the undecorated function) once, or once per job of a multirun."""
    from hydra._internal.utils import _run_hydra

    parser = args_parser()
    _run_hydra(
        args=parser.parse_intermixed_args(argv),  # flags and overrides in any order, as rloo's checks read them
        args_parser=parser,
        task_function=task_function,
        config_path=config_dir,  # absolute: joined to the task function's dir, it stays itself
        config_name=config_name,
    )


def config_loader(conf_dir: str, config_dir: str | None):
    """Hydra's config loader along rloo's conf/ and a command line's --config-dir, prepended as Hydra's main does
    (its options take precedence over conf/'s)."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.config_search_path import SearchPathQuery

    search_path = create_config_search_path(conf_dir)
    if config_dir is not None:
        absolute = os.path.abspath(os.path.expanduser(config_dir))
        search_path.prepend(provider="command-line", path=f"file://{absolute}", anchor=SearchPathQuery("schema"))
    return ConfigLoaderImpl(config_search_path=search_path)
