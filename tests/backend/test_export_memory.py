"""The export's stage peaks: VmHWM counts a mapped file's pages, the anonymous peak only what the
process itself allocates (the GGUF check maps its file while transformers reads it)."""

from __future__ import annotations

import mmap
import sys
import time

import pytest

from backend.export.memory import StagePeaks, anonymous_bytes, peak_rss_bytes

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux's")

MB = 1 << 20


def test_a_mapped_file_counts_in_the_peak_rss_and_not_in_the_anonymous_peak(tmp_path):
    path = tmp_path / "blob"
    path.write_bytes(b"\1" * (96 * MB))
    peaks = StagePeaks()
    with peaks:
        peaks.start("mapped")
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            assert sum(view[i] for i in range(0, len(view), 4096)) == len(view) // 4096  # every page touched
        peaks.start("allocated")
        held = bytearray(b"\1" * (96 * MB))
        time.sleep(3 * StagePeaks.INTERVAL_S)
        del held
    mapped = peaks.peaks["mapped"] - peaks.anonymous["mapped"]
    assert mapped > 80 * MB  # the file's pages are resident, but not the process's own memory
    assert peaks.anonymous["allocated"] - peaks.anonymous["mapped"] > 80 * MB
    assert peaks._sampler is not None and not peaks._sampler.is_alive()  # leaving the block stops sampling


def test_the_readers_give_figures_here():
    assert anonymous_bytes() > 0 and peak_rss_bytes() >= anonymous_bytes()
