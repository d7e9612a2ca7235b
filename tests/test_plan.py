"""python -m rloo.plan: parameter counts against the real models, the estimate against measured CPU peaks, the CLI."""

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from rloo.bench.presets import PRESETS, build_models, model_config
from rloo.families import architecture_from_config
from rloo.run.memory_plan import Architecture, Shape, estimate
from tests.e2e import HANG_GUARD_S, ROOT
from tests.tiny_models import GATED_FAMILIES

ADAPTED = ("query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h")


def architecture(preset) -> Architecture:
    """The preset's layout as its family (rloo/families/) reads it from the preset's config."""
    return architecture_from_config(model_config(preset).to_dict())


def bench_shape(preset, lora: bool = False) -> Shape:
    """The settings rloo.bench.worker runs a preset at: fp32, the whole step's completions in one micro-batch."""
    n = preset.completions_per_step
    return Shape(
        "32-true",
        "float32",
        "auto",
        1,
        lora,
        16,
        ADAPTED,
        not lora,
        True,
        preset.k,
        n,
        n,
        preset.prompt_length,
        preset.response_length,
        shared_prefix=True,
    )


def test_parameter_counts_are_the_models_own():
    preset = PRESETS["small"]
    policy, reward_model = build_models(preset)
    arch = architecture(preset)
    linear, rest = arch.body_params()
    assert sum(p.numel() for p in policy.parameters()) == linear + rest + arch.head_params()
    assert sum(p.numel() for p in reward_model.parameters()) == linear + rest + arch.hidden_size  # score head, no bias
    mib = estimate(arch, bench_shape(preset))
    assert mib["policy weights"] * 2**20 == 4 * (linear + rest + arch.head_params())
    assert mib["AdamW state"] == 2 * mib["gradients"] == 2 * mib["policy weights"]


def full_model_shape(**changes) -> dict:
    """Shape's fields for a bf16 run of the whole model (no LoRA) with a reference and a reward model, `changes` on
    top (strategy and world_size left to the caller)."""
    return (
        dict(
            precision="bf16-mixed",
            frozen_dtype="bfloat16",
            lora=False,
            lora_r=16,
            lora_targets=ADAPTED,
            separate_reference=True,
            has_reward_model=True,
            k=2,
            micro_batch_size=16,
            generation_batch_size=16,
            prompt_length=512,
            response_length=53,
            shared_prefix=True,
        )
        | changes
    )


def test_sharding_divides_what_each_strategy_shards():
    arch = architecture(PRESETS["pythia-160m"])
    base = full_model_shape()
    single = estimate(arch, Shape(strategy="auto", world_size=1, **base))
    ddp = estimate(arch, Shape(strategy="ddp", world_size=8, **base))
    zero2 = estimate(arch, Shape(strategy="deepspeed_stage_2", world_size=8, **base))
    zero3 = estimate(arch, Shape(strategy="deepspeed_stage_3", world_size=8, **base))
    assert ddp == single
    assert zero2["policy weights"] == single["policy weights"] and zero2["AdamW state"] == single["AdamW state"] / 8
    assert zero3["policy weights"] == single["policy weights"] / 8 and zero3["gradients"] == single["gradients"] / 8
    # ZeRO-3 partitions the whole LightningModule: the frozen models too; the others hold them whole
    assert zero3["reference weights"] == single["reference weights"] / 8 == zero2["reference weights"] / 8
    assert zero3["reward model weights"] == single["reward model weights"] / 8
    # and it gathers: the largest module (here the 50304 x 768 embedding), DeepSpeed's 5e7-element prefetch and
    # Lightning's 2e8-element reduce bucket, in bf16
    assert zero3["ZeRO-3 buffers"] * 2**20 == (50304 * 768 + 50_000_000 + 200_000_000) * 2
    assert "ZeRO-3 buffers" not in single and "ZeRO-3 buffers" not in zero2


