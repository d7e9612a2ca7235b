"""rloo.generation.decode.lean_generate against independent references: HF generate (greedy ids, seeded samples), the
training forward's log-probs, HF's logits warpers, the model's own softmax (statistically), and itself without
dropping finished rows."""

import copy

import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from rloo.generation.decode import (
    _group_members,
    _linear,
    _onednn_linear,
    onednn_applies,
    supports_lean_decode,
    why_not_lean_decode,
)
from rloo.generation.forward import completion_logprobs
from rloo.generation.lean_sampler import lean_generate
from rloo.generation.rollout import truncate_after_stop
from rloo.generation.sampling import filter_logits
from tests.builders import hf_generate as generate
from tests.builders import sampling as sampling_config
from tests.tiny_models import EOS, FAMILIES, PAD, VARIANTS, tiny_model

# every variant of tests/tiny_models.py: each family, GPT-NeoX's residual and rotary forms, Llama 3's untied MHA
ARCHITECTURES = list(VARIANTS)


def left_padded_prompts(num_rows: int, length: int, vocab_size: int, seed: int = 0):
    """ids, mask `[N, P]`: row i has a real length cycling through 1..P, left-padded with PAD."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab_size, (num_rows, length), generator=generator)
    real = 1 + torch.arange(num_rows) % length  # [N]
    mask = (torch.arange(length)[None, :] >= length - real[:, None]).long()
    return ids.masked_fill(mask == 0, PAD), mask


def training_logprobs(model, ids, mask, completions, completion_mask, temperature):
    """The reference: the training forward's log-probs of the completions after their prompts."""
    full_ids, full_mask = torch.cat([ids, completions], 1), torch.cat([mask, completion_mask], 1)
    return completion_logprobs(model, full_ids, full_mask, completions, completion_mask, temperature)


def hf_generate(model, ids, mask, sampling, eos=EOS):
    return generate(model, ids, mask, sampling, eos, PAD, batch_size=ids.shape[0])


def pick_stop_token(completions: torch.Tensor) -> int:
    """A token that greedy decoding reaches after step 0 in some rows and never in others, to use as EOS."""
    for token in completions[:, 1:].unique().tolist():
        hit = (completions == token).any(1)
        first = (completions == token).int().argmax(1)
        if 0 < hit.sum() < len(hit) and (first[hit] > 0).all():
            return token
    raise AssertionError("no token splits the rows; change the seed")


