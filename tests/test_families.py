"""Model families (rloo/families/): each family's record against its own tiny model (every fast path serves it,
LoRA's `auto` names its projections, the plan reads its layout), runs on every family with each fast path saying
what ran, a run on a tiny random Llama with LoRA, and LoRA targets checked before loading."""

import json

import pytest
import torch

from rloo.utils.errors import ConfigError
from tests.e2e import one_rollout
from tests.tiny_models import FAMILIES, GATED_FAMILIES, tiny_model


def onednn_reorders() -> bool:
    """Whether this torch reorders float32 weights for oneDNN (rloo.generation.decode.onednn_applies): the log says
    which."""
    from rloo.generation.decode import onednn_applies

    return onednn_applies(torch.empty(0))


REORDERED = "float32 linear layers through oneDNN, from weights reordered once per rollout"


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_record_serves_its_own_model_on_every_fast_path(family):
    """The record's claims checked against a built model: every fast path serves it, LoRA's auto targets are
    exactly its linear layers but the head, and its MLPs have the form it names."""
    from rloo.families import family_of
    from rloo.generation.decode import why_not_lean_decode
    from rloo.generation.forward import why_not_shared_prefix
    from rloo.models.lora import resolve_targets
    from rloo.models.mlp_recompute import why_not_recompute_mlp

    model = tiny_model(family)
    record = family_of(model)
    assert record.name == family and isinstance(model, record.causal_lm)
    assert why_not_lean_decode(model, 64) is None and why_not_shared_prefix(model, 64) is None
    assert why_not_recompute_mlp(model) is None
    assert why_not_shared_prefix(tiny_model(family, reward=True), 64) is None  # a reward model of the family too
    linear = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(resolve_targets("auto", model.config)) == linear - {"lm_head"} == set(record.projections)
    mlp = model.base_model.layers[0].mlp
    assert all(hasattr(mlp, name) for name in record.mlp.names)


def test_a_model_of_no_family_trains_on_hf_generate_and_the_plain_forward_and_says_why(
    tokenizer, tmp_path, tiny_run_assets
):
    """GPT-2 is in no family: a run samples with HF generate, runs the plain forward, keeps its activations, plans
    it with a warning, and says why each fast path did not serve it."""
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    from rloo.models.lora import ALL_LINEAR, resolve_targets

    sizes = dict(n_layer=2, n_embd=32, n_head=4, n_positions=128, vocab_size=len(tokenizer))
    ids = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    root = tmp_path / "assets"
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**sizes, **ids)).save_pretrained(root / "policy")
    tokenizer.save_pretrained(root / "policy")
    GPT2ForSequenceClassification(GPT2Config(**sizes, **ids, num_labels=1)).save_pretrained(root / "reward_model")
    with_answer_column(tiny_run_assets, root)
    summary = one_rollout(root, tmp_path / "run")
    assert summary["status"] == "finished" and summary["rollouts"] == 1
    paths = summary["fast_paths"]
    assert paths["sampler"]["ran"] == "hf_generate" and paths["policy_forward"]["ran"] == "plain"
    assert paths["reward_forward"]["ran"] == "plain" and paths["policy_activations"]["ran"] == "kept"
    for path in ("sampler", "policy_forward", "reward_forward", "policy_activations"):
        assert "model_type gpt2 is none of the families in rloo/families/ (gpt_neox, llama" in paths[path]["why"]
    assert summary["memory"]["warnings"][0].startswith("warning: model_type 'gpt2' is not one this plan knows")
    assert resolve_targets("auto", GPT2Config()) == ALL_LINEAR


