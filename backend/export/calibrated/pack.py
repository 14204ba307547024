"""Quantizing and packing a calibrated model one linear layer at a time with compressed-tensors' per-module
compressor (compress_module), each layer's 16-bit weight handed back as its packed form is made.

What the whole-model path (scales for every layer, then ModelCompressor.compress_model) kept resident: the
weights the calibration had written in place were copied-on-write pages of the checkpoint file's mapping,
which stay until the whole file is unmapped (layers.rewrite now gives them memory of their own), and glibc's
heap kept the rounding's freed fp32 temporaries (trimmed after each layer here). The folder written is the
whole-model path's, byte for byte (tests/backend/test_calibrated_pack.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from backend.export.calibrated import grid
from backend.export.memory import trim_heap

QParams = dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]


def quantization_config(scheme: Any, ignore: list[str]) -> Any:
    """compressed-tensors' config for one scheme on every nn.Linear except `ignore`."""
    from compressed_tensors.quantization import QuantizationConfig

    return QuantizationConfig(config_groups={"group_0": scheme}, ignore=ignore)


def pack(model: torch.nn.Module, linears: dict[str, torch.nn.Linear], qparams: QParams, scheme: Any,
         ignore: list[str], scale_dtype: torch.dtype,
         should_stop: Callable[[], bool] | None = None) -> Any:
    """Quantize and pack `linears` in order, freeing each 16-bit weight (and its `qparams` entry) as its
    packed form is made; returns the ModelCompressor whose update_config writes the folder's config."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.compressors.base import compress_module
    from compressed_tensors.quantization import apply_quantization_config

    # Adds each layer's scale and zero point (a few % of its weight) and the scheme vLLM reads back.
    apply_quantization_config(model, quantization_config(scheme, ignore), show_progress=False)
    compressor = ModelCompressor.from_pretrained_model(model)  # infers the format, as the whole-model path does
    with torch.no_grad():
        for linear in linears.values():
            if should_stop and should_stop():
                raise InterruptedError("stop requested")
            found = qparams.pop(linear, None)
            scale, zero = found if found is not None else grid.weight_qparams(linear.weight, scheme.weights,
                                                                               scale_dtype)
            linear.weight_scale.copy_(scale.reshape(linear.weight_scale.shape).to(linear.weight_scale.dtype))
            linear.weight_zero_point.copy_(zero.reshape(linear.weight_zero_point.shape)
                                           .to(linear.weight_zero_point.dtype))
            del found, scale, zero
            compress_module(linear, compressor.force_compression_format)
            trim_heap()  # the rounding's fp32 temporaries, handed back before the next layer's
    # Nothing is left to compress; this marks the config compressed and hooks decompression on a forward
    # pass, as the whole-model path leaves the model.
    compressor.compress_model(model, skip_compressed=True)
    return compressor


def save(model: torch.nn.Module, compressor: Any, folder: Path) -> None:
    """The packed model's safetensors and config.json, with compressed-tensors' quantization_config."""
    model.save_pretrained(folder, safe_serialization=True)
    compressor.update_config(str(folder))


def format_name(compressor: Any) -> str:
    fmt = compressor.quantization_config.format
    return getattr(fmt, "value", str(fmt))
