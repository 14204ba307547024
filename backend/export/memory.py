"""Peak resident memory of the export's stages, and handing freed memory back between them.

The export holds one model at a time (the trained model while it is measured, then nothing while
the files are written, then the export while it is checked), so what matters is each stage's own
peak. Linux keeps the process's high-water mark in /proc/self/status (VmHWM) and resets it when
"5" is written to /proc/self/clear_refs; elsewhere the figures are None. `release` runs the
garbage collector and asks glibc to return freed heap pages, which it otherwise keeps, so one
stage's model does not stay resident under the next.

VmHWM counts the pages of files the process maps: transformers maps a GGUF file while it reads it,
so a check's VmHWM holds the file beside the model it builds. Those pages are clean page cache the
kernel takes back under pressure, so each stage also records its peak anonymous memory (RssAnon,
sampled every 20 ms): what the process itself holds, and what runs a machine out of memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import re
import sys
import threading
from pathlib import Path

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_bytes(field: str) -> int | None:
    try:
        match = re.search(field + r":\s+(\d+)\s+kB", STATUS.read_text())
    except OSError:
        return None
    return int(match.group(1)) * 1024 if match else None


def peak_rss_bytes() -> int | None:
    """The process's resident high-water mark since start or the last `reset_peak`."""
    return _status_bytes("VmHWM")


def rss_bytes() -> int | None:
    return _status_bytes("VmRSS")


def anonymous_bytes() -> int | None:
    """Resident memory that is the process's own (heap, tensors), not pages of mapped files."""
    return _status_bytes("RssAnon")


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
    trim_heap()


def trim_heap() -> None:
    """Ask glibc to return the free pages of its heap: tensors below its mmap threshold (which grows to
    32 MiB as large blocks are freed) come from the heap, which otherwise keeps them once freed."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)


class StagePeaks:
    """Peak RSS and peak anonymous memory per named stage: `start(name)` resets the mark, `stop()`
    records it (call `release` first where the previous stage freed a model)."""

    INTERVAL_S = 0.02

    def __init__(self) -> None:
        self.peaks: dict[str, int | None] = {}
        self.anonymous: dict[str, int | None] = {}
        self._current: str | None = None
        self._done = threading.Event()
        self._sampler: threading.Thread | None = None
        self._anonymous = 0

    def __enter__(self) -> StagePeaks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, name: str) -> None:
        self.stop()
        self._current = name if reset_peak() else None
        if self._current is None:
            return
        self._anonymous = anonymous_bytes() or 0
        self._done = threading.Event()
        self._sampler = threading.Thread(target=self._sample, args=(self._done,), name="export-memory", daemon=True)
        self._sampler.start()

    def _sample(self, done: threading.Event) -> None:
        while not done.wait(self.INTERVAL_S):
            self._anonymous = max(self._anonymous, anonymous_bytes() or 0)

    def stop(self) -> None:
        if self._current is None:
            return
        self._done.set()
        if self._sampler is not None:
            self._sampler.join()
        self.anonymous[self._current] = max(self._anonymous, anonymous_bytes() or 0) or None
        self.peaks[self._current] = peak_rss_bytes()
        self._current = None
