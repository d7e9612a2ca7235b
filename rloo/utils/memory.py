"""Memory of this process, for run summaries and benchmarks (Linux /proc, with fallbacks)."""

from __future__ import annotations

import resource
import sys


def peak_rss_mb() -> float:
    """Peak resident memory of this process since it started or since `reset_peak_rss`, MiB. Linux: VmHWM of
    /proc/self/status (KiB); elsewhere getrusage's peak over the process's life (macOS reports bytes)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def reset_peak_rss() -> bool:
    """Start the peak over from the memory resident now (Linux: 5 to /proc/self/clear_refs), so that runs sharing
    a process (Hydra's basic launcher) each report their own peak. False where the system cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def current_rss_mb() -> float:
    """Resident memory now, MiB (from /proc; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * resource.getpagesize() / (1024 * 1024)
    except OSError:
        return peak_rss_mb()


def free_bytes(device, processes_here: int = 1) -> int:
    """Memory free for one process on `device`: a GPU's free memory, or on CPU the host's MemAvailable shared among
    the `processes_here` processes of this run on the host (0 where the system does not say)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 // max(processes_here, 1)
    except (OSError, ValueError, IndexError):
        pass
    return 0
