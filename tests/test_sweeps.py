"""A real 2x1 multirun through `python -m rloo.train -m`, then `python -m rloo.report` on it."""

import csv
import json

import pytest
from omegaconf import OmegaConf

from tests.e2e import live_holder, run_module


def run_sweep(base, name: str, settings: list[str], overrides=("debug: fast",)):
    """A sweep file as in sweeps/ (fixed settings in the file, the swept ones in hydra.sweeper.params), run through
    `python -m rloo.train -m -cd <dir> -cn <name>`; returns its multirun dir."""
    sweep_dir = base / name
    settings = OmegaConf.from_dotlist([*settings, f"hydra.sweep.dir={sweep_dir}"])
    defaults = "".join(f"  - override {o}\n" for o in overrides)
    (base / "sweeps").mkdir(exist_ok=True)
    (base / "sweeps" / f"{name}.yaml").write_text(
        f"defaults:\n  - train\n{defaults}  - _self_\n\n" + OmegaConf.to_yaml(settings)
    )
    result = run_module("rloo.train", "-m", "-cd", str(base / "sweeps"), "-cn", name, cache=base / "cache")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return sweep_dir


@pytest.fixture(scope="module")
def multirun(finished_run):
    base, _ = finished_run
    return run_sweep(
        base,
        "tiny_sweep",
        ["checkpoint_every=0", "eval_every=0", "hydra.sweeper.params.k=2,4", "hydra.sweeper.params.clip_range=0.2"],
    )


def report(path):
    return run_module("rloo.report", str(path))


@pytest.mark.slow
def test_jobs_land_in_numbered_dirs_named_by_their_overrides_and_share_a_wandb_group(multirun):
    jobs = sorted(p.name for p in multirun.iterdir() if p.is_dir() and (p / ".hydra").is_dir())
    assert jobs == ["0_clip_range=0.2,k=2", "1_clip_range=0.2,k=4"]
    groups = set()
    for job in jobs:
        config = (multirun / job / "config.yaml").read_text()
        for line in config.splitlines():
            if line.strip().startswith("group:"):
                groups.add(line.split(":", 1)[1].strip())
    assert len(groups) == 1 and groups.pop().startswith("tiny_sweep-")  # <sweep>-<date>-<time>, one per sweep


@pytest.mark.slow
def test_report_writes_one_row_per_job_and_valid_plots(multirun):
    result = report(multirun)
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader((multirun / "report.csv").open()))
    assert [(r["k"], r["clip_range"], r["status"]) for r in rows] == [("2", "0.2", "ok"), ("4", "0.2", "ok")]
    for row, job in zip(rows, ("0_clip_range=0.2,k=2", "1_clip_range=0.2,k=4")):
        summary = json.loads((multirun / job / "summary.json").read_text())
        assert float(row["win_rate"]) == summary["final"]["eval/win_rate"]
        assert float(row["win_rate_ci_low"]) <= float(row["win_rate"]) <= float(row["win_rate_ci_high"])
        assert float(row["wall_seconds"]) == summary["wall_seconds"] and float(row["peak_rss_mb"]) > 0
        for key in ("reward", "kl", "clipfrac"):
            float(row[key])
    table = (multirun / "report.md").read_text()
    assert "| k=2 clip_range=0.2 | ok |" in table and "| k=4 clip_range=0.2 | ok |" in table
    from rloo.run.plots import described

    for name, key in (("win_rate_vs_k.png", "win_rate"), ("kl_vs_k.png", "kl")):  # one setting, k on the x axis
        assert (multirun / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        (axes,) = described(multirun / name)["axes"]
        (line,) = axes["lines"]  # one seed per k: a line without bars, said as n = 1
        assert line["label"] == "(defaults) (n = 1)" and line["x"] == [2.0, 4.0] and not axes["intervals"]
        assert line["y"] == pytest.approx([float(r[key]) for r in rows])


@pytest.mark.slow
def test_a_failed_job_is_reported_as_failed_not_dropped(multirun, tmp_path):
    import shutil

    copy = tmp_path / "sweep"
    shutil.copytree(multirun, copy)
    (copy / "1_clip_range=0.2,k=4" / "summary.json").unlink()  # as a job that died before writing it
    result = report(copy)
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader((copy / "report.csv").open()))
    assert [r["status"] for r in rows] == ["ok", "failed"] and rows[1]["win_rate"] == ""
    assert "| failed |" in (copy / "report.md").read_text()


