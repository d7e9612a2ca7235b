"""`python -m rloo.evaluate` end to end in a subprocess, on the tiny embedded task (bootstrap shared with the
training e2e run), with the oracle, head to head, and the OpenAI judge against a loopback server."""

import json
import statistics
import sys

import pytest

from rloo.toy.task import oracle_judge, oracle_score
from tests.chat_server import answer, sections
from tests.e2e import evaluate

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
    rate = statistics.fmean(scores)
    half = 1.959964 * statistics.stdev(scores) / len(scores) ** 0.5
    assert abs(summary["win_rate"] - rate) < 1e-9
    assert abs(summary["win_rate_ci_low"] - max(0.0, rate - half)) < 1e-5
    assert abs(summary["win_rate_ci_high"] - min(1.0, rate + half)) < 1e-5
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
