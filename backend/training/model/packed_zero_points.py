"""Loading asymmetric pack-quantized folders (awq-int4's W4A16_ASYM) with transformers 5.25 + compressed-tensors 0.20.1.

transformers builds the empty model on the meta device and asks compressed-tensors to compress it, so that
its parameters take the file's shapes. For a meta weight, PackedQuantizationCompressor.compress gives
weight_packed its packed shape but leaves weight_zero_point unpacked (rows, groups), while the file holds it
packed eight to an int32 along the rows, as compress does for real weights and vLLM reads it: the load stops
with a size mismatch ("ckpt: torch.Size([32, 4]) vs model: torch.Size([256, 4])"), whoever wrote the file
(llmcompressor's asymmetric AWQ too). compressed-tensors' main branch still has it (2026-08). `allow()` makes
the meta branch give the packed shape too; decompression already unpacks it. Call it before from_pretrained.
"""

from __future__ import annotations

import math
from typing import Any


def allow() -> None:
    """Patch PackedQuantizationCompressor.compress once per process (a no-op after the first call)."""
    from compressed_tensors.compressors.pack_quantized import base

    compressor = base.PackedQuantizationCompressor
    if getattr(compressor.compress, "packs_meta_zero_points", False):
        return
    original = compressor.compress.__func__

    def compress(cls: Any, state_dict: Any, scheme: Any) -> Any:
        out = original(cls, state_dict, scheme)
        zero, weights = out.get("weight_zero_point"), scheme.weights
        if (zero is not None and zero.device.type == "meta" and zero.dtype != packed_dtype()
                and not weights.symmetric and weights.strategy in base.PACK_ZP_STRATS):
            rows = math.ceil(zero.shape[0] * weights.num_bits / 32)
            out["weight_zero_point"] = zero.new_empty((rows, *zero.shape[1:]), dtype=packed_dtype())
        return out

    compress.packs_meta_zero_points = True  # type: ignore[attr-defined]
    compressor.compress = classmethod(compress)


def packed_dtype() -> Any:
    import torch

    return torch.int32
