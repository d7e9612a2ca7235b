"""The command line of every `python -m rloo.*` entry point, before and around Hydra: `--help` prints usage and
exits 0; a bad argument, an unknown group option or a key the chosen algorithm does not read is one line on stderr
and exit status 2; `model=X` selects its recipe and `group=none` drops an optional group; a job's failure ends
the job (exit 1 or 2) or, in a multirun, only that job.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rloo.utils.errors import CTRL_C_EXIT_CODE, ConfigError, stopped_by_ctrl_c

# Hydra's own flags (hydra/_internal/utils.py get_args_parser); those taking a value list it
HYDRA_FLAGS = {
    "--help": False,
    "-h": False,
    "--hydra-help": False,
    "--version": False,
    "--cfg": True,
    "-c": True,
    "--resolve": False,
    "--package": True,
    "-p": True,
    "--run": False,
    "-r": False,
    "--multirun": False,
    "-m": False,
    "--shell-completion": False,
    "-sc": False,
    "--config-path": True,
    "-cp": True,
    "--config-name": True,
    "-cn": True,
    "--config-dir": True,
    "-cd": True,
    "--experimental-rerun": True,
    "--info": False,
    "-i": False,
}


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


# ---- config groups and overrides --------------------------------------------------------------------------
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
CHOICE_GROUPS = ("model", "data", "judge", "precision", "trainer", "logger", "algo", "experiment", "debug", "bootstrap")


def config_dirs(argv: list[str]) -> tuple[Path, ...]:
    """Where Hydra looks for a group's options, in its order: a --config-dir (before conf/), conf/, then each entry
    of a `hydra.searchpath=[...]` override (file:// or pkg://), as Hydra documents them."""
    dirs: list[Path] = []
    for i, arg in enumerate(argv):
        name, sep, value = arg.partition("=")
        if name in ("--config-dir", "-cd"):
            value = value if sep else (argv[i + 1] if i + 1 < len(argv) else "")
            dirs.append(Path(value).expanduser().resolve())
    dirs.append(CONF_DIR)
    for arg in argv:
        if arg.startswith("hydra.searchpath="):
            dirs += [d for d in map(_search_entry_dir, _override_list(arg)) if d is not None]
    return tuple(dirs)


def _override_list(arg: str) -> list[str]:
    """The list a `key=[a,b]` override gives, parsed as Hydra parses it ([] where it is not a list)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        value = OverridesParser.create().parse_overrides([arg])[0].value()
    except Exception:  # Hydra names a malformed override itself
        return []
    return [str(v) for v in value] if isinstance(value, list) else []


def _search_entry_dir(entry: str) -> Path | None:
    """The dir of a search-path entry: file://<dir> (or a bare dir), pkg://<package>; None for a package that is not
    installed (a dir that is not there offers no options)."""
    import importlib.util

    if entry.startswith("pkg://"):
        try:
            spec = importlib.util.find_spec(entry.removeprefix("pkg://").strip("/").replace("/", "."))
        except (ImportError, ValueError):
            return None
        locations = list(spec.submodule_search_locations or []) if spec else []
        return Path(locations[0]) if locations else None
    return Path(entry.removeprefix("file://")).expanduser().resolve()


def group_options(group: str, dirs: tuple[Path, ...] = (CONF_DIR,)) -> list[str]:
    """The options of a config group across the search path `dirs` (config_dirs)."""
    return sorted({p.stem for d in dirs for p in (d / group).glob("*.yaml")})


def config_file(group: str, option: str, dirs: tuple[Path, ...] = (CONF_DIR,)) -> Path:
    """The file Hydra composes for `group=option`: the first along the search path."""
    files = [d / group / f"{option}.yaml" for d in dirs]
    return next((f for f in files if f.is_file()), CONF_DIR / group / f"{option}.yaml")


def _group_dirs(group: str, dirs: tuple[Path, ...]) -> str:
    return " or ".join(f"rloo's conf/{group}/" if d == CONF_DIR else f"{d / group}/" for d in dirs)


OPTIONAL_GROUPS = ("experiment", "debug", "bootstrap")  # group=none (or null) runs without one


def group_table() -> str:
    """The config groups as a markdown table, made from conf/ itself: each group of conf/train.yaml's defaults list
    in its order, its options (the default first, `none` where the group may be left out) and the comment that
    documents it there. The README and docs/configuration.md carry it between `<!-- groups -->` markers
    (`write_group_tables`; tests/test_docs.py holds them to it)."""
    rows = ["| group | options | what it is |", "|---|---|---|"]
    pattern = re.compile(r"^  - (\w+): (\S+)\s+# (.*)$")
    for line in (CONF_DIR / "train.yaml").read_text().splitlines():
        match = pattern.match(line)
        if match is None or match.group(1) not in CHOICE_GROUPS:
            continue
        group, default, comment = match.groups()
        options = [f"`{default}` (default)"] if default != "null" else []
        options += [f"`{option}`" for option in group_options(group) if option != default]
        options += ["`none`"] if group in OPTIONAL_GROUPS else []
        rows.append(f"| `{group}/` | {', '.join(options)} | {comment} |")
    return "\n".join(rows) + "\n"


GROUP_TABLE_MARKERS = ("<!-- groups: made by rloo.run.cli.group_table -->\n", "<!-- /groups -->\n")
GROUP_TABLE_PAGES = ("README.md", "docs/configuration.md")


def write_group_tables() -> None:
    """Write group_table() between the markers of each page in GROUP_TABLE_PAGES."""
    begin, end = GROUP_TABLE_MARKERS
    for page in GROUP_TABLE_PAGES:
        path = CONF_DIR.parent / page
        text = path.read_text()
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        path.write_text(head + begin + group_table() + end + tail)


def check_group_choices(argv: list[str], dirs: tuple[Path, ...] = (CONF_DIR,)) -> None:
    """Name the allowed options for `group=value` overrides (along the search path `dirs`) before Hydra prints its
    multi-line error."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep or key not in CHOICE_GROUPS:
            continue
        allowed = group_options(key, dirs)
        for choice in value.split(","):  # multirun: model=a,b
            if choice not in allowed and not (key in OPTIONAL_GROUPS and choice in ("none", "null")):
                extra = ", none" if key in OPTIONAL_GROUPS else ""
                raise ConfigError(
                    f"{key}={choice!r} is not a config in {_group_dirs(key, dirs)}: choose one of "
                    f"{', '.join(allowed)}{extra}"
                )


def _experiment_defaults(option: str, dirs: tuple[Path, ...] = (CONF_DIR,)) -> tuple[list[str], str | None]:
    """The experiments `option` builds on (plain entries of its defaults) and the model it selects itself."""
    defaults = OmegaConf.load(config_file("experiment", option, dirs)).get("defaults") or []
    bases = [str(d) for d in defaults if isinstance(d, str) and d != "_self_"]
    model = next((d.get("override /model") for d in defaults if OmegaConf.is_dict(d) and "override /model" in d), None)
    return bases, model


def recipe_of(model: str, dirs: tuple[Path, ...] = (CONF_DIR,)) -> str | None:
    """The experiment `model=<model>` runs: of those that select the model (themselves or through the recipe they
    build on: experiment/tldr_pythia1b_trl09.yaml has `override /model: pythia1b`), the one no other builds on
    (tldr_pythia1b, rloo's recipe on top of TRL's published ones)."""
    options = {option: _experiment_defaults(option, dirs) for option in group_options("experiment", dirs)}

    def selected(option: str) -> str | None:
        bases, own = options[option]
        return own or next((m for m in map(selected, bases) if m), None)

    candidates = [option for option in options if selected(option) == model]
    built_on = {base for option in candidates for base in options[option][0]}
    tops = [option for option in candidates if option not in built_on]
    return tops[0] if len(tops) == 1 else None


def expand_overrides(argv: list[str], say=None, dirs: tuple[Path, ...] = (CONF_DIR,)) -> list[str]:
    """The command line as Hydra composes it: `bootstrap=none` (experiment, debug) is Hydra's `=null`, and
    `model=pythia1b` without an experiment also selects the model's published recipe (experiment=tldr_pythia1b),
    said on stderr; `experiment=none` keeps the model alone."""
    out, given = [], {arg.partition("=")[0].lstrip("+~") for arg in argv if "=" in arg}
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in OPTIONAL_GROUPS and value in ("none", "null"):
            if key == "bootstrap":  # the others are null by default
                out.append("~bootstrap")
            continue
        out.append(arg)
        if key == "model" and "," not in value and "experiment" not in given and (recipe := recipe_of(value, dirs)):
            out.append(f"experiment={recipe}")  # beside it: Hydra's flags (--cfg job) may follow the overrides
            if say:
                say(f"rloo: model={value} runs its recipe, experiment={recipe} (experiment=none: the model alone)")
    return out


def algorithms_of(argv: list[str], dirs: tuple[Path, ...] = (CONF_DIR,)) -> list[str]:
    """The `algorithm` each `algo=` option of the command line sets (rloo by default; rloo_k2 is rloo)."""
    options = next((arg.partition("=")[2].split(",") for arg in argv if arg.startswith("algo=")), ["rloo"])
    algorithms, known = [], group_options("algo", dirs)
    for option in options:
        while option in known:
            node = OmegaConf.load(config_file("algo", option, dirs))
            if "algorithm" in node:
                algorithms.append(node.algorithm)
                break
            option = next((d for d in node.get("defaults") or [] if isinstance(d, str) and d in known), None)
    return algorithms


def check_override_keys(argv: list[str], dirs: tuple[Path, ...] = (CONF_DIR,)) -> None:
    """`key=value` overrides of keys the chosen algorithm does not read, or that no config has, in one line
    (Hydra's own error spans lines and suggests `+key`, which would make a key that does nothing)."""
    from rloo.config.schema import resume_policy, unknown_key_error

    for algorithm in algorithms_of(argv, dirs):
        for arg in argv:
            key, sep, _ = arg.partition("=")
            if not sep or arg.startswith(("-", "+", "~", "hydra.")) or key in CHOICE_GROUPS:
                continue
            if resume_policy(key, algorithm) is None:  # the schema does not know it for this algorithm
                raise unknown_key_error(key, algorithm)


def check_added_keys(argv: list[str]) -> None:
    """rloo.evaluate, rloo.sft, rloo.reward: a `+key` adds a key no config has, which nothing reads, except a
    plug-in judge's own arguments (+judge.<name>=...) and Hydra's settings."""
    for arg in argv:
        key, sep, _ = arg.partition("=")
        if sep and key.startswith("+") and not key.lstrip("+").startswith(("judge.", "hydra.")):
            raise ConfigError(
                f"{key.lstrip('+')} is not a config key of this entry point (+key adds a key nothing reads; only "
                "+judge.<argument> for a plug-in judge)"
            )


def compose_train_config(overrides: list[str]) -> DictConfig:
    """conf/train.yaml with command-line style overrides, outside a Hydra run (the benchmark worker, tests)."""
    from hydra import compose, initialize_config_dir

    from rloo.run.resolvers import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=expand_overrides(overrides))


