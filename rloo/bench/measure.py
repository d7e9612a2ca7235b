"""What the benchmark measures, shared by our worker and the peer workers: memory, medians, model-state bytes, and
the host's memory read rate (`torch.sum` over a buffer beyond any cache), measured in the process it sits beside."""

from __future__ import annotations

import statistics
import time

import torch

from rloo.utils.memory import current_rss_mb, peak_rss_mb  # noqa: F401  (the workers read them from here)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def model_state_mb(models: list[torch.nn.Module], optimizer: torch.optim.Optimizer | None) -> dict[str, float]:
    """MiB held by parameters (every model, frozen ones too), by gradients and by optimiser state.

    Gradients are counted as one per trainable parameter, as at the optimiser step (they are freed after it).
    """
    seen, params = set(), []
    for model in models:
        for p in model.parameters():
            if id(p) not in seen:  # tied or shared tensors count once
                seen.add(id(p))
                params.append(p)
    state = []
    if optimizer is not None:
        for per_param in optimizer.state.values():
            state += [v for v in per_param.values() if torch.is_tensor(v)]
    mib = 1024 * 1024
    out = {
        "parameters": tensor_bytes(params) / mib,
        "gradients": tensor_bytes(p for p in params if p.requires_grad) / mib,
        "optimizer": tensor_bytes(state) / mib,
    }
    out["total"] = sum(out.values())
    return out


SUM_BYTES = 256 * 2**20  # torch.sum reads at least this much: memory, not a cache


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds(fn, device: torch.device) -> float:
    _sync(device)
    started = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - started


def sum_read_rate(nbytes: int, device: torch.device, dtype: torch.dtype, repeats: int = 5) -> float:
    """Bytes per second `torch.sum` reads from a buffer of `nbytes` (median of `repeats`, after one warm-up)."""
    buffer = torch.ones(nbytes // torch.finfo(dtype).bits * 8, dtype=dtype, device=device)
    buffer.sum()
    times = [seconds(buffer.sum, device) for _ in range(repeats)]
    return buffer.numel() * buffer.element_size() / statistics.median(times)
