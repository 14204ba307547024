"""SmoothQuant: per-input-channel scales folded into the layer feeding the channels (AWQ, the other
scaling algorithm, is awq.py).

SmoothQuant (Xiao et al., 2022) moves activation outliers into the weights so that 8-bit activations
lose less: s = range(X)^a / (2 max|W|)^(1-a), a = 0.8, as llmcompressor computes it (its W8A8 recipe's
strength; range = max - min over the calibration tokens).
"""

from __future__ import annotations


import torch

from backend.export.calibrated.layers import Mapping

SMOOTHING = 0.8
"""SmoothQuant's alpha in llmcompressor's W8A8 example recipe (the paper's default is 0.5)."""
SMOOTHING_FLOOR = 1e-5
"""The least smoothing scale (llmcompressor's MINIMUM_SMOOTHING_SCALE)."""


class SmoothQuantUnit:
    """Per input channel, the least and the greatest value of one mapping's input over the real calibration
    tokens, then its smoothing scale folded in."""

    def __init__(self, mapping: Mapping):
        self.mapping = mapping
        self.module = mapping.linears[0]
        self.cost = self.module.in_features * 8
        self.low: torch.Tensor | None = None
        self.high: torch.Tensor | None = None

    def add(self, x: torch.Tensor) -> None:
        flat = x.detach().reshape(-1, x.shape[-1])
        low, high = flat.amin(dim=0).float(), flat.amax(dim=0).float()
        self.low = low if self.low is None else torch.minimum(self.low, low)
        self.high = high if self.high is None else torch.maximum(self.high, high)

    def finish(self) -> None:
        if self.low is None:
            return
        self.mapping.fold(smoothing_scales(self.high - self.low, self.mapping.linears))
        self.low = self.high = None


def smoothing_scales(ranges: torch.Tensor, linears: list[torch.nn.Linear]) -> torch.Tensor:
    """llmcompressor's SmoothQuant scales: range^a / (2 max|W|)^(1-a) per input channel, the range itself where
    no weight reads the channel, at least SMOOTHING_FLOOR. A channel no token moved (range 0) keeps 1, where
    llmcompressor's floor would multiply the feeding norm's weight by 1e5 for inputs calibration never saw."""
    weights = 2.0 * torch.cat([m.weight.detach().abs().float().amax(dim=0, keepdim=True) for m in linears]).amax(0)
    weights = weights.to(ranges.device)
    scale = ranges.pow(SMOOTHING) / weights.pow(1 - SMOOTHING)
    scale = torch.where(weights > 0.0, scale, ranges).clamp(min=SMOOTHING_FLOOR)
    return torch.where(ranges > 0, scale, torch.ones_like(scale))