def test_supports_lean_decode():
    for architecture in ARCHITECTURES:
        assert supports_lean_decode(tiny_model(architecture), 64), architecture
    assert not supports_lean_decode(tiny_model("gpt_neox", reward=True), 64)
    assert "not LlamaForSequenceClassification" in why_not_lean_decode(tiny_model("llama", reward=True), 64)
    sliding = tiny_model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1)
    assert "sliding-window attention (4 tokens) does not cover 64-token rows" in why_not_lean_decode(sliding, 64)
    assert why_not_lean_decode(sliding, 4) is None  # a window that covers the rows computes full attention
    dynamic = tiny_model("llama", rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    assert "recomputes its frequencies" in why_not_lean_decode(dynamic, 64)


@pytest.mark.parametrize("family", ["mistral", "gemma2"])
def test_a_sliding_window_is_served_where_it_covers_the_rows_and_refused_with_the_reason_otherwise(family):
    """Mistral (every layer) and Gemma 2 (every other layer) attend through a window: where it covers prompt +
    completion the loop's full attention is theirs, greedy ids equal HF's; where it does not, the loop says so."""
    model = tiny_model(family, sliding_window=22)
    ids, mask = left_padded_prompts(6, 6, model.config.vocab_size)
    sampling = sampling_config(max_new_tokens=16, greedy=True, stop_at_eos=False)
    assert why_not_lean_decode(model, 6 + 16) is None
    completions, _ = lean_generate(model, ids, mask, sampling, EOS, PAD)
    assert torch.equal(completions, hf_generate(model, ids, mask, sampling))
    assert "sliding-window attention (22 tokens) does not cover 23-token rows" in why_not_lean_decode(model, 23)


@pytest.mark.parametrize("architecture, hidden_size", [*((a, 64) for a in ARCHITECTURES), ("gpt_neox", 48)])
def test_greedy_ids_equal_hf_generate(architecture, hidden_size):
    # hidden 48: heads of 12 dims, rotary_ndims 3 but a cos table 4 wide, which is what HF rotates
    model = tiny_model(architecture, hidden_size=hidden_size)
    ids, mask = left_padded_prompts(12, 6, model.config.vocab_size)
    ids, mask = torch.cat([ids, ids[:4]]), torch.cat([mask, mask[:4]])  # repeated prompts share one prefill
    sampling = sampling_config(max_new_tokens=16, greedy=True)
    free_run = hf_generate(model, ids, mask, sampling_config(max_new_tokens=16, greedy=True, stop_at_eos=False))
    stop = pick_stop_token(free_run)

    expected = hf_generate(model, ids, mask, sampling, eos=stop)
    completions, logprobs = lean_generate(model, ids, mask, sampling, stop, PAD)
    assert torch.equal(completions, expected)
    ended = (completions == stop).any(1)
    assert ended.any() and not ended.all()  # rows that stop early and rows that never stop
    _, completion_mask, _ = truncate_after_stop(completions, stop, PAD)
    assert (logprobs[completion_mask == 0] == 0).all()


def test_no_eos_runs_to_max_new_tokens():
    model = tiny_model(vocab_size=8)  # EOS is likely, but must not stop anything here
    ids, mask = left_padded_prompts(16, 4, 8)
    sampling = sampling_config(max_new_tokens=12, temperature=1.5, stop_at_eos=False)
    torch.manual_seed(0)
    completions, logprobs = lean_generate(model, ids, mask, sampling, EOS, PAD)
    assert completions.shape == (16, 12) and (completions[:, :-1] == EOS).any()
    assert (logprobs < 0).all()


def bias_eos(model, logit_bias: float):
    """Add `logit_bias` to EOS's logit exactly: final-norm dim 0 becomes the constant 1, read only by EOS's row."""
    with torch.no_grad():
        model.gpt_neox.final_layer_norm.weight[0] = 0.0
        model.gpt_neox.final_layer_norm.bias[0] = 1.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[EOS, 0] = logit_bias
    return model


def test_stops_once_every_row_has_ended():
    model = bias_eos(tiny_model(), 5.5)  # p(EOS) ~ 0.3 per step: every row ends long before 64 tokens
    ids, mask = left_padded_prompts(16, 4, model.config.vocab_size)
    torch.manual_seed(0)
    completions, logprobs = lean_generate(model, ids, mask, sampling_config(max_new_tokens=64), EOS, PAD)
    _, completion_mask, ended = truncate_after_stop(completions, EOS, PAD)
    lengths = completion_mask.sum(1)
    assert ended.all() and completions.shape[1] == lengths.max() < 64
    assert lengths.min() < lengths.max()
    assert (completions[completion_mask == 0] == PAD).all() and (logprobs[completion_mask == 0] == 0).all()


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize(
    "temperature, top_k, top_p, greedy", [(0.7, 0, 1.0, False), (0.7, 5, 0.9, False), (1.0, 0, 1.0, True)]
)
def test_logprobs_equal_training_forward(architecture, temperature, top_k, top_p, greedy):
    model = tiny_model(architecture, vocab_size=24)  # a small vocabulary: EOS ends many rows
    ids, mask = left_padded_prompts(16, 5, 24)
    sampling = sampling_config(max_new_tokens=20, temperature=temperature, top_k=top_k, top_p=top_p, greedy=greedy)
    torch.manual_seed(0)
    completions, logprobs = lean_generate(model, ids, mask, sampling, EOS, PAD)
    completions, completion_mask, ended = truncate_after_stop(completions, EOS, PAD)
    if not greedy:
        assert ended.any()
    expected = training_logprobs(model, ids, mask, completions, completion_mask, 1.0 if greedy else temperature)
    assert logprobs.dtype == torch.float32
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)
    assert (logprobs[completion_mask == 0] == 0).all()


def test_a_tied_gemma2_samples_as_its_training_forward():
    """Gemma 2 ties its head to the embedding's weights, which its body reads scaled by sqrt(D): the decode's sampled
    log-probs equal the training forward's (the variant in tiny_models is untied, for the greedy tests' sake)."""
    model = tiny_model("gemma2", vocab_size=24, tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids, mask = left_padded_prompts(16, 5, 24)
    torch.manual_seed(0)
    completions, logprobs = lean_generate(
        model, ids, mask, sampling_config(max_new_tokens=12, temperature=1.0), EOS, PAD
    )
    completions, completion_mask, _ = truncate_after_stop(completions, EOS, PAD)
    expected = training_logprobs(model, ids, mask, completions, completion_mask, 1.0)
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)
    assert completions.unique().numel() > 3  # the rows are not one token repeated


