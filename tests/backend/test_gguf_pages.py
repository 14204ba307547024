"""The GGUF check's reader hands each tensor's mapped pages back once read (backend/export/gguf_pages.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from backend.export.gguf_pages import released_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads RssFile from /proc")

TENSORS, SIZE = 6, 4 * 1024 * 1024  # six 16 MiB float32 tensors


def rss_file_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory) -> Path:
    import gguf

    path = tmp_path_factory.mktemp("pages") / "big.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for i in range(TENSORS):
        writer.add_tensor(f"t{i}", np.full(SIZE, i, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def read_all(path: Path) -> tuple[list[np.ndarray], int]:
    """Every tensor copied out as transformers' loader does, and the mapped pages still resident after."""
    import gguf

    reader = gguf.GGUFReader(path)
    before = rss_file_bytes()
    copies = [np.copy(tensor.data) for tensor in reader.tensors]
    return copies, rss_file_bytes() - before


def test_pages_are_released_and_the_values_are_unchanged(gguf_file):
    plain, kept_plain = read_all(gguf_file)
    with released_pages():
        released, kept_released = read_all(gguf_file)
    total = TENSORS * SIZE * 4
    assert kept_plain > 0.8 * total  # without it the whole file stays mapped in the process
    assert kept_released < 0.2 * total
    assert all(np.array_equal(a, b) for a, b in zip(plain, released))
    assert [float(c[0]) for c in released] == [float(i) for i in range(TENSORS)]


def test_the_reader_is_restored_after(gguf_file):
    import gguf

    original = gguf.GGUFReader
    with released_pages():
        assert gguf.GGUFReader is not original
    assert gguf.GGUFReader is original
