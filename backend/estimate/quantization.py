"""bitsandbytes storage: NF4 weights (QLoRA) and 8-bit Adam's block constants."""

from __future__ import annotations

import math

NF4_BLOCK = 64
"""NF4 block size for weights (QLoRA paper, Dettmers et al. 2023): one absmax per 64 weights."""
NF4_DQ_BLOCK = 256
"""Double quantization: the absmaxes are quantized to 8 bits in blocks of 256, one fp32 each."""
ADAM8_BLOCK = 256
"""bitsandbytes 8-bit Adam: block-wise quantization with one fp32 absmax per 256 values per state."""
ADAM8_MIN_SIZE = 4096
"""bitsandbytes keeps 32-bit state for tensors with fewer elements than this (min_8bit_size)."""


def nf4_bytes(numel: int, double_quant: bool = True) -> dict[str, int]:
    """Bytes of one NF4 tensor in bitsandbytes: packed 4-bit data and its quantization constants.

    Data: two weights per byte. Constants: one absmax per 64 weights, fp32 (0.5 bit/weight), or
    with double quantization 8-bit absmaxes plus one fp32 per 256 of them (8/64 + 32/(64*256) =
    0.127 bit/weight, the QLoRA paper's figure), plus the 16-value NF4 code (and the 256-value
    code of the second level).
    """
    blocks = math.ceil(numel / NF4_BLOCK)
    data = math.ceil(numel / 2)
    if double_quant:
        blocks2 = math.ceil(blocks / NF4_DQ_BLOCK)
        constants = blocks + 4 * blocks2 + 4 + 256 * 4 + 16 * 4
    else:
        constants = 4 * blocks + 16 * 4
    return {"data": data, "constants": constants}