@pytest.mark.parametrize("strategy", ["fsdp2", "deepspeed_stage_3"])
def test_a_partitioned_policy_is_counted_whole_once_more_while_the_rollout_samples_from_it(strategy):
    """rloo.models.sharding.whole_weights: the lean decode samples from the policy's weights gathered whole on each
    rank, so the rollout phase holds them beside this rank's part; HF generate gathers block by block instead."""
    arch = architecture(PRESETS["pythia-160m"])
    linear, rest = arch.body_params()
    shape = Shape(strategy=strategy, world_size=8, **full_model_shape())  # bf16-mixed: float32 weights
    gathered = estimate(arch, shape)
    assert gathered["gathered policy"] * 2**20 == (linear + rest + arch.head_params()) * 4
    stepping = estimate(arch, replace(shape, sampler="hf_generate"))
    assert "gathered policy" not in stepping
    assert "gathered policy" not in estimate(arch, Shape(strategy="ddp", world_size=8, **full_model_shape()))
    rollout = gathered["KV cache"] + gathered.get("decode weights", 0) + gathered["gathered policy"]
    update = gathered["gradients"] + gathered["activations"] + gathered["logit chunks"]
    assert gathered["peak"] - stepping["peak"] == pytest.approx(
        max(rollout, update) - max(stepping["KV cache"], update), abs=1e-6
    )


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_the_estimate_is_within_25_percent_of_the_measured_peak_at_pythia_160m(lora, tmp_path):
    if lora:
        pytest.importorskip("peft")
    preset = PRESETS["pythia-160m"]
    out = tmp_path / "result.json"
    command = [
        sys.executable,
        "-m",
        "rloo.bench.worker",
        "--algorithm",
        "rloo",
        "--preset",
        preset.name,
        "--steps",
        "1",
        "--warmup",
        "0",
        "--threads",
        "2",
        "--set",
        f"model.lora={str(lora).lower()}",
        "--out",
        str(out),
    ]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr[-2000:]
    measured = json.loads(out.read_text())["peak_rss_above_baseline_mb"]
    planned = estimate(architecture(preset), bench_shape(preset, lora))["peak"]
    assert 0.75 <= planned / measured <= 1.25, (planned, measured)


class Answer:
    """What `python -m rloo.plan ARGS` answers: exit status, stdout, stderr (run in-process)."""

    def __init__(self, capsys, *args: str):
        from rloo.plan import main

        try:
            self.returncode = main(list(args))
        except SystemExit as exit:  # argparse's one-line error
            self.returncode = exit.code
        self.stdout, self.stderr = capsys.readouterr()


def test_the_cli_plans_the_published_recipe_without_loading_anything(capsys):
    fits = Answer(capsys, "model=pythia6.9b", "precision=bf16", "--gpu-gib", "80")
    assert fits.returncode == 0, fits.stderr
    assert "hidden 4096, 32 layers" in fits.stdout and "deepspeed_stage_3 x 8" in fits.stdout
    assert "fits in 80 GiB" in fits.stdout and "does not fit" not in fits.stdout
    assert "does not fit in 16 GiB" in Answer(capsys, "model=pythia6.9b", "precision=bf16", "--gpu-gib", "16").stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["model.policy=some-org/unknown-model"], "not a known Pythia size"),
        (["k=1"], "k=1"),
        (["--gpu-gib", "lots"], "--gpu-gib: invalid float value"),
    ],
)
def test_bad_input_is_one_line(args, message, capsys):
    result = Answer(capsys, *args)
    lines = [line for line in result.stderr.splitlines() if line.strip() and not line.startswith("rloo: model=")]
    assert result.returncode == 2 and message in result.stderr and len(lines) == 1, result.stderr


