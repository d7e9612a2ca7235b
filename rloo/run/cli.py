"""The command line of every `python -m rloo.*` entry point, before and around Hydra: `--help` prints usage and
exits 0; a bad argument, an unknown group option or a key the chosen algorithm does not read is one line on stderr
and exit status 2; `model=X` selects its recipe and `group=none` drops an optional group; a run dir the command line
names is checked and taken before Hydra writes into it; a job's failure ends the job (exit 1 or 2) or, in a
multirun, only that job. Hydra parses every argument (rloo.run.command_line): the value each check reads is the
value Hydra will use.
"""

from __future__ import annotations

import argparse
import itertools
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


def named_run_dirs(command: CommandLine) -> list[tuple[str, Path]]:
    """The run dirs the command line names, as Hydra will use them: (key, path) for hydra.run.dir and
    paths.output_dir, their values unquoted and unescaped by Hydra's parser and their interpolations resolved where
    OmegaConf can resolve them alone (${oc.env:...}); a value that needs the run (${now:...}, ${hydra:...}) is left
    to Hydra."""
    named = []
    for key in RUN_DIR_KEYS:
        value = command.value(key)
        if value is None:
            continue
        value = _resolved(str(value))
        if value is not None:
            named.append((key, Path(value).expanduser()))
    return named


def _resolved(value: str) -> str | None:
    if "${" not in value:
        return value
    from omegaconf import OmegaConf

    try:
        return str(OmegaConf.create({"value": value}).value)
    except Exception:  # an interpolation only the running Hydra resolves
        return None


def check_run_dir(argv: list[str] | CommandLine) -> None:
    """Before Hydra makes or writes into the run dir: the dir it will be in can be written (Hydra's own error is a
    traceback), and an explicit run dir that holds another run's outputs is refused unless `resume=` continues that
    run: a fresh run there would merge its metrics into the old timeline and overwrite its summary. The first rank
    alone checks that: the others join the dir it has begun."""
    import os

    command = argv if isinstance(argv, CommandLine) else CommandLine.parse(argv)
    if command.prints_only:
        return  # Hydra prints and runs nothing: no run dir is made
    resuming = command.value("resume") not in (None, "null", "None", "")
    explicit = named_run_dirs(command)
    for key, path in explicit or [("hydra.run.dir", Path("outputs"))]:
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
            where = f"{key}={str(path)!r}" if explicit else "the run dir (outputs/ here)"
            raise ConfigError(f"{where}: {existing} is not a writable dir (a read-only file system or no permission)")
        if (
            explicit
            and not resuming
            and not further_rank()
            and (held := [n for n in RUN_OUTPUTS if (path / n).exists()])
        ):
            raise ConfigError(
                f"{key}={str(path)!r} holds another run's outputs ({', '.join(held)}): resume=auto continues that "
                "run; give a new dir for a new one"
            )


# ---- entry points ---------------------------------------------------------------------------------------------
def preflight(argv: list[str], train: bool = True, say=None) -> list[str]:
    """What the command line alone tells, before Hydra composes or makes a run dir: the expanded command line, or a
    ConfigError for a bad argument, an unknown group option, a key the algorithm does not read, a resume= that is not
    there, or a run dir that cannot be written or holds another run (check_run_dir)."""
    from rloo.utils.resume import check_resume_argument

    argv = expand_overrides(with_the_runs_own_overrides(argv, say), say) if train else list(argv)
    command = CommandLine.parse(argv)
    check_group_choices(command)
    if train:
        check_override_keys(command)
    else:
        check_added_keys(command)
    check_run_dir(command)
    resume = command.value("resume")
    check_resume_argument(None if resume is None else str(resume))
    own_named_run_dir(command)
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
        named = named_run_dirs(command)
        return named[0][1] if named else None
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
    import yaml

    saved = [str(line) for line in yaml.safe_load((run_dir / SAVED_OVERRIDES).read_text()) or []]
    given = {o.key_or_group for o in command.overrides}
    kept = [o.input_line for o in CommandLine.parse(saved).overrides if o.key_or_group not in given | {"resume"}]
    if command.flags.config_dir is None and "hydra.searchpath" not in given:
        kept += saved_config_dir(run_dir)
    if kept and say:
        say(f"rloo: resume: {run_dir}'s own settings first: {' '.join(kept)}")
    return kept + list(argv)


def saved_config_dir(run_dir: Path) -> list[str]:
    """`hydra.searchpath=[file://<dir>]` for the --config-dir a run's first session was composed with (from its
    .hydra/hydra.yaml), where that dir is still there; [] otherwise."""
    import yaml

    try:
        hydra = yaml.safe_load((run_dir / ".hydra" / "hydra.yaml").read_text())["hydra"]
        sources = hydra["runtime"]["config_sources"]
    except (OSError, KeyError, TypeError, yaml.YAMLError):
        return []
    dirs = [s["path"] for s in sources if s.get("provider") == "command-line" and s.get("schema") == "file"]
    return [f"hydra.searchpath=[file://{dirs[0]}]"] if dirs and Path(dirs[0]).is_dir() else []


def own_named_run_dir(command: CommandLine) -> None:
    """A run dir the command line names (hydra.run.dir, paths.output_dir, resume=<run dir>) is taken for this
    process before Hydra writes into it, at the path Hydra will use, by every entry point that writes one: refused
    while another live process works there, from the moment it took the dir (rloo.utils.ownership). A multirun's
    jobs, and the ranks after the first, take or join theirs in the run itself."""
    from rloo.utils import ownership
    from rloo.utils.resume import run_dir_of

    if further_rank() or command.prints_only or command.multirun:
        return
    resume = command.value("resume")
    resumed = run_dir_of(None if resume is None else str(resume))
    for path in [path for _, path in named_run_dirs(command)] + ([Path(resumed)] if resumed else []):
        ownership.take(path, log=lambda line: print(line, file=sys.stderr))


def run_entry_point(hydra_main, train: bool = False) -> None:
    """Shared by the `python -m rloo.X` entry points: one-line errors for unknown group options (and, for
    rloo.train, keys the chosen algorithm does not read), then Hydra."""
    try:
        sys.argv[1:] = preflight(sys.argv[1:], train, say=lambda line: print(line, file=sys.stderr))
    except ConfigError as error:
        exit_on_config_error(error)
    from rloo.run.assemble import name_deepspeed_accelerator
    from rloo.run.resolvers import register_resolvers

    register_resolvers()
    name_deepspeed_accelerator()  # after the command line's checks: their errors come before torch loads
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
