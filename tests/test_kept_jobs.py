"""A sweep's jobs kept in a results dir (rloo.run.kept_jobs), and every committed results dir of kept jobs reported
again byte for byte."""

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from rloo.run.kept_jobs import MARKER, keep

# rloo.report is imported inside each test: imported here, at collection, it would sit in sys.modules before
# test_cli runs `python -m rloo.report` in-process (runpy warns of that)
RESULTS = Path(__file__).resolve().parents[1] / "sweeps" / "results"
TABLES = ("report.md", "report.csv", "settings.md", "differences.md", "updates.md", "verifiable.md", "factorial.md")


def a_job(multirun: Path, number: int, overrides: list[str], accuracy: float | None, host: dict) -> Path:
    """A job dir as rloo.train leaves one: .hydra/, summary.json (None: killed before it wrote one), a checkpoint."""
    job = multirun / f"{number}_{','.join(overrides)}"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = dict(o.split("=") for o in overrides)
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"algorithm": config["algo"], "seed": 0, "k": 4}))
    (job / "checkpoints").mkdir()
    (job / "checkpoints" / "last.ckpt").write_bytes(b"\0" * 4096)
    if accuracy is not None:
        final = {"eval/reward/env": accuracy, "eval/replied": 0.9, "eval/turns": 1.9, "eval/truncated": 0.0}
        summary = {"status": "finished", "final": final, "host": host, "output_dir": str(job.resolve())}
        summary["policy_dir"] = str(job.resolve() / "policy")
        summary["bootstrap"] = {"cache": str(multirun.parents[3] / "cache" / "rloo" / "bootstrap" / "abc123")}
        (job / "summary.json").write_text(json.dumps(summary))
    return job


def test_an_episode_runs_outcomes_are_its_return_its_tool_calls_turns_and_truncations():
    from rloo.report import outcomes_of

    final = {"eval/reward/env": 0.4, "eval/reward/env_ci_low": 0.3, "eval/replied": 0.9, "eval/turns": 1.9}
    final |= {"eval/truncated": 0.05, "eval/reward/env_failed": 0, "eval/score": 1.2}
    assert outcomes_of(final) == {"reward/env": 0.4, "replied": 0.9, "turns": 1.9, "truncated": 0.05}


def test_keeping_copies_the_ended_jobs_small_files_by_their_overrides_and_names_no_machine_path(tmp_path):
    from rloo.report import job_dirs, report

    host = {"cpu": "AMD EPYC", "family": "25", "model": "17", "capability": "AVX512"}
    part = tmp_path / "outputs" / "multirun" / "2026-12-07" / "10-00-00"
    a_job(part, 0, ["algo=rloo", "seed=0"], 0.30, host)
    a_job(part, 1, ["algo=grpo", "seed=0"], None, host)  # killed before its summary: not kept
    results = tmp_path / "results"
    lines = []
    assert keep(job_dirs(part), results, log=lines.append) == ["algo=rloo,seed=0"]
    assert lines == ["keep: 1_algo=grpo,seed=0 not kept: it has not ended (no summary.json)"]
    kept = results / "algo=rloo,seed=0"
    files = sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file())
    assert files == [".hydra/config.yaml", ".hydra/overrides.yaml", "summary.json"]  # no checkpoint
    summary = json.loads((kept / "summary.json").read_text())
    assert summary["output_dir"] == "." and summary["policy_dir"] == "policy"
    assert summary["bootstrap"]["cache"] == "abc123" and str(tmp_path) not in (kept / "summary.json").read_text()
    assert (results / MARKER).read_text() == "algo=rloo,seed=0\n"

    # a second part, numbered from 0 again, and the first part's job run again: one dir per job, the newest kept
    later = tmp_path / "outputs" / "multirun" / "2026-12-07" / "11-00-00"
    a_job(later, 0, ["algo=grpo", "seed=0"], 0.50, host)
    a_job(later, 1, ["algo=rloo", "seed=0"], 0.35, host)
    assert keep(job_dirs(later), results) == ["algo=grpo,seed=0", "algo=rloo,seed=0"]
    assert (results / MARKER).read_text() == "algo=grpo,seed=0\nalgo=rloo,seed=0\n"
    assert json.loads((kept / "summary.json").read_text())["final"]["eval/reward/env"] == 0.35
    assert not list(results.glob(".*tmp*")) and not list(results.glob(".*old*"))
    rows, _ = report(results)  # the results dir is a sweep dir: one row per kept job
    assert [(r["job"], r["status"]) for r in rows] == [("algo=grpo,seed=0", "ok"), ("algo=rloo,seed=0", "ok")]
    assert "| replied | truncated | turns |" in (results / "verifiable.md").read_text()


def test_keep_refuses_a_run_dir_in_one_line(tmp_path):
    from tests.e2e import run_module

    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    result = run_module("rloo.report", str(run), "--keep", str(tmp_path / "results"))
    assert result.returncode == 2 and result.stderr.strip().count("\n") == 0
    assert "--keep takes a multirun dir" in result.stderr and not (tmp_path / "results").exists()


def committed_results() -> list[Path]:
    return sorted(d for d in RESULTS.iterdir() if (d / MARKER).is_file())


