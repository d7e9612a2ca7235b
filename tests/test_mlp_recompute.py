"""rloo.models.mlp_recompute: the policy's MLPs keep only their up-projections for the backward, with the same
gradients."""

import copy
import gc
import weakref

import pytest
import torch
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXMLP

from rloo.bench.presets import PRESETS
from rloo.models.mlp_recompute import recompute_mlp_activations, why_not_recompute_mlp
from rloo.run.memory_plan import Shape, estimate
from tests.test_plan import architecture, full_model_shape
from tests.tiny_models import VARIANTS, tiny_model


def forward_and_grads(model, ids, autocast: bool):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids).logits
    logits.float().log_softmax(-1).mean().backward()
    return logits.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("architecture", VARIANTS)
def test_logits_and_every_gradient_are_the_models_own(architecture, autocast):
    model = tiny_model(architecture)
    patched = copy.deepcopy(model)
    ran, why = recompute_mlp_activations(patched)
    assert ran == "mlp_recompute", why
    ids = torch.randint(2, 500, (3, 11), generator=torch.Generator().manual_seed(0))
    logits, grads = forward_and_grads(model, ids, autocast)
    patched_logits, patched_grads = forward_and_grads(patched, ids, autocast)
    torch.testing.assert_close(patched_logits, logits, rtol=0, atol=0)
    assert grads.keys() == patched_grads.keys()
    for name, grad in grads.items():  # the same ops on the same inputs: recomputing changes no bit
        torch.testing.assert_close(patched_grads[name], grad, rtol=1e-6, atol=1e-7, msg=name)


def wide_activations_alive(model, ids) -> tuple[int, int]:
    """(alive, total) of the MLPs' activation outputs and down-projection inputs once the forward has returned
    (its graph still held for the backward)."""
    refs = []

    def keep(module, args, output=None):
        refs.append(weakref.ref(output if output is not None else args[0]))

    handles = []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("act", "act_fn"):
            handles.append(module.register_forward_hook(keep))
        if leaf in ("dense_4h_to_h", "down_proj"):
            handles.append(module.register_forward_pre_hook(keep))
    loss = model(input_ids=ids).logits.sum()
    gc.collect()
    alive, total = sum(ref() is not None for ref in refs), len(refs)
    loss.backward()  # (the recomputation calls the activation module again: not counted)
    for handle in handles:
        handle.remove()
    return alive, total


@pytest.mark.parametrize("architecture", ["gpt_neox", "llama"])
def test_the_activations_are_not_kept_for_the_backward(architecture):
    """Without the patch autograd holds every activation output and down-projection input until the backward
    (act(h) is the down-projection's input in a GELU MLP; a gated MLP's is act(g) * u); with it, none."""
    model = tiny_model(architecture)
    ids = torch.randint(2, 500, (2, 7), generator=torch.Generator().manual_seed(1))
    alive, total = wide_activations_alive(model, ids)
    assert alive == total > 0
    recompute_mlp_activations(model)
    assert wide_activations_alive(model, ids) == (0, total)


class ScaledMLP(GPTNeoXMLP):
    """An MLP with GPT-NeoX's layer names whose forward is not GPT-NeoX's."""

    def forward(self, hidden_states):
        return 2 * super().forward(hidden_states)


def test_an_mlp_whose_forward_differs_from_its_form_is_left_as_it_is_and_said():
    model = tiny_model("gpt_neox")
    for layer in model.gpt_neox.layers:
        layer.mlp.__class__ = ScaledMLP
    ran, why = recompute_mlp_activations(model)
    assert ran == "kept" and "ScaledMLP's own forward differs" in why
    assert all("forward" not in vars(layer.mlp) for layer in model.gpt_neox.layers)


def test_an_mlp_of_another_form_is_named():
    model = tiny_model("gpt_neox")
    for layer in model.gpt_neox.layers:
        del layer.mlp.act  # no activation by a known name
    assert "GPTNeoXMLP lacks the gpt_neox MLP's layers (dense_h_to_4h, act, dense_4h_to_h)" in why_not_recompute_mlp(
        model
    )
    assert recompute_mlp_activations(model)[0] == "kept"


@pytest.mark.parametrize("preset", ["pythia-160m", "llama-1b"])
def test_the_plan_keeps_one_wide_activation_less_per_layer_gelu_and_two_gated(preset):
    arch = architecture(PRESETS[preset])
    base = full_model_shape(
        precision="32-true",
        frozen_dtype="float32",
        strategy="auto",
        world_size=1,
        micro_batch_size=4,
        generation_batch_size=4,
        prompt_length=16,
        response_length=8,
        shared_prefix=False,
    )
    kept = estimate(arch, Shape(**base))["activations"]
    recomputed = estimate(arch, Shape(mlp_recompute=True, **base))["activations"]
    tokens, wide = 4 * (16 + 8), 2 if arch.gated_mlp else 1
    assert (kept - recomputed) * 2**20 == pytest.approx(tokens * arch.num_layers * wide * arch.intermediate_size * 4)
