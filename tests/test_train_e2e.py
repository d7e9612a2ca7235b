"""`python -m rloo.train` end to end in a subprocess: bootstrap, RLOO, run-dir artifacts, saved policy."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent

TINY_BOOTSTRAP = [
    "bootstrap.task.n_train=128", "bootstrap.task.n_validation=32", "bootstrap.task.n_test=8",
    "bootstrap.architecture.hidden_size=32", "bootstrap.architecture.intermediate_size=64",
    "bootstrap.sft.epochs=1", "bootstrap.reward.num_pairs=128", "bootstrap.reward.num_heldout_pairs=32",
    "bootstrap.reward.epochs=1",
]
TINY_RUN = ["k=2", "rollout_batch_size=8", "micro_batch_size=4", "generation_batch_size=8", "total_episodes=24",
            "response_length=8", "eval.num_prompts=8", "sample_every=1", "checkpoint_every=1"]
METRICS = ["objective/scores", "objective/kl", "objective/rlhf_reward", "objective/non_score_reward",
           "objective/entropy", "policy/clipfrac_avg", "policy/approxkl_avg", "loss/policy_avg", "val/ratio",
           "completions/mean_length", "completions/eos_frac", "frac_reward_zero_std", "time/rollout",
           "time/update", "time/tokens_per_second", "lr", "episode", "epoch"]


def train(run_dir: Path, cache: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLOO_CACHE_DIR": str(cache), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "rloo.train", f"hydra.run.dir={run_dir}", *TINY_BOOTSTRAP, *TINY_RUN,
                           *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("e2e")
    result = train(base / "run", base / "cache", "num_ppo_epochs=2", "num_mini_batches=2")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return base, result


def test_run_writes_summary_with_before_and_after_metrics(finished_run):
    base, result = finished_run
    summary = json.loads((base / "run" / "summary.json").read_text())
    assert summary["steps"] == 24 // 8 == 3  # one step per rollout
    assert summary["episodes"] == 24
    for stage in ("initial", "final"):
        assert 0.0 <= summary[stage]["eval/win_rate"] <= 1.0
        assert isinstance(summary[stage]["eval/score"], float)
    assert summary["wall_seconds"] > 0
    assert "eval/win_rate" in result.stdout and str(base / "run") in result.stdout


def test_run_dir_holds_config_logs_checkpoints_and_samples(finished_run):
    base, _ = finished_run
    run = base / "run"
    assert (run / "config.yaml").exists() and (run / ".hydra" / "overrides.yaml").exists()
    assert sorted(p.name for p in (run / "checkpoints").glob("step*.ckpt")) == ["step1.ckpt", "step2.ckpt", "step3.ckpt"]
    assert list((run / "wandb").glob("offline-run-*")), "W&B runs offline inside the run dir"
    rows = list(csv.DictReader((run / "csv" / "metrics.csv").open()))
    logged = {key for row in rows for key, value in row.items() if value not in ("", None)}
    assert set(METRICS) <= logged, set(METRICS) - logged
    assert {"eval/win_rate", "eval/score"} <= logged
    # one row of train metrics per step, at steps 0..2, with the episode counter in completions
    episodes = [float(r["episode"]) for r in rows if r.get("episode")]
    assert episodes == [8.0, 16.0, 24.0]
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and {"prompt", "completion", "score", "advantage"} <= set(samples[0])


def test_checkpoint_holds_only_the_policy(finished_run):
    base, _ = finished_run
    checkpoint = torch.load(base / "run" / "checkpoints" / "last.ckpt", weights_only=False)
    assert checkpoint["state_dict"] and all(k.startswith("policy.") for k in checkpoint["state_dict"])


def test_final_policy_loads_with_transformers_and_generates(finished_run):
    base, _ = finished_run
    policy = AutoModelForCausalLM.from_pretrained(base / "run" / "policy")
    tokenizer = AutoTokenizer.from_pretrained(base / "run" / "policy")
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None
    inputs = tokenizer(["POST: the cat was on my boat\n\nTL;DR:"], return_tensors="pt")
    out = policy.generate(**inputs, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > inputs.input_ids.shape[1]


def test_second_run_reuses_the_cached_bootstrap(finished_run):
    base, _ = finished_run
    result = train(base / "run2", base / "cache", "eval.before=false", "logger=csv")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "building" not in result.stdout + result.stderr
    assert len([p for p in (base / "cache").iterdir() if p.is_dir()]) == 1


def test_resume_from_checkpoint_continues_to_the_same_total(finished_run):
    base, _ = finished_run
    ckpt = base / "run" / "checkpoints" / "step1.ckpt"
    result = train(base / "resumed", base / "cache", "num_ppo_epochs=2", "num_mini_batches=2", f"ckpt_path={ckpt}",
                   "logger=csv", "eval.before=false")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((base / "resumed" / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["episodes"] == 24


def test_ddp_on_two_cpu_processes_splits_the_episodes(finished_run):
    base, _ = finished_run
    result = train(base / "ddp", base / "cache", "trainer.strategy=ddp", "trainer.devices=2", "trainer.num_threads=1",
                   "total_episodes=32", "logger=csv")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((base / "ddp" / "summary.json").read_text())
    assert summary["steps"] == 32 // (8 * 2) and summary["episodes"] == 32  # each step is a rollout on every rank
