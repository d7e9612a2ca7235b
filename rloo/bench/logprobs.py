"""python -m rloo.bench logprobs: peak memory and time of the log-prob pass, whole `[R, V]` logits against the chunked
head of rloo.generation.rollout, at a Pythia-sized vocabulary. Each variant runs in a fresh interpreter; memory is the
peak
resident size above what the process held once the head and hidden states were made.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

VOCAB, HIDDEN, ROWS = 50304, 512, 2048  # Pythia's padded vocabulary; 2048 completion tokens (e.g. 32 x 64)


def measure(variant: str, grad: bool) -> dict:
    """In this process: one log-prob (and entropy) pass of `variant` (whole | chunked), with a backward if `grad`."""
    import torch

    from rloo.generation.forward import chunked_logprobs_and_entropy
    from rloo.models.loading import FP32Head
    from rloo.objectives import entropy_from_logits, token_logprobs
    from rloo.utils.memory import current_rss_mb, peak_rss_mb

    torch.set_num_threads(2)
    torch.manual_seed(0)
    head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
    head.__class__ = FP32Head
    hidden = torch.randn(ROWS, HIDDEN, requires_grad=grad)
    ids = torch.randint(0, VOCAB, (ROWS,))
    baseline = current_rss_mb()
    started = time.perf_counter()
    with torch.set_grad_enabled(grad):
        if variant == "whole":
            logits = head(hidden)
            logprobs = token_logprobs(logits, ids)
            with torch.no_grad():
                entropy_from_logits(logits)
        else:
            logprobs, _ = chunked_logprobs_and_entropy(head, hidden, ids, 1.0)
        if grad:
            logprobs.sum().backward()
    return {
        "variant": variant,
        "grad": grad,
        "seconds": time.perf_counter() - started,
        "peak_above_baseline_mb": peak_rss_mb() - baseline,
    }


def run(out_dir) -> list[dict]:
    """Every variant, each in its own interpreter; writes logprobs.json and logprobs.md to `out_dir`."""
    from pathlib import Path

    results = []
    for grad in (False, True):
        for variant in ("whole", "chunked"):
            code = (
                f"import json; from rloo.bench.logprobs import measure; print(json.dumps(measure({variant!r}, {grad})))"
            )
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    lines = [
        f"Log-prob pass, {ROWS} tokens, vocabulary {VOCAB}, hidden {HIDDEN}, float32 head (whole logits "
        f"{ROWS * VOCAB * 4 / 2**20:.0f} MiB):",
        "",
        "| pass | whole: peak MiB | chunked: peak MiB | peak ratio | whole s | chunked s |",
        "|---|---|---|---|---|---|",
    ]
    for grad in (False, True):
        whole, chunked = (
            next(r for r in results if r["grad"] == grad and r["variant"] == v) for v in ("whole", "chunked")
        )
        lines.append(
            f"| {'log-probs + backward' if grad else 'log-probs (no grad)'} | {whole['peak_above_baseline_mb']:.0f} | "
            f"{chunked['peak_above_baseline_mb']:.0f} | "
            f"{whole['peak_above_baseline_mb'] / max(chunked['peak_above_baseline_mb'], 1):.1f}x | "
            f"{whole['seconds']:.2f} | {chunked['seconds']:.2f} |"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "logprobs.json").write_text(json.dumps(results, indent=2))
    (out / "logprobs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return results
