"""python -m rloo.bench: a smoke run of every configuration (fields, not timings), and the memory accounting."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rloo.bench.measure import model_state_mb
from rloo.bench.presets import PRESETS, build_models, build_tokenizer, random_prompts
from tests.e2e import HANG_GUARD_S

ROOT = Path(__file__).resolve().parent.parent


def bench(*args, timeout=HANG_GUARD_S):
    return subprocess.run(
        [sys.executable, "-m", "rloo.bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.slow
def test_bench_smoke_run_writes_every_field(tmp_path):
    result = bench(
        "--presets",
        "tiny",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--ppo-epochs",
        "1,2",
        "--grpo",
        "dapo",
        "--peers",
        "none",
        "--out",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "results.json").read_text())
    assert {"date", "machine", "args", "results", "ratios"} <= set(report)
    assert report["machine"]["cores"] >= 1 and report["machine"]["torch"] == torch.__version__
    runs = {(r["algorithm"], r.get("ppo_epochs")): r for r in report["results"]}
    assert set(runs) == {("rloo", None), ("dapo", None), ("ppo", 1), ("ppo", 2)}
    for r in runs.values():
        assert "error" not in r, r
        assert r["steps"] == 2 and len(r["step_seconds"]) == 2 and r["warmup"] == 1
        assert r["step_seconds_median"] > 0 and r["rollout_seconds_median"] > 0 and r["update_seconds_median"] > 0
        assert r["rollout_seconds_median"] + r["update_seconds_median"] <= r["step_seconds_median"] * 1.01
        assert {"generate", "ref_logprobs", "scores"} <= set(r["phase_seconds_median"])
        assert r["peak_rss_mb"] >= r["baseline_rss_mb"] > 0 and r["peak_gpu_mb"] is None
        assert r["tokens_per_second"] > 0 and 0 < r["tokens_per_step"] <= 64 * 16
        assert r["settings"]["completions_per_step"] == 64  # equal completions per update for every algorithm
        assert r["sum_gb_per_s"] > 0 and r["generate_read_gb_per_s"] > 0  # the host's read rate beside every row
        assert r["generate_read_fraction"] == pytest.approx(r["generate_read_gb_per_s"] / r["sum_gb_per_s"])
    # DAPO's loss as conf/algo/dapo.yaml sets it, in the keys GRPOTrainer's settings are compared in
    assert runs[("dapo", None)]["algorithm_settings"] == {
        "loss_aggregation": "token_mean",
        "advantage": "group_std",
        "kl_coef": 0.0,
        "clip_range": 0.2,
        "clip_range_high": 0.28,
        "ratio_level": "token",
    }
    assert runs[("rloo", None)]["algorithm_settings"] is None
    assert runs[("rloo", None)]["settings"]["completions_per_prompt"] == 4
    assert runs[("ppo", 1)]["settings"]["completions_per_prompt"] == 1
    assert (
        "values" in runs[("ppo", 1)]["phase_seconds_median"]
        and "old_logprobs" in runs[("ppo", 1)]["phase_seconds_median"]
    )
    # PPO holds one more model and trains two: more parameter, gradient and optimiser bytes
    rloo_state, ppo_state = runs[("rloo", None)]["model_state_mb"], runs[("ppo", 1)]["model_state_mb"]
    added_parameters = ppo_state["parameters"] - rloo_state["parameters"]  # the value model
    assert added_parameters > 0
    assert ppo_state["gradients"] - rloo_state["gradients"] == pytest.approx(added_parameters, rel=1e-3)
    assert (ppo_state["optimizer"] - rloo_state["optimizer"]) / 2 == pytest.approx(
        added_parameters, rel=1e-3
    )  # Adam: 2 moments
    vs = {row["vs"]: row for row in report["ratios"]}
    assert set(vs) == {"rloo PPO (1 ep)", "rloo PPO (2 ep)"}
    row = vs["rloo PPO (1 ep)"]
    assert row["time_ratio"] == pytest.approx(
        runs[("rloo", None)]["step_seconds_median"] / runs[("ppo", 1)]["step_seconds_median"]
    )
    table = (tmp_path / "results.md").read_text()
    assert "| tiny | rloo RLOO |" in table and "rloo PPO (2 ep)" in table and "Machine:" in table


def test_the_speed_table_shows_the_gpu_peak_where_the_runs_had_a_gpu():
    from rloo.bench.__main__ import markdown

    def result(algorithm, gpu_mb):
        return {
            "preset": "pythia-1b",
            "implementation": "rloo",
            "algorithm": algorithm,
            "ppo_epochs": 4 if algorithm == "ppo" else None,
            "step_seconds_median": 1.0,
            "tokens_per_second": 10.0,
            "peak_rss_mb": 900.0,
            "peak_rss_above_baseline_mb": 800.0,
            "model_state_mb": {"total": 700.0},
            "peak_gpu_mb": gpu_mb,
        }

    args = {"threads": 8, "precision": "bf16-true", "steps": 3, "warmup": 1, "rloo_schedule": "1x1"}
    machine = {"cpu": "x", "cores": 16, "gpu": "NVIDIA H200", "torch": "2"}
    report = {"machine": machine, "args": args | {"trl_lm_head": "compact"}, "date": "d", "ratios": []}
    table = markdown(report | {"results": [result("rloo", 17166.3), result("ppo", 41431.8)]})
    lines = table.splitlines()
    at = next(i for i, line in enumerate(lines) if "| tokens/s |" in line)
    header, rule, rows = lines[at], lines[at + 1], lines[at + 2 : at + 4]
    assert "| tokens/s | peak GPU MB | peak RSS MB |" in header
    assert all(row.count("|") == header.count("|") == rule.count("|") for row in rows)
    assert "| 10 | 17166 | 900 |" in rows[0] and "| 10 | 41432 | 900 |" in rows[1]
    cpu_table = markdown(report | {"results": [result("rloo", None)]})
    assert "peak GPU MB" not in cpu_table


def test_a_grpo_pair_is_compared_only_where_its_loss_settings_agree():
    """Our GRPO family against TRL's GRPOTrainer of the same loss type: a ratio where both sides ran the same loss
    settings, none (and the first difference named) where they did not; never across loss types."""
    from rloo.bench.__main__ import markdown, ratios

    dapo = {"loss_aggregation": "token_mean", "advantage": "group_std", "kl_coef": 0.0, "clip_range": 0.2}

    def result(implementation, algorithm, seconds, settings):
        return {
            "preset": "tiny",
            "implementation": implementation,
            "algorithm": algorithm,
            "step_seconds_median": seconds,
            "tokens_per_second": 1.0,
            "peak_rss_mb": 500.0,
            "peak_rss_above_baseline_mb": 100.0,
            "model_state_mb": {"total": 20.0},
            "sum_gb_per_s": 30.0,
            "algorithm_settings": settings,
        }

    fair = [result("rloo", "dapo", 1.0, dapo), result("trl-1.16.0", "dapo", 4.0, dapo)]
    other_loss = result("trl-1.16.0", "grpo", 2.0, dapo | {"loss_aggregation": "seq_mean_token_mean"})
    rows = ratios([*fair, other_loss])
    assert [(row["rloo"], row["vs"], row["time_ratio"]) for row in rows] == [("rloo DAPO", "trl-1.16.0 DAPO", 0.25)]
    assert rows[0]["sum_rate_ratio"] == 1.0
    (row,) = ratios([fair[0], result("trl-1.16.0", "dapo", 4.0, dapo | {"kl_coef": 0.04})])
    assert row["time_ratio"] is None and row["unfair"] == "kl_coef: rloo 0.0, trl-1.16.0 0.04"
    report = {"machine": {"cpu": "x", "cores": 2, "gpu": None, "torch": "2"}, "date": "d", "results": fair}
    args = {"threads": 2, "precision": "32-true", "steps": 2, "warmup": 1, "rloo_schedule": "1x1", "trl_lm_head": "x"}
    assert "not compared: kl_coef" in markdown(report | {"args": args, "ratios": [row]})


def bench_in_process(capsys, *args: str) -> tuple[int, str]:
    from rloo.bench.__main__ import main

    try:
        main(list(args))
        code = 0
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().err


def test_bench_rejects_an_unknown_preset_in_one_line(tmp_path, capsys):
    code, err = bench_in_process(capsys, "--presets", "gpt-9", "--out", str(tmp_path / "b"))
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--presets" in lines[0] and "pythia-160m" in lines[0]
    assert not (tmp_path / "b").exists()


def test_the_shape_flags_run_every_preset_at_every_shape_given(tmp_path, capsys):
    from rloo.bench.__main__ import parse_args
    from rloo.bench.presets import PRESETS, get_preset

    args = parse_args(["--presets", "small,long-160m", "--response-length", "32,512", "--k", "2,8", "--peers", "none"])
    names = args.presets.split(",")
    assert len(names) == 8 and "small@T=512+k=8" in names
    small = get_preset("small@T=512+k=8")
    assert (small.response_length, small.k, small.prompt_length) == (512, 8, PRESETS["small"].prompt_length)
    assert small.completions_per_step == PRESETS["small"].prompts_per_step * 8  # prompts per step stay
    assert get_preset("small@P=64").prompt_length == 64 and get_preset("small") is PRESETS["small"]
    assert PRESETS["long-160m"].response_length == 512
    for bad in (["--presets", "small@T=0"], ["--k", "two"], ["--presets", "small@depth=3"]):
        code, err = bench_in_process(capsys, *bad, "--out", str(tmp_path / "b"))
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1, err
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize(
    "mode, preset", [("speed", "tiny,small,pythia-160m"), ("decode", "long-160m"), ("stability", "pythia-160m")]
)
def test_each_mode_runs_its_own_default_preset(mode, preset):
    """`python -m rloo.bench decode` as documented times long-160m (it once timed the speed mode's `tiny`)."""
    from rloo.bench.__main__ import parse_args

    assert parse_args([mode]).presets == preset
    assert parse_args([mode, "--presets", "small"]).presets == "small"


def test_gpu_presets_need_cuda(tmp_path, capsys):
    code, err = bench_in_process(capsys, "--presets", "pythia-1b", "--out", str(tmp_path / "b"))
    assert code == 2 and "--device cuda" in err


def test_model_state_counts_each_tensor_once_and_adam_state():
    a = torch.nn.Linear(10, 10)  # 110 params
    b = torch.nn.Linear(10, 5).requires_grad_(False)  # 55 frozen params
    shared = torch.nn.Sequential(a, a)  # the same tensors twice
    optimizer = torch.optim.AdamW(a.parameters())
    a(torch.ones(1, 10)).sum().backward()
    optimizer.step()
    mib = 1024 * 1024
    state = model_state_mb([shared, a, b], optimizer)
    assert state["parameters"] == pytest.approx((110 + 55) * 4 / mib)
    assert state["gradients"] == pytest.approx(110 * 4 / mib)  # trainable only
    # AdamW: exp_avg and exp_avg_sq per parameter, plus a scalar step per tensor
    assert state["optimizer"] == pytest.approx((2 * 110 * 4 + 2 * 4) / mib)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral", "gemma2"])
def test_every_family_has_a_tiny_and_a_100m_preset_the_fast_paths_serve(family):
    """`<family>-tiny` and `<family>-100m` build that family's model (rloo/families/ names it), which the lean decode
    and the shared-prefix forward serve at the preset's rows, at about 1M and 100M parameters."""
    from transformers import AutoModelForCausalLM

    from rloo import families
    from rloo.bench.presets import model_config
    from rloo.generation.decode import why_not_lean_decode

    for size, (low, high) in {"tiny": (0.5e6, 2e6), "100m": (90e6, 130e6)}.items():
        preset = PRESETS[f"{family}-{size}"]
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(model_config(preset))
        assert families.family_of(model).name == family and model.config.num_key_value_heads < preset.num_heads
        assert low < sum(p.numel() for p in model.parameters()) < high
        assert why_not_lean_decode(model, preset.prompt_length + preset.response_length) is None


def test_presets_build_the_architecture_they_name():
    policy, reward_model = build_models(PRESETS["pythia-160m"])
    parameters = sum(p.numel() for p in policy.parameters())
    assert 160e6 < parameters < 170e6  # Pythia-160m: 162M with its untied 50304-token embeddings
    assert policy.config.rope_parameters["partial_rotary_factor"] == 0.25 and policy.config.use_parallel_residual
    from transformers import AutoModelForCausalLM

    from rloo.bench.presets import model_config

    with torch.device("meta"):
        llama = AutoModelForCausalLM.from_config(model_config(PRESETS["llama-1b"]))
    assert 1.23e9 < sum(p.numel() for p in llama.parameters()) < 1.24e9  # Llama-3.2-1B: 1.236B, tied
    assert llama.config.model_type == "llama" and llama.config.num_key_value_heads == 8
    tokenizer = build_tokenizer(512)
    prompts = random_prompts(PRESETS["small"], 3)
    text = tokenizer.batch_decode(prompts)
    assert torch.equal(torch.tensor(tokenizer(text, add_special_tokens=False).input_ids), prompts)
    assert (prompts >= 2).all()  # never PAD or EOS


def test_stability_reports_what_the_fp32_head_removes():
    from rloo.bench.stability import head_reductions

    def cell(precision, config, mean):
        return {"model": "m", "precision": precision, "config": config, "logprob_abs_mean": mean}

    cells = [
        cell("fp32", "peer-like", 1e-7),
        cell("fp32", "rloo default", 1e-7),
        cell("bf16", "peer-like", 8.4e-4),
        cell("bf16", "rloo default", 1.45e-4),
    ]
    assert head_reductions(cells) == {
        ("m", "bf16"): pytest.approx(8.4e-4 / 1.45e-4)
    }  # 5.8x; fp32 has no head to compare
    assert head_reductions(cells[:3]) == {}  # no default cell to compare with


@pytest.mark.slow
def test_the_published_schedule_runs_its_optimiser_steps_per_rollout(tmp_path):
    result = bench(
        "--presets",
        "tiny",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--ppo-epochs",
        "1",
        "--peers",
        "none",
        "--rloo-schedule",
        "2x2",
        "--out",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = json.loads((tmp_path / "results.json").read_text())
    ours = next(r for r in report["results"] if r["algorithm"] == "rloo")
    assert ours["rollouts"] == 3 and ours["optimizer_steps"] == 3 * 4  # 2 epochs x 2 mini-batches per rollout
    assert ours["settings"]["num_ppo_epochs"] == 2 and ours["settings"]["num_mini_batches"] == 2
    assert "| tiny | rloo RLOO (2x2) |" in (tmp_path / "results.md").read_text()


def test_the_peer_sums_its_optimiser_steps_into_rollouts():
    import argparse

    from rloo.bench.peers import per_rollout, schedule

    assert schedule(argparse.Namespace(algorithm="rloo", rloo_schedule="2x2", ppo_epochs=4)) == (2, 2)
    assert schedule(argparse.Namespace(algorithm="ppo", rloo_schedule="2x2", ppo_epochs=4)) == (4, 1)
    steps = [
        {"wall": 1.0, "rollout": 0.5, "tokens": 10},
        {"wall": 0.2, "rollout": None, "tokens": 0},
        {"wall": 2.0, "rollout": 1.5, "tokens": 7},
        {"wall": 0.3, "rollout": None, "tokens": 0},
    ]
    assert per_rollout(steps, 2) == [
        {"wall": 1.2, "tokens": 10, "rollout": 0.5},
        {"wall": 2.3, "tokens": 7, "rollout": 1.5},
    ]


def test_the_quality_table_renders_its_rows():
    """rloo.bench quality's markdown from the rows it builds out of two summaries."""
    from rloo.bench.quality import markdown, row

    evaluation = {"eval/win_rate": 0.7, "eval/win_rate_ci_low": 0.6, "eval/win_rate_ci_high": 0.8, "eval/score": 1.5}
    summary = {
        "rollouts": 3,
        "episodes": 24,
        "fit_seconds": 12.0,
        "initial": evaluation,
        "final": evaluation,
        "output_dir": "x",
    }
    table = markdown({"rows": [row("RLOO", summary), row("PPO", summary)]})
    assert "| RLOO | 3 | 24 | 12 | 0.700 | 0.700 [0.600, 0.800] | 1.50 |" in table and table.count("\n") == 4


@pytest.mark.slow
def test_the_gpu_check_runs_at_a_reduced_size_on_cpu(tmp_path, embedded_task):
    """`python -m rloo.bench gpu` at a reduced size on CPU: both model families through a real step in bf16, planned
    beside measured memory, and the embedded task's bf16 mismatch in both settings (on the shared test-size task)."""
    out = tmp_path / "gpu"
    command = [sys.executable, "-m", "rloo.bench", "gpu", "--steps", "1", "--warmup", "0", "--out", str(out)]
    env = {**os.environ, "RLOO_CACHE_DIR": str(embedded_task / "cache")}
    result = subprocess.run(
        [*command, "debug=fast"], cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "gpu.json").read_text())
    assert [row["model"] for row in report["models"]] == ["small", "llama-small"]
    assert {row["family"] for row in report["models"]} == {"gpt_neox", "llama"}
    for row in report["models"]:
        assert row["precision"] == "bf16-true" and row["decode_tokens_per_second"] > 0 and row["step_seconds"] > 0
        assert row["planned_peak_mib"] > 0 and row["measured_peak_mib"] > 0
    assert [row["model"] for row in report["decode"]] == ["small", "llama-small"]
    for row in report["decode"]:  # the decode alone: eager ms per token beside the read floor; no graph on CPU
        assert row["decode_ms_per_token"] > row["read_floor_ms"] > 0 and row["graph_ms_per_token"] is None
        assert row["graph_why_not"] == "the policy is on cpu; CUDA graphs need a GPU"
    for row in report["trl"]:  # TRL's step where this interpreter has TRL, else the row says so
        assert row.get("step_seconds", 0) > 0 or "no TRL" in row["error"]
    assert {cell["config"] for cell in report["mismatch"]} == {"peer-like", "rloo default"}
    assert all("error" not in cell and 0 <= cell["win_rate"] <= 1 for cell in report["mismatch"])
    table = (out / "gpu.md").read_text()
    assert "llama-small" in table and "| decode ms/token, eager | CUDA graph | read floor ms |" in table


def test_the_decode_bench_counts_the_bytes_a_step_reads():
    """Hand-counted for `tiny` (hidden 128, 4 layers, inner 512, vocabulary 512, untied head, float32): every weight
    but the input embedding, and the KV cache of 4 prompts of 24 tokens (once each) plus 16 rows' own completions,
    a step at completion position s reading s + 1 of them (mean 8 over a 16-token decode's 15 steps)."""
    from rloo.bench.decode import step_bytes

    policy, _ = build_models(PRESETS["tiny"])
    d, inner, vocab, layers = 128, 512, 512, 4
    block = (d * 3 * d + 3 * d) + (d * d + d) + (d * inner + inner) + (inner * d + d) + 2 * 2 * d
    weights = 4 * (layers * block + 2 * d + vocab * d)
    kv = 4 * layers * 2 * d * (4 * 24 + 16 * 8)
    assert step_bytes(policy, 4, 16, 24, 16) == {"weights": weights, "kv_cache": kv, "total": weights + kv}


def test_the_decode_bench_times_reads_and_profiles_the_decode():
    """In process at `tiny@T=8`: ms per token, a bandwidth fraction between its paired extremes, the profile's four
    parts adding up to the profiled step, and on CPU the graph loop said to be off, with why."""
    from rloo.bench.decode import markdown, measure

    result = measure("tiny@T=8", repeats=2)
    # ms per token is the difference of two medians (8 tokens less 1), so on a loaded machine a one-token decode that
    # stalled longer than the full one makes it, and any pair's bandwidth fraction, read below 0 (both seen with the
    # suite on two workers): no sign is asserted, only that they are numbers and the median lies between the pairs
    assert result["rows"] == 64 and result["new_tokens"] == 8 and math.isfinite(result["ms_per_token"])
    low, high = result["bandwidth_fraction_range"]
    assert low <= result["bandwidth_fraction"] <= high
    profile = result["profile"]
    assert sum(profile["parts_ms_per_step"].values()) == pytest.approx(profile["profiled_ms_per_step"])
    assert min(list(profile["parts_ms_per_step"].values())[:3]) > 0  # products, attention and sampling all seen
    assert result["graph"] == {"used": False, "why_not": "the policy is on cpu; CUDA graphs need a GPU"}
    assert "| linear products |" in markdown(result)


def test_the_decode_bench_counts_bfloat16_copies_at_two_bytes():
    """rollout_precision=bf16 reads every linear layer's weight matrix (the untied head's too) at 2 bytes, the
    norms and biases as they are: hand-counted for `tiny` as in the float32 count above."""
    from rloo.bench.decode import step_bytes

    policy, _ = build_models(PRESETS["tiny"])
    d, inner, vocab, layers = 128, 512, 512, 4
    matrices = layers * (d * 3 * d + d * d + d * inner + inner * d) + vocab * d
    others = layers * (3 * d + d + inner + d + 2 * 2 * d) + 2 * d
    kv = 4 * layers * 2 * d * (4 * 24 + 16 * 8)
    counted = step_bytes(policy, 4, 16, 24, 16, bf16_weights=True)
    assert counted == {"weights": 2 * matrices + 4 * others, "kv_cache": kv, "total": 2 * matrices + 4 * others + kv}


def test_the_rollout_precision_reaches_every_rloo_worker_and_no_other_mode(tmp_path, capsys):
    from rloo.bench.__main__ import configurations, parse_args

    args = parse_args(["--presets", "tiny", "--grpo", "grpo", "--rollout-precision", "bf16", "--peers", "none"])
    runs = configurations(args)
    assert {run["algorithm"] for run in runs} == {"rloo", "grpo", "ppo"}
    for run in runs:  # every one of ours: the key as the worker's --set
        at = run["command"].index("rollout_precision=bf16")
        assert run["command"][at - 1] == "--set"
    for argv in (["stability", "--rollout-precision", "bf16"], ["decode", "kl_coef=0.1"]):
        code, err = bench_in_process(capsys, *argv, "--out", str(tmp_path / "b"))
        assert code == 2 and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("algorithm", ["rloo", "ppo"])
def test_the_worker_stores_the_frozen_models_as_a_run_does(algorithm):
    """`--set model.frozen_dtype=bfloat16` stores the reference and the reward model in bfloat16, as rloo.train loads
    them; the policy (and PPO's value model, initialised from the reward model) train in float32."""
    from rloo.bench.worker import build_module, parse_args

    preset = PRESETS["tiny"]
    argv = ["--algorithm", algorithm, "--preset", "tiny", "--out", "x", "--set", "model.frozen_dtype=bfloat16"]
    policy, reward_model = build_models(preset)
    module, _ = build_module(parse_args(argv), preset, build_tokenizer(preset.vocab_size), policy, reward_model)
    assert next(module.reward_model.parameters()).dtype == torch.bfloat16
    assert next(module.reference.parameters()).dtype == torch.bfloat16
    assert next(module.policy.parameters()).dtype == torch.float32
    if algorithm == "ppo":
        value = next(module.value_model.parameters())
        assert value.dtype == torch.float32 and value.requires_grad


@pytest.mark.slow
def test_a_worker_prints_nothing_our_calls_cause(tmp_path):
    """`python -m rloo.bench.worker` (the command the floor analysis in docs/benchmarks.md runs) keeps the console as
    rloo.train does: no Lightning notice or advert, no third-party warning from our calls."""
    command = [sys.executable, "-m", "rloo.bench.worker", "--algorithm", "rloo", "--preset", "tiny"]
    command += ["--steps", "1", "--warmup", "0", "--threads", "2", "--out", str(tmp_path / "result.json")]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "result.json").read_text())["steps"] == 1
    assert result.stdout + result.stderr == ""