def hf_warp(scores, temperature, top_k, top_p):
    for warper in (
        TemperatureLogitsWarper(temperature),
        TopKLogitsWarper(top_k) if top_k else None,
        TopPLogitsWarper(top_p) if top_p < 1.0 else None,
    ):
        if warper is not None:
            scores = warper(None, scores)
    return scores


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(0.7, 0, 0.9), (1.3, 10, 1.0), (0.7, 20, 0.5), (1.0, 0, 1e-4), (0.5, 7, 0.0), (0.9, 1, 0.3), (2.0, 200, 0.99)],
)
@pytest.mark.parametrize("ties", [False, True])
def test_filter_equals_hf_warpers(temperature, top_k, top_p, ties):
    generator = torch.Generator().manual_seed(0)
    if ties:  # few distinct values: top-k keeps every tie of the k-th, top-p's <= boundary is hit
        scores = torch.randint(0, 4, (64, 100), generator=generator).float()
    else:
        scores = 3 * torch.randn(64, 100, generator=generator)
    expected = hf_warp(scores.clone(), temperature, top_k, top_p)
    filtered = filter_logits(scores / temperature, top_k, top_p)
    assert torch.equal(filtered.isinf(), expected.isinf())
    assert torch.equal(filtered, expected)
    torch.testing.assert_close(filtered.softmax(-1), expected.softmax(-1), atol=0, rtol=0)
    if top_p <= 1e-4 and not ties:
        assert ((~filtered.isinf()).sum(-1) == 1).all()  # top_p near 0 keeps the single most likely token


@pytest.mark.parametrize("sampler", ["multinomial", "inverse_cdf"])
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (4, 1.0), (0, 0.6)])
def test_first_step_frequencies_match_softmax(top_k, top_p, sampler):
    model = tiny_model(vocab_size=16, seed=3)
    ids = torch.tensor([[5, 9, 2, 7]])
    rows, temperature = 20_000, 0.7
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]
    expected = filter_logits((logits / temperature)[None], top_k, top_p)[0].softmax(-1)  # [V]
    sampling = sampling_config(max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p, sampler=sampler)
    torch.manual_seed(0)
    completions, _ = lean_generate(
        model, ids.expand(rows, -1), torch.ones(rows, 4, dtype=torch.long), sampling, EOS, PAD
    )
    frequencies = torch.bincount(completions[:, 0], minlength=16).float() / rows
    # 6 standard errors per token: a fixed seed never flakes, a wrong distribution is far outside
    tolerance = 6 * (expected * (1 - expected) / rows).sqrt() + 1e-4
    assert ((frequencies - expected).abs() <= tolerance).all(), (frequencies, expected)
    assert (frequencies[expected == 0] == 0).all()


def test_inverse_cdf_draw_never_lands_on_a_zero_probability_token(monkeypatch):
    from rloo.generation.sampling import inverse_cdf_draw

    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5, 0.0, 0.0], [0.2, 0.0, 0.8, 0.0, 0.0, 0.0]])
    for uniform, expected in ((0.0, [1, 0]), (0.19, [1, 0]), (0.49, [1, 2]), (0.5, [3, 2]), (0.999, [3, 2])):
        monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.full(shape, uniform, dtype=torch.float64))
        assert inverse_cdf_draw(probs).tolist() == expected, uniform
    # a uniform that rounds up to the row's total lands on the last token with probability, not past it
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: torch.ones(shape, dtype=torch.float64))
    assert inverse_cdf_draw(probs).tolist() == [3, 2]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("greedy", [False, True])
def test_dropping_finished_rows_changes_nothing(architecture, greedy):
    model = tiny_model(architecture, vocab_size=20)
    ids, mask = left_padded_prompts(24, 6, 20)
    sampling = sampling_config(max_new_tokens=24, temperature=1.0, top_k=12, top_p=0.95, greedy=greedy)
    stop = EOS
    if greedy:
        stop = pick_stop_token(hf_generate(model, ids, mask, sampling_config(24, greedy=True, stop_at_eos=False)))
    torch.manual_seed(1)
    dropped, dropped_logprobs = lean_generate(model, ids, mask, sampling, stop, PAD)
    torch.manual_seed(1)
    kept, kept_logprobs = lean_generate(model, ids, mask, sampling, stop, PAD, drop_finished=False)
    lengths = truncate_after_stop(dropped, stop, PAD)[1].sum(1)
    assert lengths.min() < lengths.max()  # rows ended at different steps, so rows were dropped mid-run
    assert torch.equal(dropped, kept)
    torch.testing.assert_close(dropped_logprobs, kept_logprobs, atol=1e-5, rtol=0)  # batch shapes differ: ulps


