"""One habit for every `python -m rloo.*` entry point: --help prints usage and exits 0; a bad argument is one line
on stderr and exit status 2. In-process (runpy), as `python -m` runs them."""

import runpy
import sys

import pytest

ENTRY_POINTS = ["rloo.train", "rloo.evaluate", "rloo.sft", "rloo.reward", "rloo.plan", "rloo.report", "rloo.bench"]


def run_module(module: str, *args: str) -> int:
    sys.argv = [module, *args]
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
