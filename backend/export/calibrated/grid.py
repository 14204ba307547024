"""The integer grid the file stores, from compressed-tensors' own arguments and helpers, so that what the
algorithms round to is exactly what its compressor packs and vLLM and transformers unpack."""

from __future__ import annotations

import torch

from backend.core.registries.export_formats import export_format


def scheme(fmt: str, group: int) -> object:
    """The compressed-tensors preset the format names (export_formats.py's `scheme`: W4A16, 4-bit symmetric
    weights in groups of `group`; W4A16_ASYM, the same with a zero point per group; W8A8, 8-bit symmetric
    per-channel weights with 8-bit dynamic per-token activations)."""
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    chosen = preset_name_to_scheme(export_format(fmt).scheme, ["Linear"])
    if chosen.weights.group_size is not None:
        chosen.weights.group_size = group
    return chosen


def weight_qparams(weight: torch.Tensor, args: object, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero point) of a whole weight by its min and max, per group or per output channel; the
    scale is rounded to `dtype`, the dtype the file stores it in, before anything is rounded with it."""
    from compressed_tensors.quantization.utils import calculate_qparams

    w = weight.float()
    if args.group_size:
        w = w.reshape(w.shape[0], -1, args.group_size)
        low, high = w.amin(-1), w.amax(-1)
    else:
        low, high = w.amin(-1, keepdim=True), w.amax(-1, keepdim=True)
    scale, zero = calculate_qparams(low, high, args)
    return scale.to(dtype), zero


def bounds(args: object) -> tuple[int, int]:
    from compressed_tensors.quantization.utils import calculate_range

    low, high = calculate_range(args, torch.device("cpu"))
    return int(low), int(high)


def fake_quantize(weight: torch.Tensor, scale: torch.Tensor, args: object,
                  zero: torch.Tensor | None = None) -> torch.Tensor:
    """The weight rounded to the grid and back, in fp32, as compressed-tensors' quantize_dequantize does it
    (round(w / s + z), clamped, minus z, times s; symmetric: z = 0)."""
    low, high = bounds(args)
    s = scale.float()
    z = torch.zeros_like(s) if zero is None else zero.float()
    if args.group_size:  # (rows, groups, group) against (rows, groups, 1): no weight-sized copies of s and z
        w = weight.float().reshape(weight.shape[0], -1, args.group_size)
        s, z = s[..., None], z[..., None]
    else:
        w = weight.float()
    q = torch.round(w / s + z).clamp_(low, high).sub_(z).mul_(s)
    return q.reshape(weight.shape)