@pytest.mark.slow
def test_an_interrupted_job_is_reported_by_its_status(multirun, tmp_path):
    import shutil

    copy = tmp_path / "sweep"
    shutil.copytree(multirun, copy)
    summary_path = copy / "1_clip_range=0.2,k=4" / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary_path.write_text(json.dumps(summary | {"status": "interrupted"}))  # as a job stopped by SIGTERM
    assert report(copy).returncode == 0
    rows = list(csv.DictReader((copy / "report.csv").open()))
    assert [r["status"] for r in rows] == ["ok", "interrupted"] and rows[1]["win_rate"] == ""


def test_a_sweep_with_failed_jobs_ends_on_one_line_and_the_report_tells_failed_from_running(tmp_path):
    """Each job failed by its config says why in its dir; the other jobs run; the sweep's last line names the
    failures (exit 1), not Hydra's traceback. rloo.report prints each failed job's line, and reads a job whose
    process still holds its dir (its lock) as running, one whose holder died without a word as killed."""
    from rloo.report import job_row
    from rloo.utils import ownership

    sweep = tmp_path / "sweep"
    result = run_module("rloo.train", "-m", "debug=fast", "logger=csv", "k=1,0", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 1, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 2 of 2 jobs failed: 0_debug=fast,k=1,logger=csv: k=1 is not allowed") and (
        f"python -m rloo.report {sweep} lists each" in last
    ), result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "HYDRA_FULL_ERROR" not in result.stderr
    for job, k in (("0_debug=fast,k=1,logger=csv", 1), ("1_debug=fast,k=0,logger=csv", 0)):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["status"] == "failed" and summary["error"].startswith(f"k={k} is not allowed")
    printed = report(sweep)
    assert printed.returncode == 0
    assert "report: 0_debug=fast,k=1,logger=csv: failed: k=1 is not allowed" in printed.stderr

    job = sweep / "0_debug=fast,k=1,logger=csv"
    (job / "summary.json").unlink()  # as a job that has not written one yet
    with live_holder(job):
        assert job_row(job)["status"] == "running"
    assert ownership.holder(job) == "killed" and job_row(job)["status"] == "killed"


def test_report_refuses_a_dir_that_is_neither_a_run_nor_a_multirun(tmp_path):
    result = report(tmp_path)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    assert "is neither a run dir (summary.json, csv/metrics.csv) nor a multirun dir" in result.stderr


def test_seed_interval_is_students_t_over_the_seeds():
    from rloo.report import seed_interval

    assert seed_interval([0.5]) == (0.5, 0.5, 0.5)
    mean, low, high = seed_interval([0.6, 0.8])  # sd 0.1414, se 0.1, t(1) 12.706
    assert (
        mean == pytest.approx(0.7)
        and high - mean == pytest.approx(12.706 * 0.1)
        and mean - low == pytest.approx(1.2706)
    )
    mean, low, high = seed_interval([0.1, 0.2, 0.3, 0.4])  # se 0.0645, t(3) 3.182
    assert high - mean == pytest.approx(3.182 * (0.016667**0.5) / 2, rel=1e-3)


def test_settings_are_named_by_what_differs_between_jobs():
    from rloo.report import name_settings

    rows = [
        {"setting": ["algo=rloo", "logger=csv"]},
        {"setting": ["algo=ppo", "logger=csv"]},
        {"setting": ["algo=rloo", "logger=csv"]},
    ]  # seeds already left out
    name_settings(rows)
    assert [r["setting"] for r in rows] == ["algo=rloo", "algo=ppo", "algo=rloo"]
    alone = [{"setting": ["k=2"]}]
    name_settings(alone)
    assert alone[0]["setting"] == "(defaults)"


