"""`python -m rloo.evaluate` end to end in a subprocess, on the tiny embedded task (bootstrap shared with the
training e2e run), with the oracle, head to head, and the OpenAI judge against a loopback server."""

import json
import statistics
import sys

import pytest

from rloo.toy.task import oracle_judge, oracle_score
from tests.chat_server import answer, sections
from tests.e2e import HANG_GUARD_S, evaluate

LABELS = {1.0: "win", 0.5: "tie", 0.0: "loss"}


def outputs(run_dir):
    verdicts = [json.loads(line) for line in (run_dir / "verdicts.jsonl").read_text().splitlines()]
    return json.loads((run_dir / "summary.json").read_text()), verdicts


@pytest.mark.slow
def test_sft_policy_vs_references_with_the_oracle(finished_run):
    base, _ = finished_run
    result = evaluate(base / "eval_sft", base / "cache", "eval.num_prompts=16")
    assert result.returncode == 0, result.stderr[-3000:]
    summary, verdicts = outputs(base / "eval_sft")
    assert len(verdicts) == summary["num_prompts"] == 16 and summary["opponent"] == "reference"
    assert {"prompt", "reference", "completion", "verdict", "order", "length", "score"} <= set(verdicts[0])
    # independent: the oracle on the written completions, then the rate and the interval from the per-pair scores
    scores = [oracle_judge(v["prompt"], v["completion"], v["reference"]) for v in verdicts]
    assert [v["verdict"] for v in verdicts] == [LABELS[s] for s in scores]
    assert (summary["wins"], summary["ties"], summary["losses"], summary["invalid"]) == (
        scores.count(1.0),
        scores.count(0.5),
        scores.count(0.0),
        0,
    )
    rate, n, z2 = statistics.fmean(scores), len(scores), 1.959964**2  # Wilson's interval at n = 16
    centre = (rate + z2 / (2 * n)) / (1 + z2 / n)
    half = (z2 * (rate * (1 - rate) / n + z2 / (4 * n * n))) ** 0.5 / (1 + z2 / n)
    assert abs(summary["win_rate"] - rate) < 1e-9
    assert abs(summary["win_rate_ci_low"] - max(0.0, centre - half)) < 1e-5
    assert abs(summary["win_rate_ci_high"] - min(1.0, centre + half)) < 1e-5
    assert summary["mean_length"] == statistics.fmean(v["length"] for v in verdicts)
    assert "win rate" in result.stdout and "95% CI" in result.stdout


