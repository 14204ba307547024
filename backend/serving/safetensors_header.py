"""Sums over a safetensors file's tensors read from its header alone (8-byte length, then JSON): the
serving estimate sizes a run's adapter and a calibrated export's weights without reading a tensor. Torch-free."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Callable


def safetensors_sum(path: Path, measure: Callable[[dict[str, Any]], int], fix: str) -> int:
    """`measure` summed over a safetensors file's tensors, read from its header (8-byte length, then JSON):
    no tensor is read. A one-line ValueError ending in `fix` when the file cannot be read so."""
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
        return sum(measure(entry) for name, entry in header.items() if name != "__metadata__")
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error):
        raise ValueError(f"{path}: not a readable safetensors file; {fix}") from None