@pytest.mark.parametrize("family", GATED_FAMILIES)
def test_llama_family_counts_and_cache_are_the_models_own(family, tokenizer):
    """Parameters (separate q/k/v, Qwen2's q/k/v biases, Qwen3's per-head q/k norms, Gemma 2's four norms a block,
    SwiGLU, RMSNorm, tied or untied head) and the decode's cache width (grouped-query attention: 2 key/value heads
    of 4) against a built model."""
    from tests.tiny_models import tiny_model

    model = tiny_model(family, tokenizer)
    arch = architecture_from_config(model.config.to_dict())
    linear, rest = arch.body_params()
    assert arch.tied_head == model.config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) == linear + rest + arch.head_params()
    attention = model.model.layers[0].self_attn
    assert arch.kv_width == attention.k_proj.out_features + attention.v_proj.out_features
    assert arch.kv_width < 2 * model.config.hidden_size  # fewer key/value heads than heads
    names = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(arch.linear_shapes) == names - {"lm_head"}


OWN_MODEL = ("experiment=arithmetic_smollm2", "model.tokenizer=null")  # no bootstrap, a reward function


def write_config(tmp_path, model) -> str:
    model.config.save_pretrained(tmp_path)
    return str(tmp_path)


def test_the_plan_says_which_sampler_and_forward_run(tmp_path, tokenizer, capsys):
    from tests.tiny_models import tiny_model

    policy = write_config(tmp_path, tiny_model("llama", tokenizer))
    plain = Answer(capsys, f"model.policy={policy}", *OWN_MODEL)
    assert plain.returncode == 0, plain.stderr
    assert "llama, hidden" in plain.stdout and "2 key/value heads of 4" in plain.stdout and "tied head" in plain.stdout
    assert "sampler: lean_decode" in plain.stdout and "policy forward: shared_prefix" in plain.stdout
    lora = Answer(capsys, f"model.policy={policy}", *OWN_MODEL, "model.lora=true")
    assert "sampler: hf_generate" in lora.stdout and "LoRA adapters" in lora.stdout
    assert "q_proj" in lora.stdout  # LoRA's targets are the family's own names
    off = Answer(capsys, f"model.policy={policy}", *OWN_MODEL, "shared_prefix=false")
    assert "policy forward: plain (shared_prefix=false)" in off.stdout


def test_an_unknown_model_type_is_planned_with_a_warning(tmp_path, capsys):
    from transformers import Phi3Config

    config = Phi3Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    config.num_attention_heads, config.num_key_value_heads = 4, 2
    config.save_pretrained(tmp_path)
    answer = Answer(capsys, f"model.policy={tmp_path}", *OWN_MODEL)
    assert answer.returncode == 0, answer.stderr
    assert "warning: model_type 'phi3' is not one this plan knows" in answer.stdout
    assert "sampler: hf_generate" in answer.stdout and "policy forward: plain" in answer.stdout


def test_the_rollout_counts_the_decodes_reordered_weights_where_the_run_reorders():
    """A float32 run on CPU samples from a reordered copy of every linear weight and the head
    (rloo.generation.decode._linear);
    the rollout's memory is that copy plus the KV cache, and the plan reads whether it is made from the config."""
    from rloo.run.cli import compose_train_config
    from rloo.run.memory_plan import shape_from_config

    preset = PRESETS["pythia-160m"]
    arch = architecture(preset)
    shape = bench_shape(preset)
    plain, copied = estimate(arch, shape), estimate(arch, replace(shape, decode_weight_copy=4))
    linear, _ = arch.body_params()
    assert "decode weights" not in plain
    assert copied["decode weights"] * 2**20 == 4 * (linear + arch.vocab_size * arch.hidden_size)
    update = copied["gradients"] + copied["activations"] + copied["logit chunks"]
    rollout = copied["KV cache"] + copied["decode weights"]
    assert copied["peak"] - plain["peak"] == pytest.approx(max(update, rollout) - max(update, copied["KV cache"]))
    assert shape_from_config(compose_train_config([]), arch).decode_weight_copy == 4
    assert shape_from_config(compose_train_config(["rollout_precision=bf16"]), arch).decode_weight_copy == 2
    halved = estimate(arch, replace(shape, decode_weight_copy=2))["decode weights"]
    assert halved == copied["decode weights"] / 2  # the bfloat16 copies of rollout_precision=bf16
    assert not shape_from_config(compose_train_config(["precision=bf16"]), arch).decode_weight_copy
    assert not shape_from_config(compose_train_config(["lean_decode=false"]), arch).decode_weight_copy


