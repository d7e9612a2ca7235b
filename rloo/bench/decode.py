"""python -m rloo.bench decode: how close the lean decode (rloo/generation/decode.py) reads at the machine's memory
limit, and
where its time goes.

At a preset's shape (default `long-160m`: Pythia-160m, 2 prompts x k = 4 = 8 rows, 64-token prompts), random
weights, float32 on CPU and bfloat16 on a GPU, every row running to its last token:

- ms per generated token: a decode of T tokens minus one of 1 token (the prefill and the first draw), over T - 1;
- the bytes one decode step reads: every weight it reads (the linear layers, the LM head, the norms; the embedding
  only for the rows' tokens) and the KV cache at the mean completion length (each prompt's keys and values once for
  its k rows, each row's own completion so far);
- the read rate that implies, beside `torch.sum`'s over a buffer as large as the weights (at least 256 MiB, beyond
  any cache), measured before and after each decode: each decode's rate over the mean of its two sums is one
  **bandwidth fraction** (the median and range of those are reported; on a shared machine both rates drift, and
  pairing keeps the ratio). The bytes over the sum's median rate are the **read floor**, the time a step could not
  go below;
- on CPU a per-op profile (torch.profiler) of one decode in four parts: the linear products, attention over the
  cache, sampling, and everything else (the small ops of each layer and the Python between them);
- where CUDA graphs serve (`rloo.generation.static_decode`: the model on a GPU), the graph loop's ms per token beside
  the eager loop's, its captures included (each call captures its buckets' steps, as a rollout's call does).

Writes decode.json and decode.md. Plain torch + transformers.
"""

from __future__ import annotations

import statistics
import time
from contextlib import contextmanager

import torch

from rloo.bench.measure import SUM_BYTES, seconds, sum_read_rate

LINEAR_OPS = ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm", "aten::linear")


def step_bytes(
    model, num_prompts: int, rows: int, prompt_length: int, new_tokens: int, bf16_weights: bool = False
) -> dict[str, float]:
    """Bytes one decode step reads, on average over a decode of `new_tokens`: weights and KV cache. bf16_weights:
    every linear layer's weight matrix (the LM head's too) read from a bfloat16 copy, 2 bytes an element."""
    from rloo.families import architecture_from_config

    embedding = model.get_input_embeddings().weight
    params = {id(p): p for p in model.parameters()}  # a tied head counts once
    halved = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Linear)} if bf16_weights else set()
    weights = sum(p.numel() * (2 if id(p) in halved else p.element_size()) for p in params.values())
    if not any(p is embedding for p in (model.get_output_embeddings().weight,)):
        weights -= embedding.numel() * embedding.element_size()  # the untied embedding: a row per token only
    arch = architecture_from_config(model.config.to_dict())
    per_token_kv = arch.num_layers * arch.kv_width * embedding.element_size()
    # a step at completion position s attends to the prompt (read once per group) and s + 1 own tokens
    mean_own = sum(s + 1 for s in range(new_tokens - 1)) / max(new_tokens - 1, 1)
    kv = per_token_kv * (num_prompts * prompt_length + rows * mean_own)
    return {"weights": float(weights), "kv_cache": float(kv), "total": float(weights + kv)}


@contextmanager
def _labelled():
    """Label attention and sampling in the profile (record_function around rloo.generation.decode's two hooks)."""
    from rloo.generation import decode

    originals = decode._decode_attend, decode.sample_tokens

    def attend(*args, **kwargs):
        with torch.profiler.record_function("rloo.attention"):
            return originals[0](*args, **kwargs)

    def sample(*args, **kwargs):
        with torch.profiler.record_function("rloo.generation.sampling"):
            return originals[1](*args, **kwargs)

    decode._decode_attend, decode.sample_tokens = attend, sample
    try:
        yield
    finally:
        decode._decode_attend, decode.sample_tokens = originals


