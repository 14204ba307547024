"""Keeps transformers' GGUF reader from holding the whole mapped file resident while it reads it back.

transformers' loader maps the file (gguf's `GGUFReader`) and copies every tensor into the model; the
pages it has read stay in the process's RSS until the reader is gone, so the check's peak was the
16-bit model *plus* the file (2.4x the model's 16-bit size for F16). Inside `released_pages()` the
reader hands each tensor's pages back to the kernel (madvise DONTNEED on the read-only mapping) once
the loop has moved on to the next tensor. What is read, and how, is untouched: a page touched again
is simply read again from the page cache.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

PAGE = mmap.PAGESIZE


def release(data: Any, offset: int, n_bytes: int) -> None:
    """Drop one tensor's pages of the reader's memmap from this process's resident set."""
    mapping = getattr(data, "_mmap", None)
    if mapping is None or not hasattr(mapping, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = offset // PAGE * PAGE
    end = min(len(mapping), -(-(offset + n_bytes) // PAGE) * PAGE)
    if end > start:
        mapping.madvise(mmap.MADV_DONTNEED, start, end - start)


class _ReleasingTensors(list):
    """The reader's tensor list; iterating it releases each tensor after the loop body is done with it."""

    def __init__(self, tensors: list, data: Any) -> None:
        super().__init__(tensors)
        self._data = data

    def __iter__(self) -> Iterator[Any]:
        for tensor in list.__iter__(self):
            yield tensor
            release(self._data, int(tensor.data_offset), int(tensor.n_bytes))


@contextmanager
def released_pages() -> Iterator[None]:
    """While open, every `gguf.GGUFReader` made (transformers imports it by name at each load) releases pages."""
    import gguf

    original = gguf.GGUFReader

    class ReleasingReader(original):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.tensors = _ReleasingTensors(self.tensors, self.data)

    gguf.GGUFReader = ReleasingReader
    try:
        yield
    finally:
        gguf.GGUFReader = original
