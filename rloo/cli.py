"""One command-line habit for every `python -m rloo.*` entry point: `--help` prints usage and exits 0; a bad
argument is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import sys

# Hydra's own flags (hydra/_internal/utils.py get_args_parser); those taking a value list it
HYDRA_FLAGS = {"--help": False, "-h": False, "--hydra-help": False, "--version": False, "--cfg": True, "-c": True,
               "--resolve": False, "--package": True, "-p": True, "--run": False, "-r": False, "--multirun": False,
               "-m": False, "--shell-completion": False, "-sc": False, "--config-path": True, "-cp": True,
               "--config-name": True, "-cn": True, "--config-dir": True, "-cd": True, "--experimental-rerun": True,
               "--info": False, "-i": False}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line naming it (no usage block)."""

    def error(self, message: str):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def hydra_argument_error(argv: list[str]) -> str | None:
    """What a Hydra entry point would answer with a usage block or a traceback, as one line (None: nothing)."""
    expects_value = False
    for arg in argv:
        if expects_value:
            expects_value = False
            continue
        name = arg.partition("=")[0] if arg.startswith("--") else arg
        if arg.startswith("-"):
            if name not in HYDRA_FLAGS:
                return f"unknown option {arg}: key=value overrides, or Hydra's flags (--help lists them)"
            expects_value = HYDRA_FLAGS[name] and "=" not in arg
        elif "=" not in arg and not arg.startswith("~"):
            return f"{arg!r} is not an override: write key=value (e.g. k=4), group=option (e.g. algo=ppo) or ~key"
    return None
