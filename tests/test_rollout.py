"""The rollout: sampling settings, EOS stopping, truncation, log-prob alignment, scoring, group layout."""

import contextlib
import math

import pytest
import torch
from transformers import GenerationConfig

from rloo.data.padding import left_pad
from rloo.generation.forward import completion_logprobs, reward_scores
from rloo.generation.rollout import collect_rollout, truncate_after_stop
from tests.builders import hf_generate as generate
from tests.builders import sampling as sampling_config
from tests.tiny_models import FAMILIES, tiny_model

PAD, EOS = 1, 0


def prompts(tokenizer, texts):
    return left_pad([tokenizer(t, add_special_tokens=False).input_ids for t in texts], tokenizer.pad_token_id)


def test_truncate_after_stop_keeps_stop_token_and_pads_the_rest():
    ids = torch.tensor([[5, 6, EOS, 7, EOS], [5, 6, 7, 8, 9], [EOS, 5, 5, 5, 5], [5, EOS, PAD, PAD, PAD]])
    out, mask, ended = truncate_after_stop(ids, EOS, PAD)
    assert out.tolist() == [[5, 6, EOS, PAD, PAD], [5, 6, 7, 8, 9], [EOS, PAD, PAD, PAD, PAD], [5, EOS, PAD, PAD, PAD]]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]]
    assert ended.tolist() == [True, False, True, True]


def test_truncate_without_stop_token_keeps_every_token():
    ids = torch.tensor([[5, EOS, 7, PAD]])
    out, mask, ended = truncate_after_stop(ids, None, PAD)
    assert out.tolist() == [[5, EOS, 7, PAD]] and mask.tolist() == [[1, 1, 1, 1]] and ended.tolist() == [False]


def test_a_sampled_pad_token_before_the_stop_is_a_real_token():
    out, mask, ended = truncate_after_stop(torch.tensor([[5, PAD, 6, EOS, PAD]]), EOS, PAD)
    assert mask.tolist() == [[1, 1, 1, 1, 0]] and ended.tolist() == [True]


def eos_biased(policy, tokenizer, p_eos):
    """Zero LM head plus a bias: every other token has logit 0, EOS has probability p_eos at each step."""
    vocab = policy.get_output_embeddings().out_features
    head = torch.nn.Linear(policy.get_output_embeddings().in_features, vocab, bias=True)
    torch.nn.init.zeros_(head.weight)
    bias = torch.zeros(vocab)
    bias[tokenizer.eos_token_id] = math.log(p_eos * (vocab - 1) / (1 - p_eos))
    head.bias.data = bias
    policy.set_output_embeddings(head)
    return policy


def test_generation_stops_at_eos_and_logprobs_match_hand_values(policy, tokenizer):
    policy = eos_biased(policy, tokenizer, p_eos=0.3)
    ids, mask = prompts(tokenizer, ["POST: the cat\n\nTL;DR:"] * 32)
    torch.manual_seed(0)
    raw = generate(
        policy,
        ids,
        mask,
        sampling_config(max_new_tokens=60, temperature=1.0),
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        batch_size=32,
    )
    assert raw.shape[1] < 60  # every row ended, so generation stopped early
    completion, cmask, ended = truncate_after_stop(raw, tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert ended.all()
    lengths = cmask.sum(1)
    assert lengths.float().mean().item() < 1 / 0.3 * 1.6  # geometric with mean 1/0.3
    logprobs = completion_logprobs(
        policy, torch.cat([ids, completion], 1), torch.cat([mask, cmask], 1), completion, cmask, 1.0
    )
    vocab = policy.get_output_embeddings().out_features
    z = 0.3 * (vocab - 1) / 0.7 + (vocab - 1)  # partition function: e^b + (V-1) * e^0
    for row in range(32):
        n = lengths[row].item()
        expected = [math.log(1 / z)] * (n - 1) + [math.log(0.3 * (vocab - 1) / 0.7 / z)]
        assert torch.allclose(logprobs[row, :n], torch.tensor(expected), atol=1e-5)
        assert (logprobs[row, n:] == 0).all()


def test_forward_logprobs_match_generation_scores_with_left_padding(policy, tokenizer):
    """The training-style forward (with position ids that skip left pads) reproduces generation's own log-probs."""
    ids, mask = prompts(tokenizer, ["POST: the cat was on my boat\n\nTL;DR:", "POST: rain\n\nTL;DR:"])
    torch.manual_seed(0)
    out = policy.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=True,
        max_new_tokens=8,
        temperature=1.0,
        top_k=None,
        top_p=None,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=None,
    )
    completion = out.sequences[:, ids.shape[1] :]
    gen_logprobs = torch.stack(
        [
            torch.log_softmax(s.float(), -1).gather(1, completion[:, t : t + 1]).squeeze(1)
            for t, s in enumerate(out.scores)
        ],
        1,
    )
    cmask = torch.ones_like(completion)
    forward = completion_logprobs(policy, out.sequences, torch.cat([mask, cmask], 1), completion, cmask, 1.0)
    assert torch.allclose(forward, gen_logprobs, atol=1e-4)


