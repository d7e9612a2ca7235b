"""rloo.utils.memory: the peak a run reports is its own, also where a sweep's runs share one process."""

import sys

import pytest

from rloo.utils.memory import current_rss_mb, peak_rss_mb, reset_peak_rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs is Linux's")
def test_the_peak_starts_over_from_what_is_resident_now():
    """After a reset the peak is what is resident now, whatever this process (pytest, earlier tests) peaked at."""
    import mmap

    assert reset_peak_rss()
    start = current_rss_mb()
    assert peak_rss_mb() == pytest.approx(start, abs=2)
    block = mmap.mmap(-1, 256 * 2**20)  # 256 MiB of fresh pages (not the heap, which may hold resident free memory)
    block[:: mmap.PAGESIZE] = b"\x01" * (len(block) // mmap.PAGESIZE)  # touched: resident
    high = peak_rss_mb()
    assert high >= current_rss_mb() >= start + 200
    block.close()  # unmapped: no longer resident
    assert peak_rss_mb() >= high - 1  # the peak remembers it
    assert reset_peak_rss()
    assert peak_rss_mb() < high - 200 and peak_rss_mb() == pytest.approx(current_rss_mb(), abs=2)