def shared_prompt_layout(layout: str, vocab_size: int):
    """ids, mask `[16, 5]` in which rows share prompts as named: every row its own prompt; the rollout's k = 4
    blocks; the same 4 groups interleaved (rows i and i + 4 share); one prompt 10 times among 6 others (groups so
    unequal that the loop gives each row a copy of its prompt's cache instead)."""
    ids, mask = left_padded_prompts(16, 5, vocab_size)
    pick = {
        "distinct": torch.arange(16),
        "blocks of 4": torch.arange(4).repeat_interleave(4),
        "interleaved": torch.arange(4).repeat(4),
        "unequal": torch.cat([torch.full((10,), 3), torch.arange(6, 12)]),
    }[layout]
    return ids[pick], mask[pick]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("layout", ["distinct", "blocks of 4", "interleaved", "unequal"])
def test_rows_sharing_a_prompt_cache_decode_as_if_each_had_its_own(architecture, layout):
    """The prompt's keys and values are cached once per prompt and read by each of its rows: log-probs equal the
    training forward's, and rows dropped mid-run (which moves rows between batch slots) change nothing."""
    model = tiny_model(architecture, vocab_size=20)
    ids, mask = shared_prompt_layout(layout, 20)
    sampling = sampling_config(max_new_tokens=20, temperature=0.9, top_k=12, top_p=0.95)
    torch.manual_seed(3)
    completions, logprobs = lean_generate(model, ids, mask, sampling, EOS, PAD)
    torch.manual_seed(3)
    kept, kept_logprobs = lean_generate(model, ids, mask, sampling, EOS, PAD, drop_finished=False)
    completions, completion_mask, ended = truncate_after_stop(completions, EOS, PAD)
    lengths = completion_mask.sum(1)
    assert ended.any() and lengths.min() < lengths.max()  # rows ended at different steps: dropped mid-run
    assert torch.equal(kept[:, : completions.shape[1]], completions)
    torch.testing.assert_close(logprobs, kept_logprobs[:, : logprobs.shape[1]], atol=1e-5, rtol=0)
    expected = training_logprobs(model, ids, mask, completions, completion_mask, 0.9)
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)


def test_group_members_count_each_prompts_rows_in_row_order():
    inverse = torch.tensor([2, 0, 2, 1, 0, 2, 1, 3])
    expected = []
    for row, group in enumerate(inverse.tolist()):  # the loop reference
        expected.append(sum(1 for earlier in inverse[:row].tolist() if earlier == group))
    assert _group_members(inverse).tolist() == expected == [0, 0, 1, 0, 1, 2, 1, 0]


def test_linear_products_use_onednn_only_for_float32_on_cpu_outside_autocast():
    linear = torch.nn.Linear(4, 6)
    onednn = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    assert onednn_applies(linear.weight) is onednn
    assert not onednn_applies(linear.weight.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_applies(linear.weight)
        assert _linear(linear, rows=3).product is torch.nn.functional.linear
    proj = _linear(linear, rows=3)
    assert proj.product is (_onednn_linear if onednn else torch.nn.functional.linear)
    assert proj.weight.is_mkldnn is onednn  # a reordered copy, not the module's weight
    for rows in (1, 3, 8, 13):  # the layout is chosen for 3 rows; any count multiplies the same
        x = torch.randn(rows, 2, 4)
        torch.testing.assert_close(proj(x), x @ linear.weight.T + linear.bias, atol=1e-6, rtol=0)


@pytest.mark.parametrize("architecture", ["gpt_neox", "llama"])
def test_each_call_decodes_with_the_weights_as_they_are_then(architecture):
    """The reordered weights are copies made per call: after an update, the next call follows the new weights."""
    model = tiny_model(architecture)
    ids, mask = left_padded_prompts(4, 5, model.config.vocab_size)
    config = sampling_config(max_new_tokens=6, greedy=True, stop_at_eos=False)
    before, _ = lean_generate(model, ids, mask, config, EOS, PAD)
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.2)
    after, _ = lean_generate(model, ids, mask, config, EOS, PAD)
    assert torch.equal(after, hf_generate(model, ids, mask, config))
    assert not torch.equal(before, after)