@pytest.mark.slow
def test_trained_run_dir_and_head_to_head(finished_run):
    base, _ = finished_run
    result = evaluate(base / "eval_run", base / "cache", f"policy={base / 'run'}", "eval.num_prompts=8")
    assert result.returncode == 0, result.stderr[-3000:]
    summary, _ = outputs(base / "eval_run")
    assert summary["policy"] == str(base / "run" / "policy")
    # a policy against itself, greedy: the same completions, so every pair is a tie
    result = evaluate(
        base / "eval_self",
        base / "cache",
        f"policy={base / 'run'}",
        f"opponent={base / 'run' / 'policy'}",
        "eval.num_prompts=8",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary, verdicts = outputs(base / "eval_self")
    assert summary["ties"] == 8 and summary["win_rate"] == 0.5 and summary["opponent"] == str(base / "run" / "policy")
    assert all(v["opponent"] == v["completion"] for v in verdicts)


def test_missing_policy_is_one_line_before_any_model_loads(tmp_path, monkeypatch, capsys):
    from tests.test_cli import run_module

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    assert run_module("rloo.evaluate", f"hydra.run.dir={tmp_path / 'bad'}", f"policy={tmp_path / 'nope'}") == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "policy=" in lines[0] and "does not exist" in lines[0]


def oracle_server(index, body, headers):
    """Answers as the oracle would (A on a tie), in the chat-completions protocol."""
    post, a, b = sections(body)
    return answer(
        "Comparison: by the oracle.\nPreferred: "
        + ("A" if oracle_score(post, " " + a) >= oracle_score(post, " " + b) else "B")
    )


@pytest.mark.slow
def test_openai_judge_through_evaluate_on_a_loopback_server(finished_run, server, tmp_path):
    base, _ = finished_run
    url, state = server
    state.respond = oracle_server
    secret = "sk-evaluate-test-5b1c"
    args = [
        "judge=openai",
        f"judge.base_url={url}",
        "judge.model=local-judge",
        f"judge.cache_dir={tmp_path / 'cache'}",
        "judge.backoff=0.01",
        "eval.num_prompts=16",
    ]
    result = evaluate(tmp_path / "first", base / "cache", *args, env={"OPENAI_API_KEY": secret})
    assert result.returncode == 0, result.stderr[-3000:]
    summary, verdicts = outputs(tmp_path / "first")
    assert state.count == 16 and summary["judge_requests_sent"] == 16
    assert all(r["authorization"] == f"Bearer {secret}" and r["body"]["model"] == "local-judge" for r in state.requests)
    for v in verdicts:  # the swap is undone: where the oracle decides, the API judge agrees with it
        truth = oracle_judge(v["prompt"], v["completion"], v["reference"])
        assert v["verdict"] in ("win", "loss") and (truth == 0.5 or v["verdict"] == LABELS[truth])
        assert v["order"] in ("candidate_first", "other_first") and v["judge_answer"].startswith("Comparison:")
    assert {v["order"] for v in verdicts} == {"candidate_first", "other_first"}
    again = evaluate(tmp_path / "second", base / "cache", *args, env={"OPENAI_API_KEY": secret})
    assert again.returncode == 0, again.stderr[-3000:]
    summary2, verdicts2 = outputs(tmp_path / "second")
    assert state.count == 16 and summary2["judge_requests_sent"] == 0 and summary2["judge_cache_hits"] == 16
    assert [v["verdict"] for v in verdicts2] == [v["verdict"] for v in verdicts]
    for text in (
        result.stdout,
        result.stderr,
        again.stdout,
        again.stderr,
        *(p.read_text() for p in tmp_path.rglob("*") if p.is_file()),
    ):
        assert secret not in text


def test_a_reward_model_or_a_nan_policy_is_refused_in_one_line(embedded_task, tmp_path, monkeypatch, capsys):
    """A reward model's dir would load as a causal LM with a random head and a diverged (nan) policy samples
    garbage: both were scored without a word. The first is refused from config.json, before anything loads."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.test_cli import run_module

    base = embedded_task
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setenv("RLOO_CACHE_DIR", str(base / "cache"))
    reward_model = next((base / "cache").glob("toy-*/reward_model"))
    assert run_module("rloo.evaluate", f"hydra.run.dir={tmp_path / 'rm'}", f"policy={reward_model}") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "is a GPTNeoXForSequenceClassification, not a causal LM" in err[0]

    policy = AutoModelForCausalLM.from_pretrained(next((base / "cache").glob("toy-*/policy")))
    with torch.no_grad():
        policy.gpt_neox.layers[0].mlp.dense_h_to_4h.weight[0, 0] = float("nan")
    policy.save_pretrained(tmp_path / "nan-policy")
    args = [f"hydra.run.dir={tmp_path / 'nan'}", f"policy={tmp_path / 'nan-policy'}", "bootstrap=fast"]
    assert run_module("rloo.evaluate", *args, "eval.num_prompts=4", "response_length=8") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and "has non-finite weights in 1 of" in err[0] and "layers.0.mlp.dense_h_to_4h" in err[0]
    assert not (tmp_path / "nan" / "summary.json").exists()


def test_an_evaluation_makes_its_own_run_dir_and_no_other(tmp_path, monkeypatch):
    """Hydra resolved the training run dir (which makes itself) while composing rloo.evaluate's: two empty dirs
    under outputs/<date>/ and outputs/multirun/<date>/ per evaluation."""
    from tests.test_cli import run_module

    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.chdir(tmp_path)
    assert run_module("rloo.evaluate", f"policy={tmp_path / 'nope'}") == 2
    made = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_dir() and ".hydra" not in p.parts)
    assert len(made) == 4 and made[:2] == ["outputs", "outputs/evaluate"], made


def test_a_plugin_judge_that_exits_fails_the_evaluation_in_one_line(embedded_task, tmp_path, monkeypatch, capsys):
    """SystemExit(0) inside a judge ended the process with exit 0 before: now exit 1 naming the judge."""
    from tests.test_cli import run_module

    base = embedded_task
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setenv("RLOO_CACHE_DIR", str(base / "cache"))
    args = [f"hydra.run.dir={tmp_path / 'eval'}", "bootstrap=fast", "eval.num_prompts=4", "response_length=8"]
    assert run_module("rloo.evaluate", *args, "judge._target_=tests.plugin_judges.Exits") == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ["error: judge Exits raised at tests/plugin_judges.py:17 in judge: SystemExit: 0"]
    assert not (tmp_path / "eval" / "summary.json").exists()


@pytest.mark.slow
def test_sigterm_while_a_plugin_judge_hangs_ends_the_evaluation_within_seconds(finished_run, tmp_path):
    import os
    import signal
    import subprocess
    import time

    from tests.e2e import ROOT

    base, _ = finished_run
    mark = tmp_path / "entered"
    env = {**os.environ, "RLOO_CACHE_DIR": str(base / "cache"), "HF_HUB_OFFLINE": "1", "RLOO_TEST_HANG_MARK": str(mark)}
    command = [sys.executable, "-m", "rloo.evaluate", f"hydra.run.dir={tmp_path / 'eval'}", "bootstrap=fast"]
    command += ["eval.num_prompts=4", "response_length=8", "judge._target_=tests.plugin_judges.Hangs"]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + HANG_GUARD_S
    while not mark.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mark.exists(), process.communicate()[0][-3000:]
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=HANG_GUARD_S)[0]
    # a bound on a hang: the judge never returns and eval.judge_timeout_s is 1800 s; SIGTERM ended it long before
    assert process.returncode == 128 + signal.SIGTERM and time.monotonic() - sent < 600, output[-3000:]
    assert "rloo.evaluate: stopped by SIGTERM" in output and "Traceback" not in output
    assert not (tmp_path / "eval" / "verdicts.jsonl").exists() and not (tmp_path / "eval" / "summary.json").exists()
    assert not [p for p in (tmp_path / "eval").iterdir() if ".tmp-" in p.name]


@pytest.mark.slow
def test_evaluate_runs_episodes_in_an_environment(finished_run):
    """python -m rloo.evaluate env=topic_recall: held-out greedy episodes, their mean return (reward/env) with turns
    and the fraction cut short, and each episode's turns with their roles in verdicts.jsonl."""
    base, _ = finished_run
    result = evaluate(base / "eval_env", base / "cache", "env=topic_recall", "eval.num_prompts=8", "judge=none")
    assert result.returncode == 0, result.stderr[-3000:]
    summary, records = outputs(base / "eval_env")
    assert len(records) == 8 and 1 <= summary["turns"] <= 3 and 0 <= summary["truncated"] <= 1
    returns = [r["rewards"]["env"] for r in records]
    assert abs(summary["reward/env"] - statistics.fmean(returns)) < 1e-9
    for record in records:
        roles = [m["role"] for m in record["messages"]]
        assert roles[0] == "assistant" and roles.count("assistant") == record["turns"]
    assert "return" in result.stdout and "turns" in result.stdout
