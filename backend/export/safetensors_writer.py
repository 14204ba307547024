"""Safetensors shards written one tensor at a time from a TensorSource.

`safetensors.torch.save_file` needs every tensor of a file in memory at once. The format itself
does not: an 8-byte header length, a JSON header giving each tensor's dtype, shape and byte range,
then the bytes in that order. Shapes and dtypes are known before any tensor is computed, so the
header is written first and each tensor is appended as the source produces it and dropped. Shards
follow transformers' layout (`model.safetensors`, or `model-0000i-of-0000N.safetensors` with a
`model.safetensors.index.json` when the model is larger than one shard) and load with
`from_pretrained` and with `safetensors.safe_open`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import torch

from backend.export.tensor_source import TensorSource

DTYPE_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32", torch.float64: "F64",
               torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
               torch.bool: "BOOL"}
MAX_SHARD_BYTES = 5 * 1024**3  # the Hub's usual shard size; a single tensor larger than this gets its own shard
INDEX = "model.safetensors.index.json"


def plan_shards(entries: list[tuple[str, torch.dtype, tuple[int, ...]]], max_bytes: int) -> list[list[tuple]]:
    """Group (name, dtype, shape) into shards of at most max_bytes, in order."""
    shards: list[list[tuple]] = [[]]
    size = 0
    for name, dtype, shape in entries:
        nbytes = _nbytes(dtype, shape)
        if shards[-1] and size + nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, dtype, shape))
        size += nbytes
    return shards


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * dtype.itemsize


def _header(shard: list[tuple]) -> bytes:
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in shard:
        end = offset + _nbytes(dtype, shape)
        header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as safetensors itself pads
    return len(raw).to_bytes(8, "little") + raw


def write_safetensors(source: TensorSource, folder: Path, *, max_shard_bytes: int = MAX_SHARD_BYTES,
                      progress: Callable[[int, int], None] | None = None,
                      should_stop: Callable[[], bool] | None = None) -> list[Path]:
    """Write every tensor of `source` into safetensors shards in `folder`; returns the files written."""
    dtype_of = getattr(source, "dtype_of", None)
    entries = []
    for name in source.names():
        dtype = dtype_of(name) if dtype_of else source.get(name).dtype
        entries.append((name, dtype, tuple(source.shape(name))))
    # Widest dtype first keeps every tensor aligned to its element size, as safetensors orders them.
    entries.sort(key=lambda e: -e[1].itemsize)
    shards = plan_shards(entries, max_shard_bytes)
    count = len(shards)
    names = ["model.safetensors"] if count == 1 else [f"model-{i:05d}-of-{count:05d}.safetensors"
                                                      for i in range(1, count + 1)]
    done, total, written = 0, len(entries), []
    for file_name, shard in zip(names, shards):
        path = Path(folder) / file_name
        with open(path, "wb") as out:
            out.write(_header(shard))
            written.append(path)
            for name, dtype, shape in shard:
                if should_stop and should_stop():
                    raise InterruptedError("stop requested")
                tensor = source.get(name)
                if tensor.dtype != dtype or tuple(tensor.shape) != shape:
                    raise RuntimeError(f"{name}: the source gave {tensor.dtype} {list(tensor.shape)}, "
                                       f"planned {dtype} {list(shape)}")
                data = tensor.contiguous().view(-1).view(torch.uint8) if tensor.numel() else tensor.view(torch.uint8)
                out.write(memoryview(data.numpy()))
                del tensor, data
                done += 1
                if progress:
                    progress(done, total)
            out.flush()
            os.fsync(out.fileno())
    if count > 1:
        weight_map = {name: file_name for file_name, shard in zip(names, shards) for name, _, _ in shard}
        index = {"metadata": {"total_size": sum(_nbytes(d, s) for _, d, s in entries)}, "weight_map": weight_map}
        (Path(folder) / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return written
