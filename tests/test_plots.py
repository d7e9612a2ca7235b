"""The figures: a run's curves.png (every run writes it, a failed one up to where it got; rloo.report <run dir>
draws it again) and a sweep's plots of the metrics its jobs have. Each figure is read back from its PNG
(rloo.run.plots.described: its axes, lines, intervals and labels, as the figure's artists were saved)."""

import csv
import json

import pytest
import yaml

from rloo.run.plots import described
from tests import reward_functions
from tests.e2e import run_module

FAST = {"debug": "fast", "logger": "csv"}


def panels(path) -> dict:
    return {a["title"]: a for a in described(path)["axes"]}


def test_a_run_writes_its_learning_curves_with_the_held_out_intervals(embedded_task, tmp_path, monkeypatch):
    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    out = tmp_path / "run"
    summary = rloo.fit(FAST | {"eval_every": "1"}, reward=["model", reward_functions.length], output_dir=out)
    assert summary["curves"].startswith("curves.png: 6 panels of 6 drawn")
    figure = panels(out / "curves.png")
    rows = list(csv.DictReader((out / "csv" / "metrics.csv").open()))
    trained = [r for r in rows if r.get("objective/kl")]
    score = {line["label"]: line for line in figure["score and reward terms"]["lines"]}
    assert set(score) == {"objective/scores", "reward/model", "reward/length"}
    assert score["objective/scores"]["x"] == [1.0, 2.0, 3.0]
    assert score["objective/scores"]["y"] == pytest.approx([float(r["objective/scores"]) for r in trained])
    assert figure["KL to the reference"]["lines"][0]["y"] == pytest.approx([float(r["objective/kl"]) for r in trained])
    assert figure["completion length"]["ylabel"] == "tokens" and figure["clip fractions"]["lines"]
    # the win rate at each of the four evaluations (before training and after each rollout), with its interval
    (win,) = figure["held-out proportions"]["intervals"]
    history = summary["eval_history"]
    assert win["label"] == "win_rate" and win["x"] == [h["step"] for h in history] == [0, 1, 2, 3]
    assert win["y"] == pytest.approx([h["eval/win_rate"] for h in history])
    assert win["low"] == pytest.approx([h["eval/win_rate_ci_low"] for h in history])
    assert win["high"] == pytest.approx([h["eval/win_rate_ci_high"] for h in history])
    rewards = figure["held-out rewards"]
    assert [i["label"] for i in rewards["intervals"]] == ["reward/length"]
    assert [line["label"] for line in rewards["lines"]] == ["score (reward model)"]


def test_a_failed_run_draws_its_curves_up_to_where_it_got(embedded_task, tmp_path, monkeypatch):
    import rloo
    from rloo.utils.errors import RewardFunctionError

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    reward_functions.CALLS_SEEN["n"] = 0
    out = tmp_path / "failed"
    with pytest.raises(RewardFunctionError, match="the grader went away"):
        rloo.fit(
            FAST | {"judge": "none", "eval.before": "false", "eval_every": "0"},
            reward=[reward_functions.fails_on_the_third_call],
            output_dir=out,
        )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["curves"].startswith("curves.png: ")
    figure = panels(out / "curves.png")
    assert figure["score and reward terms"]["lines"][0]["x"] == [1.0, 2.0]  # the two rollouts it trained
    assert figure["held-out proportions"]["notes"] == ["none evaluated by this run"]


def test_a_run_without_metrics_says_why_it_has_no_curves(embedded_task, tmp_path, monkeypatch):
    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    out = tmp_path / "quiet"
    summary = rloo.fit({"debug": "fast", "logger": "none", "judge": "none"}, output_dir=out)
    assert summary["curves"] == "curves.png: not drawn: the run kept no csv/metrics.csv (logger=none)"
    assert not (out / "curves.png").exists()
    assert summary["curves"] in (out / "train.log").read_text()


# ---- a sweep's figures, from job dirs as Hydra and rloo write them ---------------------------------------------
def write_job(sweep, n: int, overrides: list[str], summary: dict) -> None:
    job = sweep / f"{n}_{','.join(overrides)}"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    config = {o.split("=")[0]: o.split("=")[1] for o in overrides}
    config = {"algorithm": config.get("algo", "rloo"), "seed": int(config.get("seed", 0)), "k": int(config["k"])}
    (job / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config | {"clip_range": 0.2, "kl_coef": 0.05}))
    (job / "summary.json").write_text(json.dumps({"status": "finished", **summary}))


