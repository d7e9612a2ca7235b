"""rloo.memory: the peak a run reports is its own, also where a sweep's runs share one process."""

import sys

import pytest

from rloo.memory import current_rss_mb, peak_rss_mb, reset_peak_rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/clear_refs is Linux's")
def test_the_peak_starts_over_from_what_is_resident_now():
    assert reset_peak_rss()  # from here: earlier tests in this process may have peaked higher than the block
    block = bytearray(256 * 2**20)  # 256 MiB, touched: resident
    block[::4096] = b"\x01" * len(block[::4096])
    high = peak_rss_mb()
    assert high >= current_rss_mb() > 200
    del block  # glibc returns a block this large to the system at once
    assert peak_rss_mb() == pytest.approx(high, abs=1)  # the peak remembers it
    assert reset_peak_rss()
    assert peak_rss_mb() < high - 200 and peak_rss_mb() >= current_rss_mb() - 1
