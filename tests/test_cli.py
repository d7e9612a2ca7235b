"""One habit for every `python -m rloo.*` entry point: --help prints usage and exits 0; a bad argument is one line
on stderr and exit status 2. In-process (runpy), as `python -m` runs them."""

import runpy
import sys

import pytest

from rloo.utils.errors import ConfigError
from tests.e2e import live_holder

ENTRY_POINTS = ["rloo.train", "rloo.evaluate", "rloo.sft", "rloo.reward", "rloo.plan", "rloo.report", "rloo.bench"]


def run_module(module: str, *args: str) -> int:
    """`python -m module args` in this process. A package's __main__ that an earlier test imported is dropped first:
    runpy executes it afresh (and warns where it finds it in sys.modules already)."""
    sys.argv = [module, *args]
    sys.modules.pop(f"{module}.__main__", None)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    except SystemExit as exit:
        return exit.code or 0
    return 0


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_prints_usage_and_exits_0(module, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    assert run_module(module, "--help") == 0
    assert "usage: python -m " in capsys.readouterr().out


@pytest.mark.parametrize("module", ENTRY_POINTS)
@pytest.mark.parametrize("bad", ["--no-such-flag", "not-an-override"])
def test_a_bad_argument_is_one_line_and_exit_2(module, bad, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    if module == "rloo.report" and bad == "not-an-override":
        bad = "/no/such/multirun/dir"
    if module == "rloo.bench" and bad == "not-an-override":
        bad = "no-such-mode"
    assert run_module(module, bad) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err


def hydra_config(*overrides: str, config_name: str = "train"):
    """conf/<config_name>.yaml composed with its `hydra` node, as Hydra hands it to a callback's on_run_start."""
    from hydra import compose, initialize_config_dir

    from rloo.run.resolvers import register_resolvers
    from rloo.utils.keys import CONF_DIR

    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name, overrides=list(overrides), return_hydra_config=True)


def refusal(capsys, *argv: str) -> str:
    """`python -m rloo.train argv` refused: exit 2 and one line on stderr, which is returned."""
    assert run_module("rloo.train", *argv) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


def test_a_run_dir_that_cannot_be_written_is_one_line_before_hydra(tmp_path, capsys, monkeypatch):
    """/proc/1 is not writable, even for root (a read-only dir as a user meets it); a file in the way neither."""
    from rloo.run.run_dir_guard import guard_run_dirs

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    assert "hydra.run.dir='/proc/1/run': /proc/1 is not a writable dir" in refusal(capsys, "hydra.run.dir=/proc/1/run")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is not a writable dir"):
        guard_run_dirs(hydra_config(f"paths.output_dir={tmp_path / 'file' / 'run'}"))


FINISHED_OUTPUTS = ["summary.json", "checkpoints", "csv", "verdicts.jsonl"]


@pytest.mark.parametrize("output", FINISHED_OUTPUTS)
def test_a_fresh_run_into_a_dir_holding_another_run_is_refused_unless_resumed(tmp_path, output, monkeypatch, capsys):
    """Else its metrics would join the old run's timeline and its summary replace the old one. The dir is the one
    Hydra makes final: named by an interpolation of the run's own keys, or through `..` in a dir not there yet."""
    from rloo.run.run_dir_guard import guard_run_dirs
    from rloo.utils import ownership

    run = tmp_path / "k2"
    run.mkdir()
    (run / output).mkdir() if "." not in output else (run / output).write_text("{}")
    before = sorted(p.name for p in run.rglob("*"))
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.chdir(tmp_path)
    for named in (f"hydra.run.dir={run}", "hydra.run.dir=k${k}", "hydra.run.dir=not_yet/../k2"):
        line = refusal(capsys, "k=2", named)
        assert f"holds another run's outputs ({output})" in line and "resume=auto" in line, line
    assert sorted(p.name for p in run.rglob("*")) == before  # Hydra wrote nothing there, its .hydra/ neither
    assert not (tmp_path / "not_yet").exists()
    try:
        guard_run_dirs(hydra_config(f"hydra.run.dir={run}", "resume=auto"))
        assert ownership.owns(run)
    finally:
        ownership.release(run)


def test_only_the_first_rank_refuses_a_run_dir_that_holds_outputs(tmp_path, monkeypatch, capsys):
    """Lightning's DDP launch runs `python -m rloo.train` again for rank 1, into the dir rank 0 has begun writing."""
    from rloo.run.run_dir_guard import RunDirGuard

    (tmp_path / "csv").mkdir()
    config = hydra_config(f"hydra.run.dir={tmp_path}")
    with pytest.raises(SystemExit):
        RunDirGuard().on_run_start(config)
    assert "holds another run's outputs" in capsys.readouterr().err
    monkeypatch.setenv("LOCAL_RANK", "1")
    RunDirGuard().on_run_start(config)


def test_a_live_run_is_refused_before_hydra_touches_its_files(tmp_path, monkeypatch, capsys):
    """A second process into a live run's dir (its resume= typed twice, a requeue while the old job runs) is refused
    by the dir's owner, and the live run's .hydra/overrides.yaml stays as it was; an unset variable in the dir is one
    line."""
    live = tmp_path / "live"
    (live / ".hydra").mkdir(parents=True)
    (live / ".hydra" / "overrides.yaml").write_text("- algo=rloo\n")
    with live_holder(live):
        monkeypatch.setattr(sys, "argv", list(sys.argv))
        line = refusal(capsys, "algo=grpo", f"hydra.run.dir={live}")
        assert "is in use by process" in line, line
        assert (live / ".hydra" / "overrides.yaml").read_text() == "- algo=rloo\n"
        assert sorted(p.name for p in (live / ".hydra").iterdir()) == ["overrides.yaml"]
    monkeypatch.delenv("RLOO_UNSET_DIR", raising=False)
    line = refusal(capsys, "hydra.run.dir=${oc.env:RLOO_UNSET_DIR}")
    assert "hydra.run.dir='${oc.env:RLOO_UNSET_DIR}' cannot be resolved" in line and "RLOO_UNSET_DIR" in line


def test_a_fresh_sweep_into_a_finished_sweeps_dir_is_refused(tmp_path, monkeypatch, capsys):
    """Every job of a multirun into a finished sweep's dir would train over that sweep's runs."""
    sweep = tmp_path / "sweep"
    (sweep / "0_k=2" / "csv").mkdir(parents=True)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    line = refusal(capsys, "-m", "k=2,4", f"hydra.sweep.dir={sweep}")
    assert "holds another sweep's runs (0_k=2)" in line and "resume=auto" in line
    assert sorted(p.name for p in sweep.rglob("*")) == ["0_k=2", "csv"]  # no multirun.yaml, no job dir


def test_a_quoted_run_dir_is_read_as_hydra_reads_it(tmp_path, monkeypatch):
    """Hydra's quoting (needed for a path with spaces) and escapes give the dir Hydra will use: a finished run's dir
    named with quotes is refused as the plain name is, and a fresh dir with spaces and non-ASCII characters is
    locked at its real path (a symlink to it followed), with no stray tree under the current dir."""
    from rloo.run.run_dir_guard import guard_run_dirs
    from rloo.utils import ownership

    finished = tmp_path / "finished run ü"
    finished.mkdir()
    (finished / "summary.json").write_text("{}")
    (tmp_path / "link").symlink_to(finished)
    monkeypatch.setenv("RLOO_TEST_DIR", str(finished))
    for override in (
        f"hydra.run.dir='{finished}'",
        f'hydra.run.dir="{finished}"',
        f"paths.output_dir='{finished}'",
        f"hydra.run.dir={tmp_path / 'link'}",
        "hydra.run.dir=${oc.env:RLOO_TEST_DIR}",
    ):
        with pytest.raises(ConfigError, match="holds another run's outputs"):
            guard_run_dirs(hydra_config(override))

    fresh, elsewhere = tmp_path / "new run é", tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    try:
        guard_run_dirs(hydra_config(f"hydra.run.dir='{fresh}'", "judge=none"))
        assert (fresh / ownership.OWNER_FILE).is_file()  # taken at the path Hydra will write
        assert list(elsewhere.iterdir()) == []  # nothing under the current dir
    finally:
        ownership.release(fresh)


def test_hydras_own_flags_take_their_values(capsys, monkeypatch):
    """--info takes an optional value and -cd a dir, as in Hydra's own parser: neither is read as an override."""
    from rloo.run.command_line import CommandLine

    command = CommandLine.parse(["--info", "searchpath", "-cd", "/tmp", "k=4", "-m"])
    assert command.prints_only and command.multirun and command.lines == ["k=4"]
    assert command.flags.config_dir == "/tmp"


def test_a_quoted_run_dir_that_a_live_process_holds_is_refused(tmp_path):
    """The lock is taken at the path Hydra will use, so a quoted dir with spaces and non-ASCII characters that a
    live process works in is refused as its plain name is."""
    from rloo.run.run_dir_guard import guard_run_dirs

    live = tmp_path / "live run ü"
    with live_holder(live) as holder:
        with pytest.raises(ConfigError, match=rf"is in use by process {holder.pid} on "):
            guard_run_dirs(hydra_config(f"hydra.run.dir='{live}'", "judge=none"))
        with pytest.raises(ConfigError, match=rf"is in use by process {holder.pid} on "):  # rloo.evaluate alike
            guard_run_dirs(hydra_config(f"hydra.run.dir='{live}'", config_name="evaluate"))


def test_a_nested_group_of_a_config_dir_is_checked_and_composed():
    """sweeps/rloo_to_grpo/<change>/ (a --config-dir's nested groups): a choice is composed as a group, not refused
    as an unknown key, and a choice that is not there is one line naming those that are."""
    from rloo.run.cli import check_group_choices, check_override_keys
    from rloo.run.command_line import CommandLine

    argv = ["-cd", "sweeps", "-cn", "rloo_to_grpo", "rloo_to_grpo/std=group_std", "rloo_to_grpo/kl=loss_k3", "k=4"]
    command = CommandLine.parse(argv)
    check_group_choices(command)
    check_override_keys(command)
    composed = command.configs.compose(["rloo_to_grpo/std=group_std", "rloo_to_grpo/kl=loss_k3"], "rloo_to_grpo")
    assert (composed.advantage, composed.kl_in, composed.kl_estimator, composed.kl_coef) == (
        "group_std",
        "loss",
        "k3",
        0.04,
    )
    with pytest.raises(
        ConfigError, match="rloo_to_grpo/std='z' is not a config in .*: choose one of group_std, leave_one_out"
    ):
        check_group_choices(CommandLine.parse(["-cd", "sweeps", "rloo_to_grpo/std=z"]))


def test_flags_and_overrides_in_any_order_hydra_accepts(tmp_path, capsys, monkeypatch):
    """`--config-dir DIR resume=<run>` (flags first, as the README writes them) and `debug=fast -m k=2,4` parse as
    Hydra takes them; an unknown flag's line says where flags go. sys.argv is never rewritten."""
    from rloo.run.command_line import CommandLine

    command = CommandLine.parse(["debug=fast", "-m", "k=2,4", "--config-dir", str(tmp_path), "seed=1"])
    assert command.multirun and command.flags.config_dir == str(tmp_path)
    assert command.lines == ["debug=fast", "k=2,4", "seed=1"]
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    argv = ["--config-dir", str(tmp_path), f"resume={run}"]
    monkeypatch.setattr(sys, "argv", ["rloo.train", *argv])
    line = refusal(capsys, *argv)  # parsed, then refused for what it is: a run with no checkpoint yet
    assert "no whole checkpoint in" in line, line
    line = refusal(capsys, "debug=fast", "--no-such-flag")
    assert "unrecognized arguments: --no-such-flag: key=value overrides, or Hydra's flags" in line
    assert "a flag's value, as in --config-dir DIR, follows it" in line


def test_hydras_private_calls_are_where_rloo_calls_them():
    """rloo/run/hydra_internals.py is the one module that reaches past Hydra's documented API; pyproject pins
    hydra-core to the minor version it is written against. A Hydra whose internals moved fails here, by name."""
    import inspect
    from importlib.metadata import version

    from hydra._internal import config_loader_impl, utils
    from hydra.core.config_search_path import SearchPathQuery  # noqa: F401 (public, used beside them)

    from rloo.run import hydra_internals

    assert version("hydra-core").startswith(hydra_internals.TESTED_HYDRA + ".")
    assert list(inspect.signature(utils._run_hydra).parameters)[:5] == [
        "args",
        "args_parser",
        "task_function",
        "config_path",
        "config_name",
    ]
    assert {"--config-dir", "--multirun", "--cfg"} <= set(utils.get_args_parser()._option_string_actions)
    assert list(inspect.signature(utils.create_config_search_path).parameters) == ["search_path_dir"]
    loader = config_loader_impl.ConfigLoaderImpl
    for method in ("load_configuration", "get_group_options", "list_groups", "compute_defaults_list", "get_sources"):
        assert callable(getattr(loader, method, None)), method
    tree_loader = hydra_internals.config_loader(str(__import__("rloo.utils.keys").utils.keys.CONF_DIR), None)
    assert "rloo" in tree_loader.get_group_options("algo", config_name="train", overrides=[])
    pinned = [line for line in open("pyproject.toml") if "hydra-core" in line]
    assert pinned and ">=1.3.2,<1.4" in pinned[0]
