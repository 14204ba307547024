"""MergedSource: the trained model's merged tensors, computed one at a time from the files on disk.

A TensorSource (tensor_source.py) over the base checkpoint and the adapter, for every writer:
`get(name)` reads that one base tensor (checkpoint_files.py), puts it in the form the run computed
with (cast to the run's load dtype; for qlora/lora8 quantized and dequantized exactly as
bitsandbytes did, quantized_base.py), adds the adapter's change in fp32 and rounds once to the
export dtype:

    LoRA:  W' = W + s * B @ A                       s = alpha / r  (rsLoRA: alpha / sqrt(r))
    DoRA:  W' = m / ||W + s * B @ A||_row * (W + s * B @ A)      (peft 0.21 DoraLinearVariant.merge_safe)

Nothing is kept between calls, so memory is a few copies of the largest tensor whatever the model's
size. Method full reads the run's model/ folder the same way, with nothing to add. `rounding`
accumulates how much of the adapter's change the export dtype's rounding erased.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from backend.export.adapter_weights import AdapterWeights, AdaptedModule
from backend.export.checkpoint_files import CheckpointFiles
from backend.export.model_layout import ModelLayout
from backend.export.quantized_base import dequantized

log = logging.getLogger(__name__)


@dataclass
class RoundingStats:
    """Sums over the adapted tensors: squared norm of the adapter's change and of the export's rounding error."""

    change: float = 0.0
    error: float = 0.0
    tensors: int = 0

    @property
    def relative_error(self) -> float | None:
        return math.sqrt(self.error / self.change) if self.change > 0 else None


class MergedSource:
    """TensorSource: base (as trained) + adapter, merged per tensor into `dtype` (fp32 for GGUF writers)."""

    def __init__(self, files: CheckpointFiles, layout: ModelLayout, adapter: AdapterWeights | None, dtype: torch.dtype,
                 *, load_dtype: torch.dtype = torch.float32, adapted_dtype: torch.dtype | None = None,
                 quantization: str | None = None, quant_device: str = "cpu"):
        self.files = files
        self.layout = layout
        self.config: Any = layout.config
        self.adapter = adapter
        self.dtype = dtype
        self.load_dtype = load_dtype  # the dtype the run loaded its base in (bf16 rounds an fp32 checkpoint)
        self.adapted_dtype = adapted_dtype or load_dtype  # CPU bf16-base runs held adapted weights in bf16
        self.quantization = quantization
        self.quant_device = quant_device
        self.rounding = RoundingStats()

    # --- TensorSource ----------------------------------------------------------------------------
    def names(self) -> list[str]:
        return self.files.names()

    def shape(self, name: str) -> tuple[int, ...]:
        return self.files.info(name).shape

    def dtype_of(self, name: str) -> torch.dtype:
        """What `get(name)` returns: the export dtype for floating-point tensors, integers as stored."""
        stored = self.files.info(name).dtype
        return self.dtype if stored.is_floating_point else stored

    def get(self, name: str) -> torch.Tensor:
        if self.adapter is not None and name in self.adapter.replaced:  # a module the run tuned whole
            return self.adapter.full_copy(name).to(self.dtype)
        tensor = self.files.get(name)
        if not tensor.is_floating_point():
            return tensor
        adapted = self.adapter.modules.get(name) if self.adapter else None
        if adapted is None and not self._quantized(name):
            return self._held(tensor, self.load_dtype).to(self.dtype)
        kind = adapted.kind if adapted else self._kind(name)
        base = self._base(name, tensor, kind)
        del tensor
        out = base.to(self.dtype) if adapted is None else self._merge(base, adapted)
        del base
        return out.T.contiguous() if kind == "conv1d" else out

    # --- merging ---------------------------------------------------------------------------------
    def _kind(self, name: str) -> str:
        owner = self.layout.module_of(name)
        return self.layout.kinds.get(owner[0], "other") if owner else "other"

    def _quantized(self, name: str) -> bool:
        owner = self.layout.module_of(name)
        return bool(self.quantization and owner and owner[1] == "weight" and owner[0] in self.layout.quantized)

    def _base(self, name: str, stored: torch.Tensor, kind: str) -> torch.Tensor:
        """The weight as the run's layer held it, in the module's Linear orientation, fp32."""
        weight = stored.T if kind == "conv1d" else stored
        if self._quantized(name):
            return dequantized(weight, self.quantization, self.load_dtype, self.quant_device,
                               self.layout.quant_kwargs).float()
        held = self.load_dtype if kind == "experts" else self.adapted_dtype  # peft's ParamWrapper leaves experts as loaded
        return self._held(weight, held).float()

    @staticmethod
    def _held(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The values the run held after loading `tensor` in `dtype` (a cast only where it rounds)."""
        if dtype == tensor.dtype or dtype == torch.float32:
            return tensor
        return tensor.to(dtype)

    def _merge(self, base: torch.Tensor, adapted: AdaptedModule) -> torch.Tensor:
        delta = self.adapter.delta(adapted)
        if adapted.magnitude_key is not None:
            merged = base + delta
            del delta
            norm = torch.linalg.norm(merged, dim=1)
            merged = (self.adapter.magnitude(adapted) / norm).view(-1, 1) * merged
            change = float(torch.linalg.vector_norm(merged - base))
        else:
            change = float(torch.linalg.vector_norm(delta))
            merged = base.add_(delta)  # `base` is this call's own fp32 copy (or a private file mapping)
            del delta
        out = merged.to(self.dtype)
        if self.dtype != torch.float32:
            self.rounding.change += change**2
            self.rounding.error += float(torch.linalg.vector_norm(out.float().sub_(merged))) ** 2
            self.rounding.tensors += 1
        del merged
        return out

    # --- sizes for the disk estimate -------------------------------------------------------------
    def parameter_count(self) -> int:
        return sum(self.files.info(n).numel for n in self.names())

    def linear_parameter_count(self) -> int:
        """Parameters of the 2-D Linear weights other than the head and embeddings: what bitsandbytes quantizes."""
        total = 0
        for name in self.names():
            owner = self.layout.module_of(name)
            if owner and owner[1] == "weight" and self.layout.kinds.get(owner[0]) in ("linear", "conv1d") \
                    and not owner[0].endswith("lm_head"):
                total += self.files.info(name).numel
        for names in self.layout.fused.values():
            total += sum(self.files.info(n).numel for n in names)
        return total
