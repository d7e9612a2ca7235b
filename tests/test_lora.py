"""LoRA with the base as the reference (rloo/models/lora.py): against the model before adapters, plain transformers
loading, and a real `python -m rloo.train model.lora=true` run."""

import copy
import csv

import pytest
import torch
from transformers import AutoModelForCausalLM

pytest.importorskip("peft")

from rloo.generation.decode import supports_lean_decode  # noqa: E402
from rloo.generation.forward import completion_logprobs  # noqa: E402
from rloo.models.lora import adapters_disabled, add_adapters, has_adapters, merged_copy  # noqa: E402
from tests.e2e import train  # noqa: E402
from tests.test_rollout import grouped_batch  # noqa: E402

TARGETS = ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]


def logprobs_of(model, batch):
    input_ids, attention_mask, completion, completion_mask = batch
    with torch.no_grad():
        return completion_logprobs(model, input_ids, attention_mask, completion, completion_mask, 0.7, group_size=3)


def trained_adapters(policy):
    """The policy with adapters whose B matrices are no longer zero, as after some training."""
    add_adapters(policy, r=4, alpha=8, dropout=0.0, target_modules=TARGETS)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return policy


@pytest.mark.slow
def test_adapters_start_as_the_base_and_only_they_train(policy, tokenizer):
    batch = grouped_batch(tokenizer)
    before = logprobs_of(policy, batch)
    add_adapters(policy, r=4, alpha=8, dropout=0.0, target_modules=TARGETS)
    assert has_adapters(policy)
    assert torch.equal(logprobs_of(policy, batch), before)  # B = 0 at initialisation
    trainable = {name for name, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    assert not supports_lean_decode(policy, 16)  # the lean decode reads raw weights: it would drop the adapters


def test_the_reference_is_the_base_exactly_and_the_adapters_stay_trainable(policy, tokenizer):
    batch = grouped_batch(tokenizer)
    base = copy.deepcopy(policy)
    trained_adapters(policy)
    adapted = logprobs_of(policy, batch)
    assert not torch.allclose(adapted, logprobs_of(base, batch), atol=1e-3)
    with adapters_disabled(policy) as reference:
        assert torch.equal(logprobs_of(reference, batch), logprobs_of(base, batch))
    assert torch.equal(logprobs_of(policy, batch), adapted)  # on again
    assert {name for name, p in policy.named_parameters() if p.requires_grad} == {
        name for name, _ in policy.named_parameters() if "lora_" in name
    }


def test_merged_copy_saves_a_plain_model_that_computes_the_adapted_policy(policy, tokenizer, tmp_path):
    batch = grouped_batch(tokenizer)
    trained_adapters(policy)
    adapted = logprobs_of(policy, batch)
    merged = merged_copy(policy)
    assert has_adapters(policy) and not has_adapters(merged)
    merged.save_pretrained(tmp_path / "merged")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert not any("lora_" in name or "base_layer" in name for name in loaded.state_dict())
    assert torch.allclose(logprobs_of(loaded, batch), adapted, atol=1e-5)


@pytest.fixture(scope="module")
def lora_run(finished_run):
    base, _ = finished_run
    run = base / "lora"
    result = train(run, base / "cache", "model.lora=true", "lora.r=4", "lr=1e-3", "eval_every=0")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return run, base / "cache"


@pytest.mark.slow
def test_a_lora_run_trains_the_adapters_against_the_base(lora_run):
    run, _ = lora_run
    rows = list(csv.DictReader((run / "csv" / "metrics.csv").open()))
    kl = [float(r["objective/kl"]) for r in rows if r.get("objective/kl") not in ("", None)]
    assert kl[0] == 0.0 and any(value != 0.0 for value in kl[1:])  # the reference is the initial policy, then drifts
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    policy_keys = [key for key in checkpoint["state_dict"] if key.startswith("policy.")]
    assert policy_keys and all("lora_" in key for key in policy_keys)  # adapters only: the base is what runs load


@pytest.mark.slow
def test_the_exported_lora_policy_loads_without_peft_and_differs_from_the_initial_one(lora_run):
    run, cache = lora_run
    exported = AutoModelForCausalLM.from_pretrained(run / "policy")
    names = list(exported.state_dict())
    assert not any("lora_" in name or "base_layer" in name for name in names)
    initial = AutoModelForCausalLM.from_pretrained(next(cache.glob("**/policy/config.json")).parent)
    changed = [name for name, w in exported.state_dict().items() if not torch.equal(w, initial.state_dict()[name])]
    adapted = {"query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"}
    assert changed and all(name.split(".")[-2] in adapted for name in changed)  # embeddings, norms, head untouched
