"""The command line of every `python -m rloo.*` entry point, before and around Hydra: `--help` prints usage and
exits 0; a bad argument, an unknown group option or a key the chosen algorithm does not read is one line on stderr
and exit status 2; `model=X` selects its recipe and `group=none` drops an optional group; the run dir is checked and
taken where Hydra has made it final, before anything is written into it (rloo.run.run_dir_guard, a Hydra callback); a
job's failure ends the job (exit 1 or 2) or, in a multirun, only that job. Hydra parses every argument
(rloo.run.command_line): the value each check reads is the value Hydra will use; Hydra then runs on the command line
as expanded here, sys.argv left as typed (rloo.run.hydra_internals).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import sys
from pathlib import Path

from hydra.core.override_parser.types import OverrideType
from omegaconf import DictConfig

from rloo.run.command_line import OPTIONAL_GROUPS, CommandLine, ConfigTree
from rloo.utils.errors import CTRL_C_EXIT_CODE, ConfigError, stopped_by_ctrl_c
from rloo.utils.keys import CONF_DIR


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line naming it (no usage block)."""

    def error(self, message: str):
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


# ---- config groups and overrides --------------------------------------------------------------------------
def group_options(group: str) -> list[str]:
    """The options of a config group of rloo's conf/."""
    return ConfigTree().options(group)


def config_dirs(argv: list[str]) -> list[Path]:
    """The dirs of a command line's search path, in Hydra's order: rloo's conf/, --config-dir, hydra.searchpath."""
    return CommandLine.parse(argv).configs.dirs


def recipe_of(model: str) -> str | None:
    """The experiment `model=<model>` runs from rloo's conf/ (ConfigTree.recipe_of)."""
    return ConfigTree().recipe_of(model)


def group_table() -> str:
    """The config groups as a markdown table, made from conf/ itself: each group of conf/train.yaml's defaults list
    in its order, its options (the default first, `none` where the group may be left out) and the comment that
    documents it there. The README and docs/configuration.md carry it between `<!-- groups -->` markers
    (`write_group_tables`; tests/test_docs.py holds them to it)."""
    rows, tree = ["| group | options | what it is |", "|---|---|---|"], ConfigTree()
    groups = tree.groups()
    pattern = re.compile(r"^  - (\w+): (\S+)\s+# (.*)$")
    for line in (CONF_DIR / "train.yaml").read_text().splitlines():
        match = pattern.match(line)
        if match is None or match.group(1) not in groups:
            continue
        group, default, comment = match.groups()
        options = [f"`{default}` (default)"] if default != "null" else []
        options += [f"`{option}`" for option in tree.options(group) if option != default]
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


def check_group_choices(command: CommandLine) -> None:
    """Name the allowed options of each `group=option` (along the command line's search path) in one line, before
    Hydra prints its multi-line error."""
    tree = command.configs
    groups = tree.groups()
    for override in command.overrides:
        group = override.key_or_group
        if group not in groups or override.is_delete():
            continue
        allowed = tree.options(group)
        for choice in command.choices(override):
            if choice not in allowed and not (group in OPTIONAL_GROUPS and choice in ("none", "null")):
                extra = ", none" if group in OPTIONAL_GROUPS else ""
                raise ConfigError(
                    f"{group}={choice!r} is not a config in {tree.describe(group)}: choose one of "
                    f"{', '.join(allowed)}{extra}"
                )