def test_sampling_ignores_the_models_generation_config(policy, tokenizer):
    policy.generation_config = GenerationConfig(do_sample=False, top_k=1, temperature=0.01, max_new_tokens=2)
    ids, mask = prompts(tokenizer, ["POST: the cat\n\nTL;DR:"] * 16)
    torch.manual_seed(0)
    raw = generate(
        policy,
        ids,
        mask,
        sampling_config(max_new_tokens=6, temperature=1.0, stop_at_eos=False),
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        batch_size=8,
    )
    assert raw.shape[1] == 6  # our max_new_tokens, not the model's 2
    assert len({tuple(r) for r in raw.tolist()}) > 8  # sampled, not greedy / top-1
    assert policy.generation_config.top_k == 1  # and the model's own config is restored


def test_greedy_generation_is_deterministic(policy, tokenizer):
    ids, mask = prompts(tokenizer, ["POST: the cat\n\nTL;DR:"] * 4)
    greedy = sampling_config(max_new_tokens=6, greedy=True, stop_at_eos=False)
    a = generate(policy, ids, mask, greedy, tokenizer.eos_token_id, tokenizer.pad_token_id, 4)
    b = generate(policy, ids, mask, greedy, tokenizer.eos_token_id, tokenizer.pad_token_id, 2)
    assert torch.equal(a, b) and len({tuple(r) for r in a.tolist()}) == 1


def test_reward_score_is_taken_at_the_last_real_token(reward_model, tokenizer):
    ids, mask = prompts(tokenizer, ["POST: the cat\n\nTL;DR: cat"])
    # the same sequence with extra right padding and extra left padding scores the same
    right = torch.cat([ids, torch.full((1, 3), tokenizer.pad_token_id)], 1)
    right_mask = torch.cat([mask, torch.zeros(1, 3, dtype=torch.long)], 1)
    left = torch.cat([torch.full((1, 2), tokenizer.pad_token_id), ids], 1)
    left_mask = torch.cat([torch.zeros(1, 2, dtype=torch.long), mask], 1)
    with torch.no_grad():
        base = reward_scores(reward_model, ids, mask)
        assert torch.allclose(reward_scores(reward_model, right, right_mask), base, atol=1e-5)
        assert torch.allclose(reward_scores(reward_model, left, left_mask), base, atol=1e-5)
        # and differs from the score one token earlier
        assert not torch.allclose(reward_scores(reward_model, ids[:, :-1], mask[:, :-1]), base, atol=1e-5)


def test_collect_rollout_lays_groups_prompt_major(policy, reward_model, tokenizer):
    import copy

    texts = ["POST: the cat\n\nTL;DR:", "POST: my boat was there\n\nTL;DR:", "POST: rain\n\nTL;DR:"]
    ids, mask = prompts(tokenizer, texts)
    reference = copy.deepcopy(policy)
    rollout = collect_rollout(
        policy,
        reference,
        reward_model,
        ids,
        mask,
        k=4,
        sampling=sampling_config(max_new_tokens=5, temperature=1.0),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        forward_batch_size=5,
    )
    assert rollout.prompt_ids.shape[0] == 12
    for p in range(3):
        for i in range(4):
            assert torch.equal(rollout.prompt_ids[p * 4 + i], ids[p])
    # the reference is a copy of the policy, so its log-probs equal the policy's training-style ones
    policy_logprobs = completion_logprobs(
        policy, rollout.input_ids, rollout.attention_mask, rollout.completion_ids, rollout.completion_mask, 1.0
    )
    assert torch.allclose(rollout.ref_logprobs, policy_logprobs, atol=1e-6)
    assert rollout.scores.shape == (12,) and rollout.completion_mask.shape == rollout.completion_ids.shape


