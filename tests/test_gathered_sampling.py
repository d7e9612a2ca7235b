"""The rollout of a partitioned policy (rloo.models.sharding): its weights gathered whole once for the lean decode and
partitioned again after it, decided once per run from the memory free on every rank. In this process, on a
one-process gloo group (FSDP2 shards over one rank as over many); the two-process runs are tests/test_scale_out.py."""

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from rloo.algorithms.base import OnlineRLModule
from rloo.data.padding import left_pad
from rloo.generation.decode import why_not_lean_decode
from rloo.generation.episodes import sample_episodes
from rloo.models.sharding import GATHERS, gather_fits, shard_model, whole_bytes
from tests.builders import sampling
from tests.e2e import free_port
from tests.tiny_models import tiny_model

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])  # .ci/gpu-check runs these on a GPU too


@pytest.fixture(params=DEVICES)
def sharded_policy(tokenizer, request):
    """A tiny policy and its FSDP2-sharded copy, on a one-process group (gloo on CPU, NCCL on a GPU) that ends with
    the test."""
    from torch.distributed.device_mesh import init_device_mesh

    device = request.param
    port = free_port()
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        whole = tiny_model("gpt_neox", tokenizer).to(device)
        sharded = shard_model(copy.deepcopy(whole), init_device_mesh(device, (1,)))
        yield whole, sharded
    finally:
        dist.destroy_process_group()


def draw(policy, tokenizer, settings, seed=0):
    device = next(policy.parameters()).device
    ids, mask = (t.to(device) for t in left_pad([[5, 6, 7], [8, 9], [5, 6, 7], [8, 9]], tokenizer.pad_token_id))
    torch.manual_seed(seed)
    return sample_episodes(policy, ids, mask, settings, 4, tokenizer.eos_token_id, tokenizer.pad_token_id)


def refused(*args, **kwargs):
    raise AssertionError("this sampler must not run here")


def test_a_sharded_policy_samples_from_its_gathered_weights_what_the_whole_policy_samples(
    sharded_policy, tokenizer, monkeypatch
):
    whole, sharded = sharded_policy
    setattr(sharded, GATHERS, True)  # the run found room for the copy
    settings = sampling(12)
    expected = draw(whole, tokenizer, settings)
    monkeypatch.setattr("rloo.generation.samplers.HFSampler", refused)  # the lean decode samples, or the test fails
    got = draw(sharded, tokenizer, settings)
    assert torch.equal(got.completion_ids, expected.completion_ids)
    assert torch.equal(got.generation_logprobs, expected.generation_logprobs)
    weight = sharded.gpt_neox.layers[0].mlp.dense_h_to_4h.weight
    assert type(weight).__name__ == "DTensor"  # partitioned again: nothing whole is kept for the update
    assert why_not_lean_decode(sharded, 64) == "the weights are partitioned across ranks"


def test_without_room_for_the_copy_the_sharded_policy_is_sampled_by_hf_generate(sharded_policy, tokenizer, monkeypatch):
    whole, sharded = sharded_policy
    setattr(sharded, GATHERS, False)
    hf = sampling(12, lean_decode=False)
    expected = draw(whole, tokenizer, hf)  # HF generate on the whole policy
    monkeypatch.setattr("rloo.generation.samplers.LeanSampler", refused)
    got = draw(sharded, tokenizer, sampling(12))  # lean_decode=true, but nothing gathered: HF generate
    assert torch.equal(got.completion_ids, expected.completion_ids)


def test_the_gather_is_decided_by_the_fullest_rank_and_a_refusal_is_said(sharded_policy, tokenizer, monkeypatch):
    """OnlineRLModule.decide_rollout_gather: the whole weights plus the decode's float32 copy (CPU) against the free
    memory of the fullest rank, with a tenth kept free."""
    _, sharded = sharded_policy
    needed = 2 * whole_bytes(sharded)  # the copy and the decode's reordered float32 copy of it
    assert whole_bytes(sharded) == sum(p.numel() * 4 for p in sharded.parameters())  # DTensor numel: the whole
    module = SimpleNamespace(
        policy=sharded,
        config=SimpleNamespace(sampling=sampling(12)),
        device=next(sharded.parameters()).device,
        trainer=SimpleNamespace(num_devices=1),
        sampler_note=None,
    )
    for free, fits in ((int(needed / 0.9) + 1, True), (int(needed / 0.9) - 1, False)):
        monkeypatch.setattr("rloo.utils.memory.free_bytes", lambda device, processes: free)
        assert gather_fits(needed, free) is fits
        OnlineRLModule.decide_rollout_gather(module)
        assert getattr(sharded, GATHERS) is fits
    chosen, why = module.sampler_note
    assert chosen == "hf_generate" and "would not fit" in why and f"{needed / 2**20:,.0f} MiB" in why