def expand_overrides(argv: list[str], say=None) -> list[str]:
    """The command line as Hydra composes it: `bootstrap=none` (experiment, debug) is Hydra's `~bootstrap` (the
    others are left out: null by default), and `model=pythia1b` without an experiment also selects the model's
    published recipe (experiment=tldr_pythia1b), said on stderr; `experiment=none` keeps the model alone. Hydra's
    flags are kept as they are."""
    command = CommandLine.parse(argv)
    flags = list(argv)
    for line in command.flags.overrides:
        flags.remove(line)
    out = []
    for override in command.overrides:
        group = override.key_or_group
        if group in OPTIONAL_GROUPS and not override.is_sweep_override() and override.value() in ("none", None):
            out += ["~bootstrap"] if group == "bootstrap" and not override.is_delete() else []
            out += [override.input_line] if override.is_delete() else []
            continue
        out.append(override.input_line)
        model = override.value() if group == "model" and not override.is_sweep_override() else None
        if model and command.given("experiment") is None and (recipe := command.configs.recipe_of(str(model))):
            out.append(f"experiment={recipe}")
            if say:
                say(f"rloo: model={model} runs its recipe, experiment={recipe} (experiment=none: the model alone)")
    return flags + out


def check_override_keys(command: CommandLine) -> None:
    """`key=value` overrides of keys the chosen algorithm does not read, or that no config has, in one line (Hydra's
    own error spans lines and suggests `+key`, which would make a key that does nothing). The algorithm of each job
    is the `algorithm` its group choices compose to (Hydra's composition, each combination of a sweep's once)."""
    from rloo.config.schema import resume_policy, unknown_key_error

    tree = command.configs
    groups = set(tree.groups())
    chosen = [o for o in command.overrides if o.key_or_group in groups or o.key_or_group == "hydra.searchpath"]
    keys = [
        o.key_or_group
        for o in command.overrides
        if o.type == OverrideType.CHANGE and o.key_or_group not in groups and not o.key_or_group.startswith("hydra.")
    ]
    if not keys:
        return
    for combination in itertools.product(*([(o, c) for c in command.choices(o)] for o in chosen)):
        lines = [_choice_line(o, c) for o, c in combination if o.key_or_group != "hydra.searchpath"]
        try:
            # lines of the expanded command line (no recipe again), on the primary config (-cn) they override
            algorithm = tree.compose(lines, command.flags.config_name or "train").get("algorithm")
        except Exception as error:  # Hydra's composition error, several lines long: its first
            raise ConfigError(str(error).strip().splitlines()[0]) from None
        for key in keys:
            if resume_policy(key, algorithm) is None:  # the schema does not know it for this algorithm
                raise unknown_key_error(key, algorithm)


def _choice_line(override, choice: str) -> str:
    """One job's value of a group override, as an override Hydra parses (`~group` where it deletes)."""
    if override.is_delete():
        return override.input_line
    return f"{override.key_or_group}={choice}"


def check_added_keys(command: CommandLine) -> None:
    """rloo.evaluate, rloo.sft, rloo.reward: a `+key` adds a key no config has, which nothing reads, except a
    plug-in judge's own arguments (+judge.<name>=...) and Hydra's settings."""
    for override in command.overrides:
        key = override.key_or_group
        if override.is_add() and not key.startswith(("judge.", "hydra.")):
            raise ConfigError(
                f"{key} is not a config key of this entry point (+key adds a key nothing reads; only "
                "+judge.<argument> for a plug-in judge)"
            )


def compose_train_config(overrides: list[str]) -> DictConfig:
    """conf/train.yaml with command-line style overrides, outside a Hydra run (the benchmark worker, tests)."""
    from hydra import compose, initialize_config_dir

    from rloo.run.resolvers import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("train", overrides=expand_overrides(overrides))


# ---- the run dir (checked and taken where Hydra's dir is final: rloo.run.run_dir_guard) ------------------------
def further_rank() -> bool:
    """This process is a rank other than the first of a multi-process run: one Lightning launched into the run dir the
    first rank has begun writing (LOCAL_RANK), or one of several a scheduler started at once (NODE_RANK, RANK,
    SLURM_PROCID)."""
    import os

    return any(
        os.environ.get(name, "0") not in ("0", "") for name in ("LOCAL_RANK", "NODE_RANK", "RANK", "SLURM_PROCID")
    )


