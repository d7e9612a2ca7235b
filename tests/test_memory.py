"""rloo.memory: the peak a run reports is its own, also where a sweep's runs share one process."""

import sys

import pytest

from rloo.memory import current_rss_mb, peak_rss_mb, reset_peak_rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs is Linux's")
def test_the_peak_starts_over_from_what_is_resident_now():
    """After a reset the peak is what is resident now, whatever this process (pytest, earlier tests) peaked at."""
    assert reset_peak_rss()
    start = current_rss_mb()
    assert peak_rss_mb() == pytest.approx(start, abs=2)
    block = bytearray(256 * 2**20)  # 256 MiB, touched: resident
    block[::4096] = b"\x01" * len(block[::4096])
    high = peak_rss_mb()
    assert high >= current_rss_mb() >= start + 200
    del block
    assert peak_rss_mb() >= high - 1  # the peak remembers it
    assert reset_peak_rss()
    assert peak_rss_mb() == pytest.approx(current_rss_mb(), abs=2)  # and starts over (how much glibc gave back aside)
