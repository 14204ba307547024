"""GPTQ (Frantar et al., 2022): round a weight one input column at a time, and spread each column's
rounding error over the columns not yet rounded, weighted by the inverse Hessian of the layer's
inputs (H = 2 X^T X over the calibration tokens), so the layer's output on those inputs moves least."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from backend.export.calibrated.grid import bounds, weight_qparams
from backend.export.calibrated.layers import rewrite

DAMPING = 0.01
"""Added to H's diagonal as a share of its mean, so its Cholesky factor exists (the paper's value)."""


class Hessian:
    """The running X^T X of one input, shared by the linear layers that read it."""

    def __init__(self, columns: int, device: torch.device):
        self.matrix: torch.Tensor | None = torch.zeros(columns, columns, dtype=torch.float32, device=device)
        self.tokens = 0

    def add(self, x: torch.Tensor) -> None:
        rows = x.reshape(-1, x.shape[-1]).float()
        total = self.tokens + rows.shape[0]
        self.matrix.mul_(self.tokens / total)
        rows = rows * (2.0 / total) ** 0.5
        self.matrix.addmm_(rows.T, rows)
        self.tokens = total


def inverse_factor(running: Hessian) -> tuple[torch.Tensor, torch.Tensor]:
    """(upper Cholesky factor of H's inverse, H damped; columns no token reached): computed once for all
    the layers that share H, taking H from `running` and consuming it, so at most two H-sized matrices live."""
    hessian, running.matrix = running.matrix, None
    dead = torch.diag(hessian) == 0
    hessian[dead, dead] = 1.0
    hessian.diagonal().add_(DAMPING * torch.mean(torch.diag(hessian)))
    factor = torch.linalg.cholesky(hessian)
    del hessian
    inverse = torch.cholesky_inverse(factor)
    del factor
    return torch.linalg.cholesky(inverse, upper=True), dead


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """The column loop's thousands of small operations on one thread: split over threads they gain nothing,
    and on cores other processes keep busy each one waits for its slowest thread (8.5 s instead of 0.6 s for
    a 2048-column layer on 2 busy cores, docs/benchmarks.md)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def quantize(weight: torch.Tensor, inverse: torch.Tensor, dead: torch.Tensor, args: object,
             scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the rounded weight, fp32; its scale; its zero point): groups are the blocks error is spread over,
    each group's scale taken from its columns as the errors before it left them."""
    w = weight.float().clone()
    w[:, dead] = 0.0
    rows, columns = w.shape
    group = args.group_size or columns
    low, high = bounds(args)
    out = torch.zeros_like(w)
    scales, zeros = [], []
    for start in range(0, columns, group):
        end = min(start + group, columns)
        block = w[:, start:end].clone()
        errors = torch.zeros_like(block)
        block_inverse = inverse[start:end, start:end]
        if args.group_size:
            scale, zero = weight_qparams(block, args, scale_dtype)  # one group: (rows, 1)
        else:
            scale, zero = weight_qparams(w, args, scale_dtype)  # per output channel: (rows, 1)
        s = scale.float()[:, 0]
        with one_thread():
            for i in range(end - start):
                column = block[:, i]
                rounded = torch.clamp(torch.round(column / s), low, high) * s
                out[:, start + i] = rounded
                error = (column - rounded) / block_inverse[i, i]
                block[:, i:] -= error[:, None] * block_inverse[i, i:][None, :]
                errors[:, i] = error
        w[:, end:] -= errors @ inverse[start:end, end:]
        scales.append(scale)
        zeros.append(zero)
    if args.group_size:
        return out, torch.cat(scales, dim=1), torch.cat(zeros, dim=1)
    return out, scales[0], zeros[0]


class GptqUnit:
    """The linear layers that read one input: its Hessian, then each of them rounded by GPTQ."""

    def __init__(self, linears: list[torch.nn.Linear], args: object, scale_dtype: torch.dtype,
                 qparams: dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]):
        self.linears, self.args, self.scale_dtype, self.qparams = linears, args, scale_dtype, qparams
        self.module = linears[0]
        self.cost = self.module.in_features ** 2 * 4
        self.hessian: Hessian | None = None

    def add(self, x: torch.Tensor) -> None:
        if self.hessian is None:
            self.hessian = Hessian(x.shape[-1], x.device)
        self.hessian.add(x.detach())

    @torch.no_grad()
    def finish(self) -> None:
        if self.hessian is None:
            return
        inverse, dead = inverse_factor(self.hessian)
        self.hessian = None
        for linear in self.linears:
            rounded, scale, zero = quantize(linear.weight, inverse.to(linear.weight.device), dead, self.args,
                                            self.scale_dtype)
            rewrite(linear, "weight", rounded)
            del rounded
            self.qparams[linear] = (scale, zero)


def shared_inputs(layers: dict[str, torch.nn.Linear]) -> list[list[torch.nn.Linear]]:
    """Linear layers grouped by the input they read (q/k/v, gate/up): siblings whose names differ only in
    the projection, in the same parent, with the same input width."""
    groups: dict[tuple, list[torch.nn.Linear]] = {}
    for name, linear in layers.items():
        parent, _, leaf = name.rpartition(".")
        kind = "qkv" if leaf in ("q_proj", "k_proj", "v_proj") else "gate_up" if leaf in ("gate_proj", "up_proj") \
            else leaf
        groups.setdefault((parent, kind, linear.in_features), []).append(linear)
    return list(groups.values())