def test_every_committed_results_dir_of_kept_jobs_reports_again_byte_for_byte(tmp_path):
    """The tables in docs/environments.md come from these dirs: `python -m rloo.report sweeps/results/<table>`
    writes each of their tables again, byte for byte, from the kept jobs alone."""
    from rloo.report import report

    dirs = committed_results()
    assert dirs, "no results dir of kept jobs under sweeps/results/"
    for results in dirs:
        copy = tmp_path / results.name
        shutil.copytree(results, copy, ignore=shutil.ignore_patterns(*TABLES, "*.png"))
        report(copy)
        for name in TABLES:
            committed = results / name
            assert (copy / name).is_file() == committed.is_file(), f"{results.name}/{name}"
            if committed.is_file():
                assert (copy / name).read_bytes() == committed.read_bytes(), f"{results.name}/{name} differs"


@pytest.mark.parametrize("results", committed_results(), ids=lambda d: d.name)
def test_a_committed_results_dir_keeps_no_machine_path_and_no_large_file(results):
    for path in results.rglob("*"):
        if path.is_file():
            assert path.stat().st_size < 2_000_000, path
            if path.suffix in (".json", ".yaml", ".md", ".csv", ".txt"):
                text = path.read_text()
                for machine_path in (str(RESULTS.parents[1]), str(Path.home()), tempfile.gettempdir()):
                    assert machine_path not in text, path


def test_a_sweep_at_an_equal_budget_of_episodes_sampled_draws_its_curves_against_them(tmp_path):
    """DAPO's dynamic sampling trains on fewer episodes than it samples: at budget=sampled the methods are compared
    at the episodes each sampled, which its eval history records."""
    from rloo.report import sweep_plots
    from rloo.run.plots import described

    def job(setting, budget, trained, sampled):
        history = [{"episodes": e, "sampled": s, "eval/reward/env": 0.5 + s / 4096} for e, s in zip(trained, sampled)]
        return {"status": "ok", "setting": setting, "budget": budget, "history": history, "k": 4}

    rows = [
        job("algo=dapo", "sampled", [0, 512, 832], [0, 1344, 2112]),
        job("algo=rloo", "sampled", [0, 2048], [0, 2048]),
    ]
    for row in rows:
        row["outcomes"] = {"reward/env": row["history"][-1]["eval/reward/env"]}
    sweep_plots(rows, tmp_path)
    (axes,) = described(tmp_path / "reward_env_vs_episodes.png")["axes"]
    assert axes["xlabel"] == "episodes sampled (budget=sampled)"
    assert {line["label"]: line["x"] for line in axes["lines"]}["algo=dapo (n = 1)"] == [0.0, 1344.0, 2112.0]
    for row in rows:
        row["budget"] = "trained"
    sweep_plots(rows, tmp_path)
    (axes,) = described(tmp_path / "reward_env_vs_episodes.png")["axes"]
    assert axes["xlabel"] == "episodes (completions trained on)"
    assert {line["label"]: line["x"] for line in axes["lines"]}["algo=dapo (n = 1)"] == [0.0, 512.0, 832.0]


@pytest.mark.parametrize(
    "results", [d for d in committed_results() if (d / "verifiable.md").is_file()], ids=lambda d: d.name
)
def test_the_docs_quote_each_committed_table_of_episodes_as_the_report_writes_it(results):
    """docs/environments.md's tables at seeds are verifiable.md of their results dirs, row for row."""
    docs = (RESULTS.parents[1] / "docs" / "environments.md").read_text()
    table = (results / "verifiable.md").read_text()
    assert table in docs, f"docs/environments.md does not quote sweeps/results/{results.name}/verifiable.md"


def test_two_settings_whose_seeds_did_not_spread_are_not_called_separated():
    """A greedy evaluation on a fixed held-out set can score every seed the same (88 of 128 twice): Welch's interval
    is then zero-wide, and a one-problem difference must not read as a separation."""
    from rloo.report import difference_interval, differences_markdown

    rows = [
        {"status": "ok", "setting": setting, "win_rate": None, "outcomes": {"reward/env": value}}
        for setting, values in {
            "algo=grpo": [89 / 128] * 2,
            "algo=rloo": [88 / 128] * 2,
            "algo=dapo": [0.5, 0.55],
        }.items()
        for value in values
    ]
    lines = differences_markdown(rows, "reward/env").splitlines()
    assert "| algo=grpo | algo=rloo | +0.008 [+0.008, +0.008] | no spread over seeds |" in lines
    diff, low, high = difference_interval([89 / 128] * 2, [0.5, 0.55])  # a spread on one side: Welch decides
    assert f"| algo=grpo | algo=dapo | {diff:+.3f} [{low:+.3f}, {high:+.3f}] | {'yes' if low > 0 else 'no'} |" in lines


def test_docs_async_quotes_the_staleness_tables_win_rates_as_the_report_writes_them():
    """docs/async.md's learning table: each cell's final win rate and interval is settings.md's for that setting."""
    docs = (RESULTS.parents[1] / "docs" / "async.md").read_text()
    report = (RESULTS / "async_staleness" / "settings.md").read_text()
    cells = re.findall(r"^\| algo=(\w+) max_staleness=(\d+) \| 3 \| ([0-9.]+ \[[0-9.]+, [0-9.]+\]) \|", report, re.M)
    assert len(cells) == 6
    for algo, lag, win_rate in cells:
        assert f"| {algo.upper()}, N={lag} | {win_rate} |" in docs, (algo, lag, win_rate)