def rlvr_sweep(tmp_path):
    """algo x k x seed with no judge: accuracy and pass@2 at each evaluation, one seed for grpo at k=4."""
    sweep, n = tmp_path / "sweep", 0
    accuracy = {("rloo", 2): [0.5, 0.6], ("rloo", 4): [0.7, 0.8], ("grpo", 2): [0.4, 0.5], ("grpo", 4): [0.9]}
    for (algo, k), values in accuracy.items():
        for seed, value in enumerate(values):
            history = [
                {"step": s, "episodes": 16 * s, "train_seconds": 2.0 * s, "eval/accuracy": value * s / 2}
                for s in (0, 1, 2)
            ]
            final = {"eval/accuracy": value, "eval/pass@2": min(1.0, value + 0.1)}
            write_job(sweep, n, [f"algo={algo}", f"k={k}", f"seed={seed}"], {"final": final, "eval_history": history})
            n += 1
    return sweep, accuracy


def test_an_rlvr_sweep_plots_its_outcomes_one_line_per_setting_and_n_for_one_seed(tmp_path):
    sweep, accuracy = rlvr_sweep(tmp_path)
    result = run_module("rloo.report", str(sweep))
    assert result.returncode == 0, result.stderr
    figures = sorted(p.name for p in sweep.glob("*.png"))
    assert figures == ["accuracy_vs_episodes.png", "accuracy_vs_k.png", "pass_at_2_vs_episodes.png", "verifiable.png"]
    (axes,) = described(sweep / "accuracy_vs_k.png")["axes"]
    assert axes["xlabel"] == "k (completions per prompt)"
    # rloo and grpo are two lines, not one: the setting is the overrides other than k and seed
    lines = {i["label"]: i for i in axes["intervals"]} | {line["label"]: line for line in axes["lines"]}
    assert set(lines) == {"algo=rloo (n = 2)", "algo=grpo (n = 1/2)"}
    assert lines["algo=rloo (n = 2)"]["x"] == [2.0, 4.0]
    assert lines["algo=rloo (n = 2)"]["y"] == pytest.approx([0.55, 0.75])
    grpo = lines["algo=grpo (n = 1/2)"]
    assert grpo["y"] == pytest.approx([0.45, 0.9]) and grpo["high"][1] == grpo["low"][1] == 0.9  # k=4: one seed, no bar
    (curve,) = described(sweep / "accuracy_vs_episodes.png")["axes"]
    assert {line["label"] for line in curve["lines"]} == {
        "algo=rloo k=2 (n = 2)",
        "algo=rloo k=4 (n = 2)",
        "algo=grpo k=2 (n = 2)",
        "algo=grpo k=4 (n = 1)",
    }
    assert "held-out accuracy" in curve["ylabel"] and curve["xlabel"].startswith("episodes")
    (outcomes,) = described(sweep / "verifiable.png")["axes"]  # proportions: every interval inside [0, 1]
    assert outcomes["intervals"] and all(0.0 <= v <= 1.0 for i in outcomes["intervals"] for v in i["low"] + i["high"])
    assert max(v for i in outcomes["intervals"] for v in i["high"]) == 1.0  # a cut one: rloo k=4's pass@2
    settings = (sweep / "settings.md").read_text()
    assert "| algo=grpo k=4 | 1 | 0.900 (n = 1) |" in settings  # not a zero-width [0.900, 0.900]
    assert "[0.900, 0.900]" not in settings + (sweep / "verifiable.md").read_text()


def test_report_of_a_run_dir_draws_its_curves(embedded_task, tmp_path, monkeypatch):
    import rloo

    monkeypatch.setenv("RLOO_CACHE_DIR", str(embedded_task / "cache"))
    out = tmp_path / "run"
    rloo.fit(FAST | {"judge": "none"}, output_dir=out)
    (out / "curves.png").unlink()
    result = run_module("rloo.report", str(out))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == f"report: {out}: finished"
    assert "curves.png: 5 panels of 6 drawn" in result.stdout and (out / "curves.png").is_file()
    assert run_module("rloo.report", str(tmp_path)).returncode == 2  # neither a run dir nor a sweep