def op_profile(run, steps: int) -> dict:
    """ms per decode step in four parts, from torch.profiler over one decode of `steps` + 1 tokens (`run`):
    linear products (self time of the product ops), attention and sampling (their labels' total), the rest
    (the profiled wall time less those three), and the ten ops with the most self time."""
    from torch.profiler import ProfilerActivity, profile

    with _labelled(), profile(activities=[ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        run()
        wall = time.perf_counter() - started
    averages = prof.key_averages()
    linear = sum(e.self_cpu_time_total for e in averages if e.key in LINEAR_OPS) / 1e3
    attention = sum(e.cpu_time_total for e in averages if e.key == "rloo.attention") / 1e3
    sampling = sum(e.cpu_time_total for e in averages if e.key == "rloo.generation.sampling") / 1e3
    parts = {"linear products": linear, "attention over the cache": attention, "sampling": sampling}
    parts["small ops and Python"] = wall * 1e3 - sum(parts.values())
    top = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    return {
        "profiled_ms_per_step": wall * 1e3 / steps,
        "parts_ms_per_step": {name: ms / steps for name, ms in parts.items()},
        "top_ops": [
            {"op": e.key, "ms_per_step": e.self_cpu_time_total / 1e3 / steps, "calls_per_step": e.count / steps}
            for e in top
        ],
    }


def measure(
    preset_name: str = "long-160m",
    device: str = "cpu",
    threads: int = 2,
    repeats: int = 3,
    profile: bool = True,
    bf16_weights: bool = False,
) -> dict:
    """The decode's ms per token, bytes per step, read rate against torch.sum's, and (CPU) the op profile.
    bf16_weights: the linear products from bfloat16 copies (rollout_precision=bf16), their bytes counted as such."""
    from transformers import AutoModelForCausalLM

    from rloo.bench.presets import get_preset, model_config, random_prompts
    from rloo.generation.decode import prepared_weights
    from rloo.generation.lean_sampler import lean_generate
    from rloo.generation.settings import SamplingConfig
    from rloo.generation.static_decode import static_generate, why_not_graph

    torch.set_num_threads(threads)
    preset = get_preset(preset_name)
    where = torch.device(device)
    dtype = torch.float32 if where.type == "cpu" else torch.bfloat16
    new_tokens = preset.response_length
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(model_config(preset)).to(where, dtype).eval()
    prompts = random_prompts(preset, preset.prompts_per_step).repeat_interleave(preset.k, 0).to(where)
    mask = torch.ones_like(prompts)
    rows = len(prompts)

    def sampling(tokens: int, graph: bool = False) -> SamplingConfig:  # every row runs to its last token
        return SamplingConfig(tokens, 1.0, 0, 1.0, False, False, True, "inverse_cdf", graph)

    weights = prepared_weights(model, rows, bf16=bf16_weights)

    def decode(tokens: int, graph: bool = False):  # graph=False: the eager loop, wherever it runs
        sample = static_generate if graph else lean_generate
        return lambda: sample(model, prompts, mask, sampling(tokens, graph), 0, 1, weights=weights)

    nbytes = step_bytes(model, preset.prompts_per_step, rows, preset.prompt_length, new_tokens, bf16_weights)
    decode(new_tokens)()  # warm-up: first-call allocations, oneDNN's kernels
    full, first, sums = [], [], []
    for _ in range(repeats):  # each decode between two sums: the pair's ratio, as the machine's speed drifts
        sums.append(sum_read_rate(max(int(nbytes["weights"]), SUM_BYTES), where, dtype))
        first.append(seconds(decode(1), where))
        full.append(seconds(decode(new_tokens), where))
    sums.append(sum_read_rate(max(int(nbytes["weights"]), SUM_BYTES), where, dtype))
    per_token = (statistics.median(full) - statistics.median(first)) / (new_tokens - 1)
    sum_rate = statistics.median(sums)
    fractions = [  # each decode's read rate over the mean of the sums either side of it
        nbytes["total"] * (new_tokens - 1) / (seconds - statistics.median(first)) / ((before + after) / 2)
        for seconds, before, after in zip(full, sums, sums[1:])
    ]
    result = {
        "preset": preset_name,
        "device": device,
        "dtype": str(dtype).removeprefix("torch."),
        "linear_weights": "bfloat16 copies" if bf16_weights else str(dtype).removeprefix("torch."),
        "rows": rows,
        "prompts": preset.prompts_per_step,
        "prompt_length": preset.prompt_length,
        "new_tokens": new_tokens,
        "threads": threads,
        "ms_per_token": per_token * 1e3,
        "bytes_per_step": nbytes,
        "read_gb_per_s": nbytes["total"] / per_token / 1e9,
        "sum_gb_per_s": sum_rate / 1e9,
        "sum_gb_per_s_range": [min(sums) / 1e9, max(sums) / 1e9],
        "bandwidth_fraction": statistics.median(fractions),
        "bandwidth_fraction_range": [min(fractions), max(fractions)],
        "read_floor_ms": nbytes["total"] / sum_rate * 1e3,
    }
    if why := why_not_graph(model):
        result["graph"] = {"used": False, "why_not": why}
    else:
        decode(new_tokens, graph=True)()
        graph_full = statistics.median(seconds(decode(new_tokens, graph=True), where) for _ in range(repeats))
        graph_first = statistics.median(seconds(decode(1, graph=True), where) for _ in range(repeats))
        result["graph"] = {"used": True, "ms_per_token": (graph_full - graph_first) / (new_tokens - 1) * 1e3}
    if profile and where.type == "cpu":
        result["profile"] = op_profile(decode(new_tokens), new_tokens - 1)
    return result


def markdown(result: dict) -> str:
    nbytes = result["bytes_per_step"]
    (low_sum, high_sum), (low, high) = result["sum_gb_per_s_range"], result["bandwidth_fraction_range"]
    lines = [
        f"Decode at `{result['preset']}`: {result['rows']} rows ({result['prompts']} prompts), "
        f"{result['prompt_length']}-token prompts, {result['new_tokens']} new tokens, {result['dtype']} on "
        f"{result['device']}, {result['threads']} threads",
        "",
        "| ms/token | MB read per step (weights + KV) | read GB/s | torch.sum GB/s (range) | bandwidth fraction "
        "(range) | read floor ms |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {result['ms_per_token']:.2f} | {nbytes['total'] / 1e6:.0f} ({nbytes['weights'] / 1e6:.0f} + "
        f"{nbytes['kv_cache'] / 1e6:.0f}) | {result['read_gb_per_s']:.1f} | {result['sum_gb_per_s']:.1f} "
        f"({low_sum:.1f}-{high_sum:.1f}) | {result['bandwidth_fraction']:.2f} ({low:.2f}-{high:.2f}) "
        f"| {result['read_floor_ms']:.2f} |",
    ]
    graph = result["graph"]
    lines += [
        "",
        f"Graph step: {graph['ms_per_token']:.2f} ms/token"
        if graph["used"]
        else f"Graph step: not used ({graph['why_not']})",
    ]
    if profile := result.get("profile"):
        lines += ["", f"Per-op profile, ms per step (profiled: {profile['profiled_ms_per_step']:.2f} ms a step):", ""]
        lines += ["| part | ms/step | share |", "|---|---:|---:|"]
        total = profile["profiled_ms_per_step"]
        for name, ms in profile["parts_ms_per_step"].items():
            lines.append(f"| {name} | {ms:.2f} | {ms / total:.0%} |")
        lines += ["", "| op (self time) | ms/step | calls/step |", "|---|---:|---:|"]
        lines += [f"| {op['op']} | {op['ms_per_step']:.2f} | {op['calls_per_step']:.0f} |" for op in profile["top_ops"]]
    return "\n".join(lines) + "\n"