def with_answer_column(source, root) -> None:
    """The toy splits of `source` into `root`, each row with an `answer` column that says which row it is."""
    for split in ("train", "validation"):
        rows = [json.loads(line) for line in (source / f"{split}.jsonl").read_text().splitlines()]
        lines = [json.dumps({**row, "answer": f"#{i}"}) for i, row in enumerate(rows)]
        (root / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def llama_assets(tmp_path_factory, tokenizer, tiny_run_assets):
    """A tiny random Llama policy and reward model beside the toy splits (with an answer column)."""
    root = tmp_path_factory.mktemp("llama")
    tiny_model("llama", tokenizer).save_pretrained(root / "policy")
    tokenizer.save_pretrained(root / "policy")
    tiny_model("llama", tokenizer, reward=True, seed=1).save_pretrained(root / "reward_model")
    with_answer_column(tiny_run_assets, root)
    return root


def test_a_gpt_neox_run_takes_both_fast_paths_and_says_so(tiny_run_assets, tmp_path):
    summary = one_rollout(tiny_run_assets, tmp_path / "run")
    paths = summary["fast_paths"]
    assert paths["sampler"]["ran"] == "lean_decode"
    assert (REORDERED in paths["sampler"]["why"]) is onednn_reorders()
    assert paths["policy_forward"]["ran"] == paths["reward_forward"]["ran"] == "shared_prefix"
    assert paths["policy_activations"]["ran"] == "mlp_recompute"
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["fast_paths"] == paths


def test_a_llama_policy_trains_with_lora_and_a_reward_function_reading_a_column(llama_assets, tmp_path):
    """The own-model template filled in: a tiny random Llama, LoRA on its own projections, no reward model, a
    correctness-style reward reading the data's `answer` column; the run says what sampled and what ran forward."""
    from transformers import AutoModelForCausalLM

    from tests import reward_functions

    reward_functions.CALLS.clear()
    summary = one_rollout(
        llama_assets,
        tmp_path / "run",
        "experiment=own_model",
        "model.reward_model=null",
        "reward=tests.reward_functions:answer_matches",
        "model.lora=true",
        "lora.r=4",
        "k=2",
    )
    assert summary["status"] == "finished" and summary["optimizer_steps"] == 1
    rows = [json.loads(line) for line in (llama_assets / "train.jsonl").read_text().splitlines()]
    answer_of = {row["prompt"]: row["answer"] for row in rows}
    (call,) = reward_functions.CALLS
    assert call["answer"] == [answer_of[p] for p in call["prompts"]] and len(call["answer"]) == 8
    paths = summary["fast_paths"]
    assert paths["policy_forward"]["ran"] == "shared_prefix" and "reward_forward" not in paths
    assert paths["policy_activations"]["ran"] == "mlp_recompute"  # through LoRA's wrapped layers too
    # the lean decode serves Llama, but not through LoRA's wrapped layers: it says so
    assert paths["sampler"]["ran"] == "hf_generate" and "LoRA" in paths["sampler"]["why"]
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "policy")  # merged: loads without peft
    assert exported.config.model_type == "llama"


@pytest.mark.parametrize("family", GATED_FAMILIES)
def test_a_llama_family_run_takes_both_fast_paths_and_plans_its_memory(family, tokenizer, tmp_path, tiny_run_assets):
    root = tmp_path / "assets"
    root.mkdir()
    tiny_model(family, tokenizer).save_pretrained(root / "policy")
    tokenizer.save_pretrained(root / "policy")
    tiny_model(family, tokenizer, reward=True, seed=1).save_pretrained(root / "reward_model")
    with_answer_column(tiny_run_assets, root)
    summary = one_rollout(root, tmp_path / "run")
    paths = summary["fast_paths"]
    assert paths["sampler"]["ran"] == "lean_decode"
    assert paths["policy_forward"]["ran"] == paths["reward_forward"]["ran"] == "shared_prefix"
    assert (
        paths["policy_activations"]["ran"] == "mlp_recompute" and "act(gate) * up" in paths["policy_activations"]["why"]
    )
    memory = summary["memory"]
    assert (
        memory["planned_peak_mb"] > 0
        and memory["warnings"] == []
        and memory["measured_peak_mb"] >= 0
        and memory["measured_as"] == "peak RSS above baseline"
    )


def test_lora_on_a_gpt_neox_policy_samples_with_hf_generate_and_says_why(tiny_run_assets, tmp_path):
    paths = one_rollout(tiny_run_assets, tmp_path / "run", "model.lora=true", "lora.r=4")["fast_paths"]
    assert paths["sampler"]["ran"] == "hf_generate" and "LoRA" in paths["sampler"]["why"]


def test_lora_targets_that_name_no_layer_are_one_line_before_any_weight_loads(llama_assets, tmp_path):
    with pytest.raises(ConfigError) as caught:
        one_rollout(llama_assets, tmp_path / "run", "model.lora=true", "lora.target_modules=[query_key_value]")
    message = str(caught.value)
    assert "lora.target_modules: query_key_value name no layer of this llama policy" in message
    assert "q_proj" in message and "\n" not in message
    assert not (tmp_path / "run" / "policy").exists()


# ---- your own data: reward functions read the dataset row's other columns ------------------------------------
@pytest.fixture
def answer_assets(tmp_path, tiny_run_assets):
    """The toy splits with an `answer` column that says which prompt each row is (its index)."""
    root = tmp_path / "assets"
    root.mkdir()
    for name in ("policy", "reward_model"):
        (root / name).symlink_to(tiny_run_assets / name)
    with_answer_column(tiny_run_assets, root)
    return root