def test_top_k_off_samples_from_the_whole_vocabulary(policy, tokenizer):
    """top_k=0 must reach HF generate as 0: left unset, transformers fills in top_k=50."""
    torch.manual_seed(0)
    ids = torch.full((1500, 1), tokenizer.eos_token_id)
    raw = generate(
        policy,
        ids,
        torch.ones_like(ids),
        sampling_config(max_new_tokens=1, temperature=1.0, top_k=0),
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        1500,
    )
    assert len(set(raw[:, 0].tolist())) > 100  # a random tiny model is near uniform over ~400 tokens
    capped = generate(
        policy,
        ids,
        torch.ones_like(ids),
        sampling_config(max_new_tokens=1, temperature=1.0, top_k=50),
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        1500,
    )
    assert len(set(capped[:, 0].tolist())) <= 50


# ---- the LM head on completion positions only, in chunks -------------------------------------------------------
def test_the_chunked_log_prob_pass_equals_the_full_logits_with_left_padding_and_mixed_eos(policy, tokenizer):
    """Reference: the model's own forward to [N, T, V] logits, then log-softmax and entropy, slowly and whole."""
    from rloo.generation.forward import completion_logits, completion_logprobs, completion_logprobs_and_entropy
    from rloo.models.loading import use_fp32_lm_head
    from rloo.objectives import entropy_from_logits, token_logprobs

    use_fp32_lm_head(policy)
    ids, mask = prompts(tokenizer, ["POST: cat dog\n\nTL;DR:", "POST: the boat was on the river today\n\nTL;DR:"])
    torch.manual_seed(0)
    completion = torch.randint(0, len(tokenizer), (2, 5))
    completion_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])  # the second ended with EOS at its 2nd token
    input_ids, attention_mask = torch.cat([ids, completion], 1), torch.cat([mask, completion_mask], 1)
    logits = completion_logits(policy, input_ids, attention_mask, 5) / 0.7
    expected = token_logprobs(logits, completion) * completion_mask
    expected_entropy = entropy_from_logits(logits) * completion_mask
    logprobs, entropy = completion_logprobs_and_entropy(
        policy, input_ids, attention_mask, completion, completion_mask, 0.7
    )
    assert torch.allclose(logprobs, expected, atol=1e-5) and torch.allclose(entropy, expected_entropy, atol=1e-5)
    assert torch.allclose(
        completion_logprobs(policy, input_ids, attention_mask, completion, completion_mask, 0.7), expected, atol=1e-5
    )


@pytest.mark.parametrize("fp32_head", [False, True])
def test_chunks_give_the_values_and_gradients_of_plain_autograd(fp32_head):
    """Reference: log_softmax over the whole logits, differentiated by autograd; entropy by its definition."""
    from rloo.generation.forward import chunked_logprobs_and_entropy
    from rloo.models.loading import FP32Head

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 1000, bias=True)
    if fp32_head:
        head.__class__ = FP32Head
    hidden = torch.randn(37, 16, requires_grad=True)
    ids = torch.randint(0, 1000, (37,))
    weights = torch.linspace(-1, 1, 37)

    log_p = torch.log_softmax(torch.nn.functional.linear(hidden, head.weight, head.bias) / 0.9, -1)
    expected_entropy = -(log_p.exp() * log_p).sum(-1).detach()
    expected = log_p.gather(1, ids[:, None]).squeeze(1)
    expected_grads = torch.autograd.grad((expected * weights).sum(), (hidden, head.weight, head.bias))
    for chunk_elements in (10**9, 5000):  # whole; 5 rows a chunk, the last one short
        hidden.grad = head.weight.grad = head.bias.grad = None
        logprobs, entropy = chunked_logprobs_and_entropy(head, hidden, ids, 0.9, chunk_elements=chunk_elements)
        (logprobs * weights).sum().backward()
        assert torch.allclose(logprobs, expected, atol=1e-5) and torch.allclose(entropy, expected_entropy, atol=1e-5)
        assert not entropy.requires_grad
        for got, want in zip((hidden.grad, head.weight.grad, head.bias.grad), expected_grads):
            assert torch.allclose(got, want, atol=1e-6), chunk_elements
    assert chunked_logprobs_and_entropy(head, hidden, ids, 0.9, with_entropy=False)[1] is None
    with torch.no_grad():  # the no-gradient path (reference and old log-probs)
        assert torch.allclose(
            chunked_logprobs_and_entropy(head, hidden, ids, 0.9, chunk_elements=5000)[0], expected, atol=1e-5
        )


