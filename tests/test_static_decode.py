"""rloo.generation.static_decode against the same references as the eager loop: HF generate's greedy ids, the training
forward's log-probs, and the eager loop's seeded samples. On CPU the static step runs eagerly (capture=False); on a
GPU (the GPU check runs this file there) the same tests replay it as CUDA graphs."""

from dataclasses import replace

import pytest
import torch

from rloo.generation import static_decode
from rloo.generation.lean_sampler import LeanSampler, lean_generate
from rloo.generation.rollout import truncate_after_stop
from rloo.generation.static_decode import buckets, static_generate, why_not_graph
from tests.builders import sampling as sampling_config
from tests.test_decode import (
    ARCHITECTURES,
    hf_generate,
    left_padded_prompts,
    pick_stop_token,
    shared_prompt_layout,
    training_logprobs,
)
from tests.tiny_models import EOS, PAD, tiny_model

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")),
]


@pytest.fixture
def compactions(monkeypatch):
    """How often the loop moved live rows into a smaller bucket."""
    moves = []
    original = static_decode._Slots.compact

    def compact(self, width, size, own_kvs):
        moves.append((width, size))
        return original(self, width, size, own_kvs)

    monkeypatch.setattr(static_decode._Slots, "compact", compact)
    return moves


def test_buckets_halve_down_to_at_most_four_sizes():
    assert buckets(16) == [16, 8, 4, 2]
    assert buckets(5) == [5, 3, 2, 1]
    assert buckets(2) == [2, 1]
    assert buckets(1) == [1]


def test_the_graph_serves_gpus_only_and_says_why_not():
    assert why_not_graph(tiny_model()) == "the policy is on cpu; CUDA graphs need a GPU"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_static_greedy_ids_equal_hf_generate(architecture, device, compactions):
    model = tiny_model(architecture).to(device)
    ids, mask = left_padded_prompts(12, 6, model.config.vocab_size)
    ids, mask = torch.cat([ids, ids[:4]]).to(device), torch.cat([mask, mask[:4]]).to(device)  # shared prefills
    free_run = hf_generate(model, ids, mask, sampling_config(max_new_tokens=16, greedy=True, stop_at_eos=False))
    stop = pick_stop_token(free_run)
    sampling = sampling_config(max_new_tokens=16, greedy=True)
    expected = hf_generate(model, ids, mask, sampling, eos=stop)
    completions, logprobs = static_generate(model, ids, mask, sampling, stop, PAD, capture=device == "cuda")
    assert torch.equal(completions, expected)
    _, completion_mask, _ = truncate_after_stop(completions, stop, PAD)
    assert (logprobs[completion_mask == 0] == 0).all()
    expected_logprobs = training_logprobs(model, ids, mask, completions, completion_mask, 1.0)
    torch.testing.assert_close(logprobs, expected_logprobs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("layout", ["blocks of 4", "interleaved", "unequal"])
def test_static_samples_equal_the_eager_loops(architecture, layout, device, compactions):
    """Seeded: the same ids as the eager loop (which drops rows at once), log-probs equal to float rounding and to
    the training forward's, while rows end at different steps and the live ones move into smaller buckets."""
    model = tiny_model(architecture, vocab_size=20).to(device)
    ids, mask = (t.to(device) for t in shared_prompt_layout(layout, 20))
    sampling = sampling_config(max_new_tokens=48, temperature=0.9, top_k=12, top_p=0.95)
    torch.manual_seed(3)
    eager, eager_logprobs = lean_generate(model, ids, mask, replace(sampling, cuda_graph=False), EOS, PAD)
    torch.manual_seed(3)
    static, static_logprobs = static_generate(model, ids, mask, sampling, EOS, PAD, capture=device == "cuda")
    assert torch.equal(static, eager)
    torch.testing.assert_close(static_logprobs, eager_logprobs, atol=1e-5, rtol=0)
    completions, completion_mask, ended = truncate_after_stop(static, EOS, PAD)
    assert ended.any() and compactions  # rows ended, and the loop moved to a smaller bucket
    expected = training_logprobs(model, ids, mask, completions, completion_mask, 0.9)
    torch.testing.assert_close(static_logprobs, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_the_rollout_samples_through_graphs_on_a_gpu_and_the_eager_loop_elsewhere(device, monkeypatch):
    """rloo.generation.rollout's sampler: the static loop where cuda_graph=true and the policy is on a GPU, else the
    eager
    loop (cuda_graph=false, or a CPU)."""
    from rloo.generation.rollout import generate_with_logprobs

    calls = []
    for module, name in ((static_decode, "static_generate"), (LeanSampler, "_decode")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, _n=name, **k: calls.append(_n) or _f(*a, **k))
    model = tiny_model(vocab_size=20).to(device)
    ids, mask = (t.to(device) for t in left_padded_prompts(8, 5, 20))
    sampling = sampling_config(max_new_tokens=12, temperature=0.9)
    for cuda_graph in (True, False):
        generate_with_logprobs(model, ids, mask, replace(sampling, cuda_graph=cuda_graph), EOS, PAD, batch_size=8)
    graph_loop = "static_generate" if device == "cuda" else "_decode"
    assert calls == [graph_loop, "_decode"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("autocast", [False, True])
def test_replayed_graphs_sample_as_the_same_steps_run_eagerly(architecture, autocast):
    """The capture itself, on a GPU: seeded samples from the replayed graphs equal the same static steps run
    eagerly, in float32 and under bf16 autocast (a bf16-mixed run samples under it; its cache of cast weights is
    kept out of the capture)."""
    model = tiny_model(architecture, vocab_size=20).cuda()
    ids, mask = (t.cuda() for t in shared_prompt_layout("blocks of 4", 20))
    sampling = sampling_config(max_new_tokens=32, temperature=0.9)
    results = []
    for capture in (False, True):
        torch.manual_seed(5)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            results.append(static_generate(model, ids, mask, sampling, EOS, PAD, capture=capture))
    (eager, eager_logprobs), (replayed, replayed_logprobs) = results
    assert torch.equal(replayed, eager)
    torch.testing.assert_close(replayed_logprobs, eager_logprobs, atol=1e-6, rtol=0)