def test_the_rollout_counts_the_cuda_graph_pool_where_the_decode_replays_graphs():
    """On a GPU the decode's static-shape step keeps one step's buffers in the graphs' pool between replays: the
    logits `[B, V]`, a block's widest values and the float32 scores over prompt + response, per row (hand-counted
    here for Pythia-160m at bf16-true: B = 16, P = 32, T = 16, 12 heads)."""
    from rloo.run.cli import compose_train_config
    from rloo.run.memory_plan import shape_from_config

    preset = PRESETS["pythia-160m"]
    arch = architecture(preset)
    shape = replace(bench_shape(preset), precision="bf16-true", decode_graph=True)
    pool = estimate(arch, shape)["decode graph pool"] * 2**20
    rows, per_row_values = shape.generation_batch_size, 50304 + 8 * 768 + 2 * 3072 + 2 * 768
    assert rows == 16 and pool == rows * (per_row_values * 2 + 3 * 12 * (32 + 16) * 4)
    assert "decode graph pool" not in estimate(arch, replace(shape, decode_graph=False))
    assert shape_from_config(compose_train_config(["trainer=gpu"]), arch).decode_graph
    assert not shape_from_config(compose_train_config(["trainer=gpu", "cuda_graph=false"]), arch).decode_graph
    assert not shape_from_config(compose_train_config([]), arch).decode_graph  # CPU: eager steps


def test_without_gpu_gib_the_plan_is_held_against_the_device_it_assumes(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    gpu = Answer(capsys, "model=pythia6.9b", "precision=bf16")
    assert gpu.returncode == 0 and "fits in 80 GiB per device (no GPU here: assumed the recipes' 80 GB" in gpu.stdout
    cpu = Answer(capsys).stdout.splitlines()[-1]  # the embedded task on CPU: this machine's memory
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    assert cpu.startswith(f"  fits in {total:.3g} GiB per device (trainer=cpu: this machine's memory")


def test_the_plan_counts_what_episodes_add(tmp_path, tokenizer, capsys):
    """env=: every sequence is the whole episode (the turns and the environment's replies), in the activations and
    the KV cache, said on its own line; the sampler is the episode's own cache."""
    from rloo.run.cli import compose_train_config
    from rloo.run.memory_plan import plan_config
    from tests.tiny_models import tiny_model

    policy = write_config(tmp_path, tiny_model("llama", tokenizer))
    own = ("experiment=calculator_smollm2", "model.tokenizer=null", f"model.policy={policy}")
    episodes = Answer(capsys, *own)
    assert episodes.returncode == 0, episodes.stderr
    assert "episodes: env=calculator: up to 3 turns and 160 tokens after the prompt" in episodes.stdout
    assert "sampler: lean_decode" in episodes.stdout
    _, shape, mib, _ = plan_config(compose_train_config([*own, "judge=none"]))
    _, single, single_mib, _ = plan_config(compose_train_config([*own, "judge=none", "env=none", "reward=model"]))
    assert (shape.response_length, single.response_length) == (160, 40)
    # a packed group row is [prompt | k sequences]: P = data.max_prompt_length, k = 4, T = 160 against 40
    prompt = shape.prompt_length
    assert prompt == compose_train_config(list(own)).data.max_prompt_length == 192
    assert mib["activations"] / single_mib["activations"] == pytest.approx((prompt + 4 * 160) / (prompt + 4 * 40))
    assert mib["KV cache"] / single_mib["KV cache"] == pytest.approx((prompt + 160) / (prompt + 40))