def named_run_dir(command: CommandLine) -> Path | None:
    """The run dir the command line names in hydra.run.dir, unquoted and unescaped by Hydra's parser and its
    interpolations resolved where OmegaConf resolves them alone (${oc.env:...}); None where it names none or its
    value needs the run (${now:...})."""
    value = command.value("hydra.run.dir")
    if value is None or "${" in str(value) and (value := _resolved(str(value))) is None:
        return None
    return Path(str(value)).expanduser()


def _resolved(value: str) -> str | None:
    from omegaconf import OmegaConf

    try:
        return str(OmegaConf.create({"value": value}).value)
    except Exception:  # an interpolation only the running Hydra resolves, or one that fails (the guard says so)
        return None


# ---- entry points ---------------------------------------------------------------------------------------------
def preflight(argv: list[str], train: bool = True, say=None) -> list[str]:
    """What the command line alone tells, before Hydra composes: the expanded command line, or a ConfigError for a
    bad argument, an unknown group option, a key the algorithm does not read or a resume= that is not there. The run
    dir is checked and taken where Hydra has made it final (rloo.run.run_dir_guard)."""
    from rloo.utils.resume import check_resume_argument

    argv = expand_overrides(with_the_runs_own_overrides(argv, say), say) if train else list(argv)
    command = CommandLine.parse(argv)
    check_group_choices(command)
    if train:
        check_override_keys(command)
    else:
        check_added_keys(command)
    resume = command.value("resume")
    check_resume_argument(None if resume is None else str(resume))
    return argv


SAVED_OVERRIDES = Path(".hydra") / "overrides.yaml"  # a run's first session's overrides, as Hydra saves them


def resumed_run_dir(command: CommandLine) -> Path | None:
    """The run dir a command line continues: resume=<run dir> (or a checkpoint in its checkpoints/), or resume=auto
    in the run dir it names; None for a fresh run."""
    from rloo.utils.resume import run_dir_of

    resume = command.value("resume")
    if resume in (None, "null", "None", ""):
        return None
    if str(resume) == "auto":
        return named_run_dir(command)
    found = run_dir_of(str(resume))
    return Path(found) if found else None


def with_the_runs_own_overrides(argv: list[str], say=None) -> list[str]:
    """A resume continues with the run's own settings: the overrides its first session was composed from
    (<run dir>/.hydra/overrides.yaml, which Hydra writes and rloo.fit writes too) come first, and the command line's
    after them, so that a key given again is the command line's (compare_with_resumed_run then refuses a fixed one
    that differs). The config dir the run was composed with (--config-dir) joins Hydra's search path unless the
    command line names one. Hydra parses every line; a multirun and a fresh run are left as they are."""
    command = CommandLine.parse(argv)
    run_dir = None if command.multirun or command.prints_only else resumed_run_dir(command)
    if run_dir is None or not (run_dir / SAVED_OVERRIDES).is_file():
        return list(argv)
    saved = saved_overrides(run_dir)
    given = {o.key_or_group for o in command.overrides}
    try:
        parsed = CommandLine.parse(saved).overrides
    except ConfigError as error:
        raise ConfigError(f"{run_dir / SAVED_OVERRIDES} is damaged: {error}") from None
    kept = [anchored(o, saved_cwd(run_dir)) for o in parsed if o.key_or_group not in given | {"resume"}]
    if command.flags.config_dir is None and "hydra.searchpath" not in given:
        kept += saved_config_dir(run_dir)
    if kept and say:
        say(f"rloo: resume: {run_dir}'s own settings first: {' '.join(kept)}")
    return kept + list(argv)


def saved_overrides(run_dir: Path) -> list[str]:
    """The overrides a run's first session was composed from, as Hydra saved them: a YAML list of strings; a
    damaged file is one line naming it."""
    import yaml

    path = run_dir / SAVED_OVERRIDES
    try:
        saved = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        first = str(error).strip().splitlines()[0]
        raise ConfigError(
            f"{path} is damaged ({first}): it should be a YAML list of overrides as Hydra saves them"
        ) from None
    if saved is None:
        return []
    if not isinstance(saved, list):
        raise ConfigError(f"{path} is damaged: it holds a {type(saved).__name__}, not a YAML list of overrides")
    return [str(line) for line in saved]