def test_the_report_compares_every_verifiable_outcome_with_welch_intervals(tmp_path):
    from rloo.report import (
        all_differences_markdown,
        difference_interval,
        outcomes_of,
        seed_interval,
        verifiable_markdown,
    )

    final = {"eval/accuracy": 0.5, "eval/accuracy_ci_low": 0.4, "eval/pass@4": 0.9, "eval/win_rate": 0.7}
    assert outcomes_of(final) == {"accuracy": 0.5, "pass@4": 0.9}  # no intervals, no win rate
    accuracy = {"algo=grpo": [0.50, 0.56, 0.53], "algo=rloo": [0.40, 0.42, 0.47]}
    rows = [
        {"status": "ok", "setting": setting, "win_rate": None, "outcomes": {"accuracy": a, "pass@4": a + 0.3}}
        for setting, values in accuracy.items()
        for a in values
    ]
    mean, low, high = seed_interval(accuracy["algo=grpo"])
    table = verifiable_markdown(rows)
    assert table.splitlines()[0] == "| setting | seeds | accuracy | pass@4 |"
    assert f"| algo=grpo | 3 | {mean:.3f} [{low:.3f}, {high:.3f}] |" in table
    diff, low, high = difference_interval(accuracy["algo=grpo"], accuracy["algo=rloo"])
    differences = all_differences_markdown(rows)
    assert "## accuracy" in differences and "## pass@4" in differences
    assert f"| algo=grpo | algo=rloo | {diff:+.3f} [{low:+.3f}, {high:+.3f}] | {'yes' if low > 0 else 'no'} |" in (
        differences
    )
    from rloo.report import by_setting, plot_outcomes, settings_markdown

    table = by_setting(rows)  # no judge, no win rate: ranked by the first verifiable outcome
    assert [r["setting"] for r in table] == ["algo=grpo", "algo=rloo"] and table[0]["win_rate"] == pytest.approx(mean)
    assert "final accuracy, mean [95% CI over seeds]" in settings_markdown(table)
    plot_outcomes(rows, tmp_path / "verifiable.png")
    from rloo.run.plots import described

    (axes,) = described(tmp_path / "verifiable.png")["axes"]
    assert {i["label"] for i in axes["intervals"]} == {"algo=grpo (n = 3)", "algo=rloo (n = 3)"}


@pytest.mark.slow
def test_a_methods_sweep_is_one_row_per_method_over_its_seeds_with_learning_curves(finished_run):
    """sweeps/methods.yaml's shape at the tests' size: methods x seeds, then rloo.report's per-method table."""
    base, _ = finished_run
    sweep_dir = run_sweep(
        base,
        "methods",
        [
            "checkpoint_every=0",
            "eval_every=1",
            "hydra.sweeper.params.algo=rloo,vanilla_pg",
            "hydra.sweeper.params.seed=0,1",
        ],
        overrides=("debug: fast", "logger: csv"),
    )
    assert report(sweep_dir).returncode == 0
    finals = {}
    for job in sweep_dir.iterdir():
        if (job / "summary.json").exists():
            summary = json.loads((job / "summary.json").read_text())
            finals.setdefault(summary["algorithm"], []).append(summary["final"]["eval/win_rate"])
            episodes = [h["episodes"] for h in summary["eval_history"]]
            assert episodes == [0, 8, 16, 24] and summary["eval_history"][-1]["train_seconds"] > 0
            assert summary["train_seconds"] == pytest.approx(summary["eval_history"][-1]["train_seconds"], abs=0.01)
    table = (sweep_dir / "settings.md").read_text()
    for algorithm, rates in finals.items():
        from rloo.report import seed_interval

        mean, low, high = seed_interval(rates)
        assert f"| algo={algorithm} | 2 | {mean:.3f} [{low:.3f}, {high:.3f}] |" in table
    from rloo.report import difference_interval

    better, worse = sorted(finals, key=lambda a: -sum(finals[a]))
    diff, low, high = difference_interval(finals[better], finals[worse])
    verdict = "no spread over seeds" if high - low < 1e-12 else "yes" if low > 0 else "no"
    row = f"| algo={better} | algo={worse} | {diff:+.3f} [{low:+.3f}, {high:+.3f}] | {verdict} |"
    assert row in (sweep_dir / "differences.md").read_text()
    from rloo.run.plots import described

    for name in ("win_rate_vs_episodes.png", "win_rate_vs_seconds.png"):
        (axes,) = described(sweep_dir / name)["axes"]
        assert sorted(line["label"] for line in axes["lines"]) == ["algo=rloo (n = 2)", "algo=vanilla_pg (n = 2)"]
    (axes,) = described(sweep_dir / "win_rate_vs_episodes.png")["axes"]
    assert all(line["x"] == [0.0, 8.0, 16.0, 24.0] for line in axes["lines"])


