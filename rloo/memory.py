"""Memory of this process, for run summaries and benchmarks (Linux /proc, with fallbacks)."""

from __future__ import annotations

import resource
import sys


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def current_rss_mb() -> float:
    """Resident memory now, MiB (from /proc; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * resource.getpagesize() / (1024 * 1024)
    except OSError:
        return peak_rss_mb()