@pytest.mark.parametrize("architecture", FAMILIES)
def test_seeded_samples_follow_hf_generate(architecture):
    """Same seed, no EOS stop: both draw multinomial over [N, V] float32 probabilities each step."""
    model = tiny_model(architecture)
    ids, mask = left_padded_prompts(8, 6, model.config.vocab_size)
    ids, mask = ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)  # the rollout's k = 4 layout
    sampling = sampling_config(max_new_tokens=12, temperature=0.8, top_k=50, top_p=0.9, stop_at_eos=False)
    torch.manual_seed(7)
    expected = hf_generate(model, ids, mask, sampling)
    torch.manual_seed(7)
    completions, _ = lean_generate(model, ids, mask, sampling, EOS, PAD)
    # a last-ulp difference in one probability may flip one draw (and that row's continuation); rows are
    # otherwise independent because both consume the random stream alike
    assert (completions == expected).all(1).float().mean() >= 0.9


@pytest.mark.parametrize("how", ["autocast", "bf16_weights"])
def test_bf16_runs_with_finite_logprobs(how):
    model = tiny_model(vocab_size=24)
    ids, mask = left_padded_prompts(16, 5, 24)
    sampling = sampling_config(max_new_tokens=16, temperature=0.7, top_k=10)
    torch.manual_seed(0)
    if how == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            completions, logprobs = lean_generate(model, ids, mask, sampling, EOS, PAD)
            _, completion_mask, _ = truncate_after_stop(completions, EOS, PAD)
            expected = training_logprobs(model, ids, mask, completions, completion_mask, 0.7)
    else:
        model = model.to(torch.bfloat16)
        completions, logprobs = lean_generate(model, ids, mask, sampling, EOS, PAD)
        _, completion_mask, _ = truncate_after_stop(completions, EOS, PAD)
        expected = training_logprobs(model, ids, mask, completions, completion_mask, 0.7)
    assert logprobs.dtype == torch.float32 and torch.isfinite(logprobs).all()
    real = completion_mask == 1
    assert (logprobs[real] < 0).all() and (logprobs[~real] == 0).all()
    # bf16 rounds differently along the two paths (cache layout, batch shapes): close, not equal
    assert (logprobs - expected.float()).abs().max() < 0.1


def test_runs_the_models_own_lm_head():
    """A swapped head class (rloo.models.loading.use_fp32_lm_head) computes the logits, as in the training forward."""
    from rloo.models.loading import use_fp32_lm_head

    model = use_fp32_lm_head(tiny_model(vocab_size=24))
    dtypes = []
    model.lm_head.register_forward_hook(lambda module, args, output: dtypes.append(output.dtype))
    ids, mask = left_padded_prompts(8, 5, 24)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        completions, _ = lean_generate(model, ids, mask, sampling_config(max_new_tokens=6), EOS, PAD)
    assert len(dtypes) == completions.shape[1] and set(dtypes) == {torch.float32}


def test_a_pass_of_several_chunks_prepares_the_weights_once(monkeypatch):
    """generate_with_logprobs reorders the weights once for all its lean_generate calls; each chunk decodes as it
    would alone."""
    import rloo.generation.decode
    from rloo.generation.rollout import generate_with_logprobs

    model = tiny_model("gpt_neox")
    ids, mask = left_padded_prompts(10, 5, model.config.vocab_size)
    config = sampling_config(max_new_tokens=6, greedy=True, stop_at_eos=False)
    made = []
    prepare = rloo.generation.decode.prepared_weights
    monkeypatch.setattr(rloo.generation.decode, "prepared_weights", lambda *a: made.append(a[1]) or prepare(*a))
    completions, logprobs = generate_with_logprobs(model, ids, mask, config, EOS, PAD, batch_size=4)
    assert made == [4]
    for start in (0, 4, 8):  # chunks of 4, 4 and 2 rows
        alone, alone_logprobs = lean_generate(model, ids[start : start + 4], mask[start : start + 4], config, EOS, PAD)
        assert torch.equal(completions[start : start + 4], alone)
        torch.testing.assert_close(logprobs[start : start + 4], alone_logprobs, atol=1e-6, rtol=0)
    assert len(made) == 4  # each call alone prepares its own