def test_a_path_valued_override_names_one_job_dir_not_a_nest():
    from rloo.run.resolvers import one_dir_name

    name = one_dir_name("data.train.path=/data/tldr/train.jsonl,k=2")
    assert name == "data.train.path=%2Fdata%2Ftldr%2Ftrain.jsonl,k=2" and "/" not in name
    assert one_dir_name("k=2,lr=0.1") == "k=2,lr=0.1"  # the usual names are unchanged
    assert one_dir_name("a=50%/b") != one_dir_name("a=50%2Fb")  # '%' is escaped too: distinct stays distinct
    long = [one_dir_name(f"data.train.path=/{'x' * 300}/{n}.jsonl") for n in (1, 2)]
    assert all(len(n) <= 200 for n in long) and long[0] != long[1]  # within a file name, and distinct


def test_the_difference_of_two_methods_has_welchs_interval():
    from rloo.report import difference_interval

    # equal seeds and spreads: variances 0.001 each, se sqrt(2 * 0.001 / 5) = 0.02, Welch df = 8, t(8) = 2.306
    diff, low, high = difference_interval([0.7, 0.72, 0.68, 0.74, 0.66], [0.6, 0.62, 0.58, 0.64, 0.56])
    assert diff == pytest.approx(0.1) and high - diff == pytest.approx(2.306 * 0.02) and low > 0
    # 2 and 4 seeds: va = 0.02 / 2 = 0.01, vb = 0.016667 / 4 = 0.0041667; df = 0.0141667^2 / (0.01^2 / 1 +
    # 0.0041667^2 / 3) = 1.897, which the table takes as 1 (t = 12.706); se = sqrt(0.0141667) = 0.119024
    diff, low, high = difference_interval([0.6, 0.8], [0.1, 0.2, 0.3, 0.4])
    assert diff == pytest.approx(0.45) and diff - low == pytest.approx(12.706 * 0.119024, rel=1e-5) and low < 0


@pytest.mark.slow
def test_each_job_of_a_sweep_is_its_own_wandb_run_and_report_takes_the_latest_sweep(embedded_task, tmp_path):
    """The README's sweep as a user types it, from their own folder, W&B offline: 4 W&B runs, each named by its job's
    overrides, grouped by the sweep, its setting as job type, its own config; then rloo.report with no dir."""
    from tests.wandb_records import run_record

    command = ["-m", "k=2,4", "clip_range=0.1,0.2", "debug=fast", "checkpoint_every=0", "eval_every=0"]
    result = run_module("rloo.train", *command, cwd=tmp_path, cache=embedded_task / "cache")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "already in progress" not in result.stdout + result.stderr
    (sweep,) = (tmp_path / "outputs" / "multirun").glob("*/*")
    jobs = sorted(d for d in sweep.iterdir() if (d / ".hydra").is_dir())
    runs = []
    for job in jobs:
        (log,) = (job / "wandb").glob("offline-run-*/run-*.wandb")  # one W&B run per job, in the job's dir
        run = run_record(log)
        config = OmegaConf.load(job / "config.yaml")
        assert run["name"] == job.name and (run["config"]["k"], run["config"]["clip_range"]) == (
            config.k,
            config.clip_range,
        )
        assert set(run["job_type"].split(",")) == set(job.name.split("_", 1)[1].split(","))  # the setting: no seed
        runs.append(run)
    assert len(runs) == 4 and len({r["id"] for r in runs}) == 4
    assert len({r["group"] for r in runs}) == 1 and runs[0]["group"] == f"train-{sweep.parent.name}-{sweep.name}"
    assert {(r["config"]["k"], r["config"]["clip_range"]) for r in runs} == {(2, 0.1), (2, 0.2), (4, 0.1), (4, 0.2)}
    later = tmp_path / "outputs" / "multirun" / "1999-01-01" / "00-00-00"  # an older sweep: not the latest
    later.mkdir(parents=True)
    reported = run_module("rloo.report", cwd=tmp_path)
    assert reported.returncode == 0, reported.stderr
    assert f"the latest sweep, {sweep.relative_to(tmp_path)}" in reported.stderr
    assert len(list(csv.DictReader((sweep / "report.csv").open()))) == 4