# ---- the run dir ----------------------------------------------------------------------------------------------
RUN_OUTPUTS = ("summary.json", "checkpoints", "policy", "csv", "verdicts.jsonl", "reward_model")  # any entry point's
RUN_DIR_KEYS = ("hydra.run.dir", "paths.output_dir")


def further_rank() -> bool:
    """This process is a rank other than the first of a multi-process run: one Lightning launched into the run dir the
    first rank has begun writing (LOCAL_RANK), or one of several a scheduler started at once (NODE_RANK, RANK,
    SLURM_PROCID)."""
    import os

    return any(
        os.environ.get(name, "0") not in ("0", "") for name in ("LOCAL_RANK", "NODE_RANK", "RANK", "SLURM_PROCID")
    )


def prints_only(argv: list[str]) -> bool:
    """Hydra prints the config or help and runs nothing."""
    return any(arg.partition("=")[0] in ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help") for arg in argv)


def check_run_dir(argv: list[str]) -> None:
    """Before Hydra makes or writes into the run dir: the dir it will be in can be written (Hydra's own error is a
    traceback), and an explicit run dir that holds another run's outputs is refused unless `resume=` continues that
    run: a fresh run there would merge its metrics into the old timeline and overwrite its summary. The first rank
    alone checks that: the others join the dir it has begun."""
    import os

    if prints_only(argv):
        return  # Hydra prints and runs nothing: no run dir is made
    resuming = any(arg.startswith("resume=") and arg.partition("=")[2] not in ("null", "None", "") for arg in argv)
    explicit = [(key, value) for key, sep, value in (arg.partition("=") for arg in argv) if sep and key in RUN_DIR_KEYS]
    for key, value in explicit or [("hydra.run.dir", "outputs")]:
        if "${" in value:  # an interpolation: Hydra resolves it
            continue
        path = Path(value).expanduser()
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            where = f"{key}={value!r}" if explicit else "the run dir (outputs/ here)"
            raise ConfigError(f"{where}: {existing} is not a writable dir (a read-only file system or no permission)")
        if (
            explicit
            and not resuming
            and not further_rank()
            and (held := [n for n in RUN_OUTPUTS if (path / n).exists()])
        ):
            raise ConfigError(
                f"{key}={value!r} holds another run's outputs ({', '.join(held)}): resume=auto continues that run; "
                "give a new dir for a new one"
            )


# ---- entry points ---------------------------------------------------------------------------------------------
def preflight(argv: list[str], train: bool = True, say=None) -> list[str]:
    """What the command line alone tells, before Hydra composes or makes a run dir: the expanded overrides, or a
    ConfigError for an unknown group option, a key the algorithm does not read, a resume= that is not there, or a run
    dir that cannot be written or holds another run (check_run_dir)."""
    dirs = config_dirs(argv)
    argv = expand_overrides(argv, say, dirs) if train else argv
    check_group_choices(argv, dirs)
    if train:
        check_override_keys(argv, dirs)
    else:
        check_added_keys(argv)
    check_run_dir(argv)
    from rloo.utils.resume import check_resume_argument

    for arg in argv:
        if arg.startswith("resume="):
            check_resume_argument(arg.partition("=")[2])
    if train:
        own_named_run_dir(argv)
    return argv


def own_named_run_dir(argv: list[str]) -> None:
    """A run dir the command line names (hydra.run.dir, paths.output_dir, resume=<run dir>) is taken for this
    process before Hydra writes into it: refused while another live process trains there (rloo.utils.ownership). A
    multirun's jobs, and the ranks after the first, take or join theirs in the run itself."""
    from rloo.utils import ownership
    from rloo.utils.resume import run_dir_of

    if further_rank() or prints_only(argv) or any(arg in ("-m", "--multirun") for arg in argv):
        return
    named = dict(arg.partition("=")[::2] for arg in argv if "=" in arg)
    for value in (*(named.get(key) for key in RUN_DIR_KEYS), run_dir_of(named.get("resume"))):
        if value and "${" not in value:
            ownership.take(Path(value), log=lambda line: print(line, file=sys.stderr))


def run_entry_point(hydra_main, train: bool = False) -> None:
    """Shared by the `python -m rloo.X` entry points: one-line errors for unknown group options (and, for
    rloo.train, keys the chosen algorithm does not read), then Hydra."""
    try:
        if (problem := hydra_argument_error(sys.argv[1:])) is not None:
            raise ConfigError(problem)
        sys.argv[1:] = preflight(sys.argv[1:], train, say=lambda line: print(line, file=sys.stderr))
    except ConfigError as error:
        exit_on_config_error(error)
    from rloo.run.resolvers import register_resolvers

    register_resolvers()
    try:
        hydra_main()
    except (KeyboardInterrupt, SystemExit) as error:
        if not stopped_by_ctrl_c(error):
            raise
        print(f"{entry_point_name()}: stopped by Ctrl-C; exit {CTRL_C_EXIT_CODE}", file=sys.stderr)
        sys.exit(CTRL_C_EXIT_CODE)


def entry_point_name() -> str:
    """`rloo.train`, `rloo.evaluate`, ...: the module `python -m` runs."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name.removesuffix(".__main__") if spec is not None else "rloo"


class JobFailed(RuntimeError):
    """A multirun job's failure: raised (not exited) so that Hydra records this job as failed, runs the others,
    and ends the sweep with a non-zero status."""


def in_multirun() -> bool:
    from rloo.run.resolvers import multirun_hydra_config

    return multirun_hydra_config() is not None


def fail(error: Exception, code: int) -> None:
    """End the job on a one-line error: exit with `code` (2 for config errors, 1 for the rest), or in a multirun
    fail this job only."""
    print(f"error: {error}", file=sys.stderr)
    if in_multirun():
        raise JobFailed(str(error)) from None
    sys.exit(code)


def exit_on_config_error(error: ConfigError) -> None:
    fail(error, 2)