def test_chunked_log_probs_under_bf16_autocast_match_autograd_through_the_same_head():
    """The backward recomputes the logits under the forward's autocast state: bf16 logits, as autograd sees them."""
    from rloo.generation.forward import chunked_logprobs_and_entropy

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 300, bias=False)
    hidden = torch.randn(12, 16, requires_grad=True)
    ids = torch.randint(0, 300, (12,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = torch.log_softmax(head(hidden).float(), -1).gather(1, ids[:, None]).squeeze(1)
        grads = torch.autograd.grad(expected.sum(), (hidden, head.weight))
        logprobs, _ = chunked_logprobs_and_entropy(head, hidden, ids, 1.0, with_entropy=False)
    got = torch.autograd.grad(logprobs.sum(), (hidden, head.weight))
    assert torch.allclose(logprobs, expected, atol=1e-6)
    for g, want in zip(got, grads):  # bit for bit: an fp32 recompute would differ by ~1e-3
        assert torch.equal(g, want)


def test_adamw_is_the_fused_kernel_on_cpu_and_steps_as_the_plain_loop():
    from rloo.algorithms.optim import adamw_with_schedule

    torch.manual_seed(0)
    weights = [torch.nn.Parameter(torch.randn(5, 7)), torch.nn.Parameter(torch.randn(7))]
    copies = [torch.nn.Parameter(w.detach().clone()) for w in weights]
    fused = adamw_with_schedule(weights, 1e-2, total_steps=10, weight_decay=0.1)["optimizer"]
    plain = torch.optim.AdamW(copies, lr=1e-2, weight_decay=0.1, foreach=False)
    assert fused.defaults["fused"] is True
    for step in range(3):
        grads = [torch.randn_like(w) for w in weights]
        for w, c, g in zip(weights, copies, grads):
            w.grad, c.grad = g.clone(), g.clone()
        fused.step()
        plain.step()
    assert all(torch.allclose(w, c, atol=1e-6) for w, c in zip(weights, copies))


# ---- each prompt once per group of k ----------------------------------------------------------------------------
def grouped_batch(tokenizer, k=3):
    """Three prompts of different lengths (left-padded), k completions each, with EOS at different places."""
    ids, mask = prompts(
        tokenizer,
        ["POST: cat dog\n\nTL;DR:", "POST: the boat was on the river today\n\nTL;DR:", "POST: rain\n\nTL;DR:"],
    )
    torch.manual_seed(1)
    completion = torch.randint(0, len(tokenizer), (3 * k, 6))
    lengths = torch.tensor([6, 1, 3, 6, 6, 2, 4, 5, 1][: 3 * k])
    completion_mask = (torch.arange(6) < lengths[:, None]).long()
    return (
        torch.cat([ids.repeat_interleave(k, 0), completion], 1),
        torch.cat([mask.repeat_interleave(k, 0), completion_mask], 1),
        completion,
        completion_mask,
    )


@contextlib.contextmanager
def body_row_widths(model):
    """The width of every row batch the model's body runs during the block: P + T plain, P + kT packed."""
    widths = []
    hook = model.base_model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(kwargs["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        yield widths
    finally:
        hook.remove()


# Gemma 2 soft-caps its scores, which transformers' SDPA path cannot: it runs eager only
ATTENTIONS = [(family, attention) for family in FAMILIES for attention in ("sdpa", "eager")]


@pytest.mark.parametrize("family, attention", [pair for pair in ATTENTIONS if pair != ("gemma2", "sdpa")])
def test_the_shared_prefix_forward_gives_the_log_probs_and_gradients_of_the_plain_forward(tokenizer, family, attention):
    from rloo.generation.forward import completion_logprobs_and_entropy, shares_prefix

    policy = tiny_model(family, tokenizer)
    policy.set_attn_implementation(attention)  # the packed mask is bool for SDPA, additive for eager
    input_ids, attention_mask, completion, completion_mask = grouped_batch(tokenizer)
    assert shares_prefix(policy, input_ids[:, :-6], attention_mask[:, :-6], 3, input_ids.shape[1])
    weights = torch.randn(completion.shape, generator=torch.Generator().manual_seed(2))
    results = []
    for group_size in (1, 3):
        policy.zero_grad()
        with body_row_widths(policy) as widths:
            logprobs, entropy = completion_logprobs_and_entropy(
                policy, input_ids, attention_mask, completion, completion_mask, 0.8, group_size=group_size
            )
        assert widths == [input_ids.shape[1] - 6 + group_size * 6]  # group_size 3: one packed row per prompt
        (logprobs * weights).sum().backward()
        results.append((logprobs.detach(), entropy, {n: p.grad.clone() for n, p in policy.named_parameters()}))
    (plain, plain_entropy, plain_grads), (shared, shared_entropy, shared_grads) = results
    assert torch.allclose(plain, shared, atol=1e-5) and torch.allclose(plain_entropy, shared_entropy, atol=1e-5)
    for name, grad in plain_grads.items():
        assert torch.allclose(grad, shared_grads[name], atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("family", FAMILIES)
def test_the_shared_prefix_forward_gives_the_same_scores(tokenizer, family):
    from rloo.generation.forward import reward_scores

    reward_model = tiny_model(family, tokenizer, reward=True, seed=1)
    input_ids, attention_mask, completion, _ = grouped_batch(tokenizer)
    plain = reward_scores(reward_model, input_ids, attention_mask)
    with body_row_widths(reward_model) as widths:
        shared = reward_scores(reward_model, input_ids, attention_mask, completion_len=6, group_size=3)
    assert widths == [input_ids.shape[1] + 2 * 6]  # packed
    assert torch.allclose(plain, shared, atol=1e-5)


def test_packing_is_chosen_by_its_cost_against_hand_counts():
    """One block's linear multiply-adds and the attention width, counted by hand; packing pays at a long prompt
    and short completions, not at a short prompt and long completions."""
    from rloo.generation.forward import _block_costs, packing_pays

    neox = tiny_model("gpt_neox")  # hidden 64, MLP 256, 4 heads of 16
    assert _block_costs(neox) == (64 * 192 + 64 * 64 + 64 * 256 + 256 * 64, 64)
    llama = tiny_model("llama")  # hidden 64, 2 key/value heads of 16, MLP 128
    assert _block_costs(llama) == (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128, 64)
    w = 49152
    # P=8, T=128, k=4: packed 520 tokens, 49152*520 + 128*520^2 = 60.2M > 4 * (49152*136 + 128*136^2) = 36.2M
    assert not packing_pays(neox, 8, 128, 4) and w * 520 + 128 * 520**2 > 4 * (w * 136 + 128 * 136**2)
    # P=32, T=4, k=4: packed 48 tokens, 2.65M < plain 7.74M
    assert packing_pays(neox, 32, 4, 4) and w * 48 + 128 * 48**2 < 4 * (w * 36 + 128 * 36**2)


def test_a_batch_packing_would_slow_takes_the_plain_forward_with_the_same_values(tokenizer):
    from rloo.generation.forward import completion_logprobs, packing_pays

    policy = tiny_model("llama", tokenizer)
    input_ids, attention_mask, completion, completion_mask = grouped_batch(tokenizer)
    long = 40  # completions padded to 40 tokens: the packed row would cost more
    pad = torch.zeros(completion.shape[0], long - 6, dtype=completion.dtype)
    completion, completion_mask = torch.cat([completion, pad], 1), torch.cat([completion_mask, pad], 1)
    input_ids, attention_mask = torch.cat([input_ids, pad], 1), torch.cat([attention_mask, pad], 1)
    prompt_len = input_ids.shape[1] - long
    assert not packing_pays(policy, prompt_len, long, 3)
    with body_row_widths(policy) as widths:
        shared = completion_logprobs(policy, input_ids, attention_mask, completion, completion_mask, 0.8, group_size=3)
    assert widths == [prompt_len + long]  # plain rows
    plain = completion_logprobs(policy, input_ids, attention_mask, completion, completion_mask, 0.8)
    assert torch.equal(shared, plain)


def test_rows_that_do_not_share_their_prompt_take_the_plain_forward(policy, tokenizer):
    from rloo.generation.forward import shares_prefix

    input_ids, attention_mask, _, _ = grouped_batch(tokenizer)
    shuffled = torch.tensor([0, 3, 1, 2, 4, 5, 6, 7, 8])  # a group split, as a shuffled mini-batch splits them
    assert not shares_prefix(policy, input_ids[shuffled, :-6], attention_mask[shuffled, :-6], 3)
    assert not shares_prefix(policy, input_ids[:8, :-6], attention_mask[:8, :-6], 3)  # not a multiple of k


# ---- a frozen reference in bf16 computes what the initial policy computes under bf16 autocast ----------------------
@pytest.mark.parametrize("fp32_head", [True, False])
def test_a_bf16_reference_gives_the_policy_log_probs_exactly_under_bf16_autocast(policy, tokenizer, fp32_head):
    """KL = 0 at step 0: only the layers autocast computes in bf16 anyway are stored in bf16. The whole-model cast
    (embeddings and norms rounded too) is the reference that drifted, kept here as the counter-example."""
    import copy

    from rloo.generation.forward import completion_logprobs
    from rloo.models.loading import reference_from, use_fp32_lm_head

    if fp32_head:
        use_fp32_lm_head(policy)
    input_ids, attention_mask, completion, completion_mask = grouped_batch(tokenizer)
    reference = reference_from(policy, None, "bfloat16", autocast_dtype="bfloat16")
    whole_cast = copy.deepcopy(policy).to(torch.bfloat16)
    stored = {name: p.dtype for name, p in reference.named_parameters()}
    assert stored["gpt_neox.layers.0.attention.query_key_value.weight"] == torch.bfloat16
    assert stored["gpt_neox.embed_in.weight"] == stored["gpt_neox.layers.0.input_layernorm.weight"] == torch.float32
    assert reference.get_output_embeddings().weight.dtype == (torch.float32 if fp32_head else torch.bfloat16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logprobs = [
            completion_logprobs(model, input_ids, attention_mask, completion, completion_mask, 0.7, group_size=3)
            for model in (policy, reference, whole_cast)
        ]
    assert torch.equal(logprobs[0], logprobs[1])
    assert not torch.equal(logprobs[0], logprobs[2])


@pytest.mark.parametrize("group_size", [1, 3])
def test_activation_checkpointing_keeps_the_gradients_and_saves_less_for_the_backward(policy, tokenizer, group_size):
    """The blocks are recomputed in the backward pass: same log-probs and gradients (to float rounding), and the
    tensors autograd keeps for the backward shrink (counted with saved-tensor hooks)."""
    import copy

    from rloo.generation.forward import completion_logprobs_and_entropy
    from rloo.models.loading import use_activation_checkpointing

    input_ids, attention_mask, completion, completion_mask = grouped_batch(tokenizer)
    checkpointed = use_activation_checkpointing(copy.deepcopy(policy))
    assert not any(m.training for m in checkpointed.modules() if isinstance(m, torch.nn.Dropout))  # still no dropout
    results = []
    for model in (policy, checkpointed):
        saved = []

        def pack(tensor):
            saved.append(tensor.numel() * tensor.element_size())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            logprobs, _ = completion_logprobs_and_entropy(
                model, input_ids, attention_mask, completion, completion_mask, 0.8, group_size=group_size
            )
        logprobs.sum().backward()
        results.append((logprobs.detach(), sum(saved), {n: p.grad for n, p in model.named_parameters()}))
    (plain, plain_saved, plain_grads), (ckpt, ckpt_saved, ckpt_grads) = results
    assert torch.allclose(plain, ckpt, atol=1e-6)
    assert ckpt_saved < plain_saved / 2
    for name, grad in plain_grads.items():
        assert torch.allclose(grad, ckpt_grads[name], atol=1e-6, rtol=1e-5), name