def test_a_contrast_of_several_settings_has_welch_satterthwaites_interval():
    from rloo.evaluation.intervals import contrast_interval

    # [1, 2, 3] - [2, 4, 6]: variances 1 and 4 over 3 seeds, v = 1/3 + 4/3 = 5/3; df = (5/3)^2 / ((1/3)^2 / 2 +
    # (4/3)^2 / 2) = 50/17 = 2.94, which the table takes as 2 (t = 4.303)
    estimate, low, high = contrast_interval([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0]], [1.0, -1.0])
    assert estimate == pytest.approx(-2.0) and high - estimate == pytest.approx(4.303 * (5 / 3) ** 0.5)


FACTORIAL = {  # a 2 x 2 sweep: cell means 1.1 (first, first), 3.1 (std on), 2.1 (kl on), 6.1 (both)
    "s/std=loo s/kl=reward": [1.0, 1.2],
    "s/std=group_std s/kl=reward": [3.0, 3.2],
    "s/std=loo s/kl=loss": [2.0, 2.2],
    "s/std=group_std s/kl=loss": [6.0, 6.2],
}


def test_a_factorial_sweep_gives_main_effects_and_interactions_by_hand():
    from rloo.evaluation.factorial import factorial_of

    design = factorial_of({name: name.split() for name in FACTORIAL})
    assert design.factors == (("s/std", "loo", "group_std"), ("s/kl", "reward", "loss"))
    effects = dict(design.effects(FACTORIAL))
    # std: ((3.1 - 1.1) + (6.1 - 2.1)) / 2 = 3; kl: ((2.1 - 1.1) + (6.1 - 3.1)) / 2 = 2; std x kl: (6.1 - 2.1) -
    # (3.1 - 1.1) = 2. Each cell's variance 0.02 over 2 seeds: a main effect's v = 4 * (1/2)^2 * 0.01 = 0.01, df 4
    # (t = 2.776); the interaction's v = 4 * 0.01 = 0.04, df 4
    for name, estimate, half in [("std", 3.0, 2.776 * 0.1), ("kl", 2.0, 2.776 * 0.1), ("std x kl", 2.0, 2.776 * 0.2)]:
        value, low, high = effects[name]
        assert value == pytest.approx(estimate) and high - value == pytest.approx(half), name
    assert factorial_of({name: name.split() for name in list(FACTORIAL)[:3]}) is None  # a cell missing


def test_the_report_writes_a_factorial_table_where_the_settings_form_one():
    from rloo.report import difference_interval, factorial_markdown

    rows = [
        {"status": "ok", "setting": name, "varying": name.split(), "win_rate": None, "outcomes": {"accuracy": v}}
        for name, values in FACTORIAL.items()
        for v in values
    ]
    table = factorial_markdown(rows)
    alone = difference_interval(FACTORIAL["s/std=group_std s/kl=reward"], FACTORIAL["s/std=loo s/kl=reward"])
    assert "| s/std=group_std | {:+.3f} [{:+.3f}, {:+.3f}] *".format(*alone) in table
    assert "| std x kl | +2.000 [" in table
    assert factorial_markdown(rows[:6]) == ""  # a cell missing
    assert factorial_markdown(rows[::2]) == ""  # one seed a cell: no interval
    two = [dict(r, varying=r["varying"][:1], setting=r["varying"][0]) for r in rows[:4]]
    assert factorial_markdown(two) == ""  # one factor: differences.md has the pair
