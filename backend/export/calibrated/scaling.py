"""SmoothQuant's per-input-channel scales folded into the layer feeding the channels (AWQ's are in awq.py).

SmoothQuant (Xiao et al., 2022) moves activation outliers into the weights so that 8-bit activations
lose less: s = max|X|^a / max|W|^(1-a), a = 0.5.
"""

from __future__ import annotations

import torch

from backend.export.calibrated.layers import Mapping

SMOOTHING = 0.5


class SmoothQuantUnit:
    """max|X| per input channel of one mapping, then its smoothing scale folded in."""

    def __init__(self, mapping: Mapping):
        self.mapping = mapping
        self.module = mapping.linears[0]
        self.cost = self.module.in_features * 4
        self.peak: torch.Tensor | None = None

    def add(self, x: torch.Tensor) -> None:
        peak = x.detach().reshape(-1, x.shape[-1]).abs().amax(dim=0).float()
        self.peak = peak if self.peak is None else torch.maximum(self.peak, peak)

    def finish(self) -> None:
        if self.peak is None:
            return
        weights = torch.cat([m.weight.detach().abs().float() for m in self.mapping.linears], dim=0).amax(dim=0)
        scale = (self.peak.pow(SMOOTHING) / weights.to(self.peak.device).clamp(min=1e-5).pow(1 - SMOOTHING))
        scale = torch.where(self.peak > 0, scale.clamp(min=1e-5), torch.ones_like(scale))
        self.mapping.fold(scale)
        self.peak = None