def begin_where_the_run_began(argv: list[str], say=None) -> list[str]:
    """A resume from another directory runs in the directory the run's first session ran in (its saved
    hydra.runtime.cwd), so that every relative path its configs and overrides hold (data.train.path: prompts.jsonl),
    its own modules (reward=my_rewards:fn) and its user code's own files are found as then. The command line's own
    relative paths (resume=../run, --config-dir conf) are made absolute first, in sys.argv too (Lightning's launcher
    hands sys.argv to the further ranks, which start in the new directory)."""
    command = CommandLine.parse(argv)
    run_dir = None if command.multirun or command.prints_only else resumed_run_dir(command)
    first, here = (saved_cwd(run_dir) if run_dir is not None else None), Path.cwd().resolve()
    if first is None or first == here or not first.is_dir():
        return list(argv)
    moved = absolute_paths(argv, here)
    os.chdir(first)
    if str(first) not in sys.path:
        sys.path.append(str(first))
    sys.argv[1:] = moved
    if say:
        say(
            f"rloo: resume: running in {first}, where {run_dir.resolve()} began (its relative paths and modules are "
            "there)"
        )
    return moved


def absolute_paths(argv: list[str], here: Path) -> list[str]:
    """The command line with each relative path that exists below `here` made absolute: override values (anchored)
    and --config-dir's."""
    out, after_flag = [], False
    for token in argv:
        if after_flag:
            out.append(os.path.normpath(here / token))
        elif token.startswith(("--config-dir=", "-cd=")):
            flag, _, value = token.partition("=")
            out.append(f"{flag}={os.path.normpath(here / value)}")
        elif token.startswith("-"):
            out.append(token)
        else:
            try:
                out.append(anchored(CommandLine.parse([token]).overrides[0], here))
            except (ConfigError, IndexError):  # a flag's value (--config-name train): as it was
                out.append(token)
        after_flag = token in ("--config-dir", "-cd")
    return out