def test_a_reward_function_gets_each_completions_own_row_columns_by_name(answer_assets, tmp_path):
    from tests import reward_functions

    reward_functions.CALLS.clear()
    summary = one_rollout(answer_assets, tmp_path / "run", "reward=tests.reward_functions:answer_matches", "k=2")
    assert summary["status"] == "finished" and len(reward_functions.CALLS) == 1
    call = reward_functions.CALLS[0]
    rows = [json.loads(line) for line in (answer_assets / "train.jsonl").read_text().splitlines()]
    answer_of = {row["prompt"]: row["answer"] for row in rows}
    assert len(call["answer"]) == len(call["prompts"]) == 8  # 4 prompts x k=2
    assert call["answer"] == [answer_of[p] for p in call["prompts"]]  # each completion with its own prompt's row
    assert call["answer"][0::2] == call["answer"][1::2]  # a prompt's k completions share its row


def test_held_out_evaluation_scores_the_reward_functions_and_a_sweeper_ranks_by_them(answer_assets, tmp_path):
    from rloo.train import objective

    summary = one_rollout(
        answer_assets, tmp_path / "run", "reward=tests.reward_functions:length", "eval.after=true", "eval.num_prompts=6"
    )
    final = summary["final"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "eval_samples.jsonl").read_text().splitlines()]
    lengths = [float(len(row["completion"].split())) for row in rows]  # what tests.reward_functions:length gives
    assert len(rows) == 6 and final["eval/reward/length"] == pytest.approx(sum(lengths) / 6)
    assert final["eval/reward/length_ci_low"] <= final["eval/reward/length"] <= final["eval/reward/length_ci_high"]
    assert objective(summary) == final["eval/reward/length"]  # judge=none: the reward function, not the RM score
    from rloo.train import print_summary

    lines = []
    print_summary(summary, lines.append)  # the console's last lines show it, with its interval
    mean, low, high = (final[f"eval/reward/length{end}"] for end in ("", "_ci_low", "_ci_high"))
    assert f"eval/reward/length - -> {mean:.3f} [{low:.3f}, {high:.3f}]" in [" ".join(line.split()) for line in lines]


def test_a_column_a_reward_function_needs_and_the_data_lacks_is_one_line_before_loading(answer_assets, tmp_path):
    with pytest.raises(ConfigError) as caught:
        one_rollout(answer_assets, tmp_path / "run", "reward=tests.reward_functions:needs_a_missing_column")
    message = str(caught.value)
    assert "reward: tests.reward_functions:needs_a_missing_column asks for solution" in message
    assert "answer" in message and not (tmp_path / "run" / "policy").exists()


OFF = "linear layers through F.linear (oneDNN's reordered weights serve float32 on CPU only; this run is "


@pytest.mark.parametrize(
    "overrides, product",
    [
        ((), REORDERED),
        (("precision=bf16",), OFF + "bf16-mixed on cpu)"),
        (("precision=bf16-true",), OFF + "bf16-true on cpu)"),
        (("trainer=gpu",), OFF + "32-true on gpu)"),
    ],
)
def test_the_sampler_names_its_linear_product(policy, overrides, product):
    """The lean decode's reordered-weight product serves float32 on CPU only; elsewhere the run says it is off."""
    from rloo.generation.fast_paths import fast_paths
    from rloo.run.cli import compose_train_config

    if product == REORDERED and not onednn_reorders():
        product = OFF + "32-true on cpu)"  # this torch has no oneDNN weight reorder: the log says F.linear
    sampler = fast_paths(compose_train_config(list(overrides)), policy, None)["sampler"]
    assert sampler[0] == "lean_decode" and sampler[1].endswith(product)
    on_gpu = overrides == ("trainer=gpu",)
    steps = "static-shape steps replayed as CUDA graphs" if on_gpu else "eager steps (CUDA graphs"
    assert steps in sampler[1].replace(" that drop finished rows", "")


def test_the_sampler_says_when_cuda_graphs_are_switched_off(policy):
    from rloo.generation.fast_paths import fast_paths
    from rloo.run.cli import compose_train_config

    sampler = fast_paths(compose_train_config(["trainer=gpu", "cuda_graph=false"]), policy, None)["sampler"]
    assert "eager steps that drop finished rows (cuda_graph=false)" in sampler[1]
