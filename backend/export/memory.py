"""Peak resident memory of the export's stages, and handing freed memory back between them.

The export holds one model at a time (the trained model while it is measured, then nothing while
the files are written, then the export while it is checked), so what matters is each stage's own
peak. Linux keeps the process's high-water mark in /proc/self/status (VmHWM) and resets it when
"5" is written to /proc/self/clear_refs; elsewhere the figures are None. `release` runs the
garbage collector and asks glibc to return freed heap pages, which it otherwise keeps, so one
stage's model does not stay resident under the next.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import re
import sys
from pathlib import Path

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def peak_rss_bytes() -> int | None:
    """The process's resident high-water mark since start or the last `reset_peak`."""
    try:
        match = re.search(r"VmHWM:\s+(\d+)\s+kB", STATUS.read_text())
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def rss_bytes() -> int | None:
    try:
        match = re.search(r"VmRSS:\s+(\d+)\s+kB", STATUS.read_text())
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def reset_peak() -> bool:
    try:
        CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return True


def release() -> None:
    gc.collect()
    if "torch" in sys.modules:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


class StagePeaks:
    """Peak RSS per named stage: `start(name)` resets the mark, `stop()` records it (call `release` first
    where the previous stage freed a model)."""

    def __init__(self) -> None:
        self.peaks: dict[str, int | None] = {}
        self._current: str | None = None

    def start(self, name: str) -> None:
        self.stop()
        self._current = name if reset_peak() else None

    def stop(self) -> None:
        if self._current is not None:
            self.peaks[self._current] = peak_rss_bytes()
            self._current = None
