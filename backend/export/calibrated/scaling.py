"""The two scaling algorithms: per-input-channel scales folded into the layer feeding the channels.

SmoothQuant (Xiao et al., 2022) moves activation outliers into the weights so that 8-bit activations
lose less: s = range(X)^a / (2 max|W|)^(1-a), a = 0.8, as llmcompressor computes it (its W8A8 recipe's
strength; range = max - min over the calibration tokens). AWQ (Lin et al., 2023) protects the weight columns
that meet large activations from 4-bit rounding: s = mean|X|^a, a searched on a grid for the least
output error of the rounded layers on calibration rows (a = 0 is plain rounding, so it never does worse
there).
"""

from __future__ import annotations

import math

import torch

from backend.export.calibrated.grid import fake_quantize, weight_qparams
from backend.export.calibrated.layers import Mapping

SMOOTHING = 0.8
"""SmoothQuant's alpha in llmcompressor's W8A8 example recipe (the paper's default is 0.5)."""
SMOOTHING_FLOOR = 1e-5
"""The least smoothing scale (llmcompressor's MINIMUM_SMOOTHING_SCALE)."""
AWQ_GRID = 20
AWQ_ROWS = 512
"""Calibration tokens whose outputs the AWQ search compares: the error it minimises settles with far fewer."""


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


class AwqUnit:
    """mean|X| per input channel and a sample of input rows of one mapping, then the searched scale folded in."""

    def __init__(self, mapping: Mapping, args: object, scale_dtype: torch.dtype, tokens: int):
        self.mapping, self.args, self.scale_dtype = mapping, args, scale_dtype
        self.module = mapping.linears[0]
        self.cost = AWQ_ROWS * self.module.in_features * 2 + self.module.in_features * 4
        self.share = AWQ_ROWS / max(tokens, 1)  # of each batch's tokens, kept for the search
        self.total: torch.Tensor | None = None
        self.tokens = 0
        self.rows: list[torch.Tensor] = []
        self.generator = torch.Generator().manual_seed(0)

    def add(self, x: torch.Tensor) -> None:
        flat = x.detach().reshape(-1, x.shape[-1])
        sums = flat.abs().float().sum(dim=0)
        self.total = sums if self.total is None else self.total + sums
        self.tokens += flat.shape[0]
        keep = max(1, min(flat.shape[0], math.ceil(flat.shape[0] * self.share)))
        pick = torch.randperm(flat.shape[0], generator=self.generator)[:keep]
        self.rows.append(flat[pick.to(flat.device)].to(torch.bfloat16 if flat.dtype == torch.float32 else flat.dtype))

    @torch.no_grad()
    def finish(self) -> None:
        if self.total is None:
            return
        mean = (self.total / self.tokens).clamp(min=1e-6)
        x = torch.cat(self.rows)[:AWQ_ROWS].float()
        self.rows = []
        weights = [m.weight.detach().float() for m in self.mapping.linears]
        expected = [x @ w.T for w in weights]
        best, best_error = torch.ones_like(mean), float("inf")
        for step in range(AWQ_GRID):
            scale = mean.pow(step / AWQ_GRID)
            scale = scale / (scale.max() * scale.min()).sqrt()
            error = 0.0
            for w, y in zip(weights, expected):
                scaled = w * scale
                s, _ = weight_qparams(scaled, self.args, self.scale_dtype)
                rounded = fake_quantize(scaled, s, self.args) / scale
                error += float((x @ rounded.T - y).pow(2).mean())
            if error < best_error:
                best, best_error = scale, error
        self.mapping.fold(best)
        self.total = None