def bf16_products(model):
    """The model with every linear layer's input, weight and output rounded to bfloat16 (a bias-free family, so the
    rounding of a product with its bias never arises): the arithmetic rollout_precision=bf16 samples with, written
    as hooks on the training forward."""
    model = copy.deepcopy(model)
    if model.lm_head.weight is model.get_input_embeddings().weight:  # untied: the embedding stays float32
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                assert module.bias is None
                module.weight.copy_(module.weight.bfloat16().float())
                module.register_forward_pre_hook(lambda m, args: (args[0].bfloat16().float(),))
                module.register_forward_hook(lambda m, args, out: out.bfloat16().float())
    return model


@pytest.mark.parametrize("architecture", ["llama", "qwen3"])
def test_a_bf16_rollout_samples_from_bfloat16_products(architecture):
    """rollout_precision=bf16 (prepared_weights(..., bf16=True)): bfloat16 copies of every linear weight and the head,
    float32 everywhere else. Its log-probs are the training forward's with bfloat16-rounded products (to float32
    accumulation order), and differ from the float32 forward's by the bf16 mismatch, which is what the run measures."""
    from rloo.generation.decode import prepared_weights

    model = tiny_model(architecture, vocab_size=64)
    ids, mask = left_padded_prompts(8, 5, 64)
    weights = prepared_weights(model, len(ids), bf16=True)
    assert weights.body.layers and weights.cache_dtype == torch.float32
    sampling = sampling_config(max_new_tokens=12, temperature=0.7, stop_at_eos=False)
    torch.manual_seed(0)
    completions, logprobs = lean_generate(model, ids, mask, sampling, EOS, PAD, weights=weights)
    completion_mask = torch.ones_like(completions)
    rounded = training_logprobs(bf16_products(model), ids, mask, completions, completion_mask, 0.7)
    exact = training_logprobs(model, ids, mask, completions, completion_mask, 0.7)
    torch.testing.assert_close(logprobs, rounded, atol=2e-4, rtol=0)
    bf16_error, rounding_error = (logprobs - exact).abs().max(), (logprobs - rounded).abs().max()
    assert bf16_error > 1e-2 > 50 * rounding_error  # a mismatch of bf16's size, not float32's


def test_the_eager_float32_loop_attends_through_the_fused_kernel_where_it_has_no_soft_cap(monkeypatch):
    """The eager loop's float32 steps on CPU call the fused kernel (two calls a layer: prompt and own cache), and
    sample what the matmul form samples; Gemma 2's capped scores and bfloat16 keep the matmul form."""
    import rloo.generation.decode as decode

    if decode._FUSED_CPU is None:
        pytest.skip("this torch has no fused CPU attention kernel")
    calls = []
    fused = decode._FUSED_CPU
    monkeypatch.setattr(decode, "_FUSED_CPU", lambda *a, **kw: calls.append(a[0].shape) or fused(*a, **kw))
    model = tiny_model("llama", vocab_size=64)
    ids, mask = left_padded_prompts(8, 5, 64)
    sampling = sampling_config(max_new_tokens=6, temperature=0.7, stop_at_eos=False)
    torch.manual_seed(0)
    completions, logprobs = lean_generate(model, ids, mask, sampling, EOS, PAD)
    assert len(calls) == 2 * model.config.num_hidden_layers * 5  # 5 decode steps after the prefill's draw
    monkeypatch.setattr(decode, "_FUSED_CPU", None)  # the matmul form, as before the kernel
    torch.manual_seed(0)
    matmul_completions, matmul_logprobs = lean_generate(model, ids, mask, sampling, EOS, PAD)
    assert torch.equal(completions, matmul_completions)
    torch.testing.assert_close(logprobs, matmul_logprobs, atol=1e-5, rtol=0)
    q = torch.zeros(2, 4, 1, 16)
    groups = decode._Groups(torch.zeros(2, dtype=torch.long), torch.arange(2), 2, None, 3, True)
    monkeypatch.setattr(decode, "_FUSED_CPU", fused)
    assert decode.fused_attention_applies(q, groups, None)
    assert not decode.fused_attention_applies(q, groups, 50.0)  # Gemma 2's soft cap
    assert not decode.fused_attention_applies(q.bfloat16(), groups, None)
    assert not decode.fused_attention_applies(q, groups._replace(own_bias=torch.zeros(4)), None)  # static steps