def saved_cwd(run_dir: Path) -> Path | None:
    """The working dir a run's first session ran in (Hydra's hydra.runtime.cwd in .hydra/hydra.yaml); None where
    none is recorded (rloo.fit saves its paths resolved)."""
    import yaml

    try:
        cwd = yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]["runtime"]["cwd"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return None
    return Path(cwd).resolve() if isinstance(cwd, str) and Path(cwd).is_absolute() else None


def anchored(override, first_cwd: Path | None) -> str:
    """A saved override as a resume from any directory needs it: a value that is a relative path to a file or dir
    below the first session's working dir (data.train.path=train.jsonl, hydra.run.dir=run) made absolute there; any
    other as it was written."""
    value = override.value() if not override.is_sweep_override() else None
    if first_cwd is None or not isinstance(value, str) or not value or Path(value).is_absolute() or "${" in value:
        return override.input_line
    if "." not in override.key_or_group and override.key_or_group != "resume":
        return override.input_line  # a group's option (model=smollm2) names a config, not a path
    path = first_cwd / Path(value).expanduser()
    if not path.exists():
        return override.input_line
    return f"{override.get_key_element()}={hydra_quoted(os.path.normpath(path))}"


def saved_config_dir(run_dir: Path) -> list[str]:
    """`hydra.searchpath=['file://<dir>']` for the --config-dir a run's first session was composed with (from its
    .hydra/hydra.yaml), quoted in Hydra's grammar so that any character round-trips; [] where it had none. A dir
    that is gone is one line: the run's own configs are not where it was composed."""
    import yaml

    try:
        hydra = yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]
        sources = hydra["runtime"]["config_sources"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return []
    dirs = [s["path"] for s in sources if s.get("provider") == "command-line" and s.get("schema") == "file"]
    if not dirs:
        return []
    if not Path(dirs[0]).is_dir():
        raise ConfigError(
            f"resume: {run_dir} was composed with --config-dir {dirs[0]}, which is gone: give --config-dir <where "
            "its configs are now> with resume="
        )
    return [f"hydra.searchpath=[{hydra_quoted('file://' + dirs[0])}]"]


def hydra_quoted(text: str) -> str:
    """`text` as a quoted value of Hydra's override grammar: single quotes, a quote inside escaped, and a run of
    backslashes before a quote (or the closing one) doubled, as Hydra's docs write it."""
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", text)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"


def run_entry_point(hydra_main, config_name: str, train: bool = False) -> None:
    """Shared by the `python -m rloo.X` entry points: one-line errors for unknown group options (and, for
    rloo.train, keys the chosen algorithm does not read), then Hydra on the command line as rloo expands it
    (`hydra_main` is the entry point's `@hydra.main` function; sys.argv stays as typed, which Lightning's launcher
    hands to the ranks after the first, each expanding it again)."""
    from rloo.run import hydra_internals

    quiet_font_cache_notice()
    say = None if further_rank() else (lambda line: print(line, file=sys.stderr))
    try:
        argv = begin_where_the_run_began(sys.argv[1:], say) if train else sys.argv[1:]
        argv = preflight(argv, train, say=say)
    except ConfigError as error:
        exit_on_config_error(error)
    from rloo.run.assemble import name_deepspeed_accelerator
    from rloo.run.resolvers import register_resolvers

    register_resolvers()
    name_deepspeed_accelerator()  # after the command line's checks: their errors come before torch loads
    try:
        hydra_internals.run_hydra(argv, hydra_main.__wrapped__, str(CONF_DIR), config_name)
    except (KeyboardInterrupt, SystemExit) as error:
        if not stopped_by_ctrl_c(error):
            raise
        from rloo.utils.errors import STOP_LINES

        if not STOP_LINES:  # a run that said where it stopped and how to continue ends on that line
            print(f"{entry_point_name()}: stopped by Ctrl-C; exit {CTRL_C_EXIT_CODE}", file=sys.stderr)
        sys.exit(CTRL_C_EXIT_CODE)


def quiet_font_cache_notice() -> None:
    """Lightning imports matplotlib where it is installed (rloo draws its figures with it), and matplotlib logs
    `generated new fontManager` the first time it runs under a HOME: a notice of our import, not the user's to act
    on. Its warnings still show."""
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)


def entry_point_name() -> str:
    """`rloo.train`, `rloo.evaluate`, ...: the module `python -m` runs."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name.removesuffix(".__main__") if spec is not None else "rloo"


FAILED_JOBS: dict[str, str] = {}  # a multirun's jobs that failed in this process: job dir name -> its one line


def multirun_job() -> str:
    """A multirun job's dir name (its number and overrides)."""
    from rloo.run.resolvers import multirun_hydra_config

    hydra_cfg = multirun_hydra_config()
    return Path(hydra_cfg.runtime.output_dir).name if hydra_cfg is not None else "?"


def in_multirun() -> bool:
    from rloo.run.resolvers import multirun_hydra_config

    return multirun_hydra_config() is not None


def fail(error: Exception, code: int) -> float:
    """End the job on a one-line error: exit with `code` (2 for config errors, 1 for the rest); in a multirun, end
    this job only, returning nan (what a sweeper such as Optuna's counts as a failed trial): the other jobs run, and
    the sweep ends with one line naming each failed job and exit status 1 (rloo.run.run_dir_guard)."""
    print(f"error: {error}", file=sys.stderr)
    if in_multirun():
        line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        FAILED_JOBS[multirun_job()] = line
        return float("nan")
    sys.exit(code)


def exit_on_config_error(error: ConfigError) -> float:
    return fail(error, 2)
