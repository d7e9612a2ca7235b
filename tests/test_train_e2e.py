"""`python -m rloo.train` end to end in a subprocess: bootstrap, RLOO, run-dir artifacts, saved policy."""

import csv
import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.e2e import METRICS, train


@pytest.mark.slow
def test_run_writes_summary_with_before_and_after_metrics(finished_run):
    base, result = finished_run
    summary = json.loads((base / "run" / "summary.json").read_text())
    assert summary["rollouts"] == 24 // 8 == 3  # one batch of the train loop per rollout
    assert summary["optimizer_steps"] == 3 * 2 * 2  # Lightning's global_step: 2 epochs x 2 mini-batches each
    assert summary["episodes"] == 24
    for stage in ("initial", "final"):
        assert 0.0 <= summary[stage]["eval/win_rate"] <= 1.0
        assert isinstance(summary[stage]["eval/score"], float)
    assert summary["wall_seconds"] > 0
    assert "eval/win_rate" in result.stdout and str(base / "run") in result.stdout


@pytest.mark.slow
def test_run_dir_holds_config_logs_checkpoints_and_samples(finished_run):
    base, _ = finished_run
    run = base / "run"
    assert (run / "config.yaml").exists() and (run / ".hydra" / "overrides.yaml").exists()
    # checkpoint_every=1 rollout; Lightning names them by its global step (4 optimiser steps per rollout)
    saved = {p.name: torch.load(p, weights_only=False) for p in (run / "checkpoints").glob("step*.ckpt")}
    assert sorted(saved) == ["step12.ckpt", "step4.ckpt", "step8.ckpt"]
    assert [saved[f"step{4 * r}.ckpt"]["rloo_rollouts"] for r in (1, 2, 3)] == [1, 2, 3]
    assert list((run / "wandb").glob("offline-run-*")), "W&B runs offline inside the run dir"
    rows = list(csv.DictReader((run / "csv" / "metrics.csv").open()))
    logged = {key for row in rows for key, value in row.items() if value not in ("", None)}
    assert set(METRICS) <= logged, set(METRICS) - logged
    assert {"eval/win_rate", "eval/score"} <= logged
    # one row of train metrics per rollout, at steps 0..2, with the episode counter in completions
    episodes = [float(r["episode"]) for r in rows if r.get("episode")]
    assert episodes == [8.0, 16.0, 24.0]
    assert [float(r["train/rollout"]) for r in rows if r.get("train/rollout")] == [1.0, 2.0, 3.0]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and {"prompt", "completion", "score", "advantage"} <= set(samples[0])


@pytest.mark.slow
def test_eval_runs_every_eval_every_steps_with_interval_and_judged_samples(finished_run):
    base, _ = finished_run
    run = base / "run"
    rows = list(csv.DictReader((run / "csv" / "metrics.csv").open()))
    evals = [r for r in rows if r.get("eval/win_rate")]
    assert [int(r["step"]) for r in evals] == [0, 2, 3]  # before, eval_every=2, after
    for r in evals:
        low, rate, high = (float(r[k]) for k in ("eval/win_rate_ci_low", "eval/win_rate", "eval/win_rate_ci_high"))
        assert 0.0 <= low <= rate <= high <= 1.0
        counts = [int(float(r[f"eval/{k}"])) for k in ("wins", "ties", "losses", "invalid")]
        assert sum(counts) == 8 and rate == (counts[0] + 0.5 * counts[1]) / (8 - counts[3])
    judged = [json.loads(line) for line in (run / "eval_samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in judged] == [0] * 8 + [2] * 8 + [3] * 8
    assert {"prompt", "reference", "completion", "verdict", "order", "score"} <= set(judged[0])
    summary = json.loads((run / "summary.json").read_text())
    assert [h["step"] for h in summary["eval_history"]] == [0, 2, 3] and summary["judge"] == "OracleJudge()"


@pytest.mark.slow
def test_checkpoint_holds_only_the_policy(finished_run):
    base, _ = finished_run
    checkpoint = torch.load(base / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["state_dict"] and all(k.startswith("policy.") for k in checkpoint["state_dict"])


@pytest.mark.slow
def test_final_policy_loads_with_transformers_and_generates(finished_run):
    base, _ = finished_run
    policy = AutoModelForCausalLM.from_pretrained(base / "run" / "policy")
    tokenizer = AutoTokenizer.from_pretrained(base / "run" / "policy")
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    inputs = tokenizer(["POST: the cat was on my boat\n\nTL;DR:"], return_tensors="pt")
    out = policy.generate(**inputs, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > inputs.input_ids.shape[1]


@pytest.mark.slow
def test_second_run_reuses_the_cached_bootstrap(finished_run):
    base, _ = finished_run
    result = train(base / "run2", base / "cache", "eval.before=false", "logger=csv")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "building" not in result.stdout + result.stderr
    assert len([p for p in (base / "cache").iterdir() if p.is_dir()]) == 1


@pytest.mark.slow
def test_resume_from_checkpoint_continues_to_the_same_total(finished_run):
    base, _ = finished_run
    ckpt = base / "run" / "checkpoints" / "step4.ckpt"  # after the first rollout
    result = train(
        base / "resumed",
        base / "cache",
        "num_ppo_epochs=2",
        "num_mini_batches=2",
        f"resume={ckpt}",
        "logger=csv",
        "eval.before=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((base / "resumed" / "summary.json").read_text())
    assert summary["rollouts"] == 3 and summary["optimizer_steps"] == 12 and summary["episodes"] == 24


@pytest.mark.slow
def test_reinforce_pp_baseline_whitens_over_both_ranks_under_ddp(finished_run):
    """The batch whitening's sums are reduced over the ranks (the math: tests/test_estimators.py, two threads as
    two ranks); here the collective runs in a real DDP run alongside Lightning's, and the run finishes."""
    base, _ = finished_run
    result = train(
        base / "ddp_reinforce_pp_baseline",
        base / "cache",
        "algo=reinforce_pp_baseline",
        "trainer.strategy=ddp",
        "trainer.devices=2",
        "trainer.num_threads=1",
        "total_episodes=32",
        "logger=csv",
        "num_mini_batches=2",
        "eval.before=false",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((base / "ddp_reinforce_pp_baseline" / "summary.json").read_text())
    assert (summary["status"], summary["rollouts"], summary["optimizer_steps"]) == ("finished", 2, 4)
