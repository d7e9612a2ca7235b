"""rloo.bench.peers: TRL's trainers at our settings. The smoke runs need TRL in this interpreter (CI has none):

PYTHONPATH=. <venv with TRL 1.16>/bin/python -m pytest tests/test_bench_peers.py   # RLOOTrainer (TRL 1.16)
PYTHONPATH=. <venv with TRL 1.12>/bin/python -m pytest tests/test_bench_peers.py   # PPOTrainer (TRL 1.12)
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.e2e import HANG_GUARD_S

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_importing_peers_needs_no_trl():
    code = "import sys, rloo.bench.peers; assert 'trl' not in sys.modules, 'peers imported TRL at module level'"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_trl_version_asks_the_interpreter():
    from rloo.bench.peers import trl_version

    version = trl_version(sys.executable)
    expected = None if importlib.util.find_spec("trl") is None else __import__("trl").__version__
    assert version == expected
    assert version is None or re.fullmatch(r"\d+\.\d+\S*", version)
    assert trl_version(str(ROOT / "no-such-python")) is None


def test_completion_tokens_stop_at_the_first_eos():
    from rloo.bench.peers import Recorder

    recorder = Recorder(eos_token_id=1)
    prompts = torch.full((3, 2), 7)  # [B, prompt_length]
    completions = torch.tensor([[5, 6, 7, 8], [5, 1, 0, 0], [1, 1, 0, 0]])  # no EOS, EOS at 1, EOS at 0
    recorder.start()
    recorder.count_completions(torch.cat([prompts, completions], 1), prompt_length=2)
    recorder.stop()
    assert recorder.steps[0]["tokens"] == 4 + 2 + 1  # the EOS itself counts, as in both trainers' masks
    assert recorder.rollouts == 1 and recorder.generated_widths == [4]
    assert recorder.distinct_fractions == [1.0]


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["rloo", "ppo", "dapo"])
def test_peer_worker_writes_every_field(tmp_path, algorithm):
    trl = pytest.importorskip("trl")
    if algorithm == "ppo" and not _has("trl.experimental.ppo"):
        pytest.skip(f"TRL {trl.__version__} has no PPOTrainer (the last release with it is 1.12)")
    if algorithm != "ppo" and tuple(int(p) for p in trl.__version__.split(".")[:2]) < (1, 16):
        pytest.skip(f"the RLOO and GRPO peers are TRL 1.16's trainers; this is TRL {trl.__version__}")
    out = tmp_path / "result.json"
    epochs = 2
    command = [
        sys.executable,
        "-m",
        "rloo.bench.peers",
        "--algorithm",
        algorithm,
        "--preset",
        "tiny",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--ppo-epochs",
        str(epochs),
        "--threads",
        "2",
        "--out",
        str(out),
    ]
    result = subprocess.run(
        command,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    r = json.loads(out.read_text())

    assert r["implementation"] == f"trl-{trl.__version__}" and r["algorithm"] == algorithm and r["preset"] == "tiny"
    assert r["device"] == "cpu" and r["threads"] == 2
    assert r["steps"] == 2 and len(r["step_seconds"]) == 2 and r["warmup"] == 1
    assert r["step_seconds_median"] > 0 and r["rollout_seconds_median"] > 0 and r["update_seconds_median"] > 0
    assert r["rollout_seconds_median"] + r["update_seconds_median"] == pytest.approx(r["step_seconds_median"], rel=0.2)
    # exactly W+N rollouts, and one optimiser step per rollout (RLOO) or per PPO epoch (one mini-batch)
    assert r["rollouts"] == 3 and r["optimizer_steps"] == 3 * (epochs if algorithm == "ppo" else 1)
    settings = r["settings"]
    assert settings["completions_per_step"] == 64 and settings["response_length"] == 16
    assert settings["completions_per_prompt"] == (1 if algorithm == "ppo" else 4)
    assert settings["num_ppo_epochs"] == (epochs if algorithm == "ppo" else 1)
    assert settings["activation_checkpointing"] is False and settings["precision"] == "fp32"
    # the sampling settings generate really used, and completions of full length (random weights rarely say EOS)
    generation = r["generation"]
    assert generation["resolved_config"]["do_sample"] is True
    assert generation["resolved_config"]["temperature"] == pytest.approx(0.7, abs=1e-4)
    assert generation["new_tokens_min"] == 16 and generation["distinct_completions_min"] == 1.0
    assert 0.9 * 64 * 16 <= r["tokens_per_step"] <= r["tokens_per_step_nominal"] == 64 * 16
    assert r["tokens_per_second"] > 0 and r["sum_gb_per_s"] > 0
    if algorithm == "dapo":  # GRPOTrainer's loss_type="dapo" in our keys: what the bench compares with algo=dapo
        assert r["algorithm_settings"] == {
            "loss_aggregation": "token_mean",
            "advantage": "group_std",
            "kl_coef": 0.0,
            "clip_range": 0.2,
            "clip_range_high": 0.28,
            "ratio_level": "token",
        }
    assert r["peak_rss_mb"] >= r["baseline_rss_mb"] > 0
    assert r["peak_rss_above_baseline_mb"] == pytest.approx(r["peak_rss_mb"] - r["baseline_rss_mb"])
    state = r["model_state_mb"]
    # policy, reference, reward (+ value for PPO) held; the policy (+ value) trained, with Adam's two moments
    trained = 2 if algorithm == "ppo" else 1
    frozen = 1 if algorithm == "dapo" else 2  # GRPOTrainer loads no reference at beta 0
    assert state["parameters"] > 0
    assert state["gradients"] == pytest.approx(state["parameters"] * trained / (trained + frozen), rel=0.1)
    assert state["optimizer"] == pytest.approx(2 * state["gradients"], rel=1e-3)
    assert set(r["versions"]) >= {"torch", "transformers", "trl"} and r["versions"]["trl"] == trl.__version__
    assert r["python"] == ".".join(map(str, sys.version_info[:3]))
