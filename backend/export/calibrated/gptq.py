"""GPTQ (Frantar et al., 2022): round a weight one input column at a time, and spread each column's
rounding error over the columns not yet rounded, weighted by the inverse Hessian of the layer's
inputs (H = 2 X^T X over the calibration tokens), so the layer's output on those inputs moves least.

As IST-DASLab/gptq with `act_order` and `static_groups` (llmcompressor's default, `actorder="static"`): the
columns are rounded in descending order of H's diagonal (the inputs with the most energy first, while the
most columns are left to absorb their error), onto group scales fixed beforehand from the weight as stored.
Where H cannot be factored even damped, the layer is rounded to nearest and the export's report says so."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from backend.export.calibrated.grid import bounds, fake_quantize, weight_qparams
from backend.export.calibrated.layers import rewrite

DAMPING = 0.01
"""Added to H's diagonal as a share of its mean, so its Cholesky factor exists (the paper's value)."""
BLOCK = 128
"""Columns rounded one by one with their errors spread inside the block, then onto the later columns in one
product (both references' `blocksize`): the result is the same in exact arithmetic, and this is their order."""


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


@dataclass
class Solve:
    """What the layers sharing one H need: the upper Cholesky factor of H's inverse in `order` (None when H
    could not be factored even damped: the layers are then rounded to nearest), the columns no token reached,
    and the order the columns are rounded in (descending diag(H), activation order; None: as stored)."""

    inverse: torch.Tensor | None
    dead: torch.Tensor
    order: torch.Tensor | None


def inverse_factor(running: Hessian, act_order: bool = True) -> Solve:
    """The Solve of `running`'s H, computed once for all the layers that share it and consuming H, so at most
    two H-sized matrices live."""
    hessian, running.matrix = running.matrix, None
    dead = torch.diag(hessian) == 0
    hessian[dead, dead] = 1.0
    order = torch.argsort(torch.diag(hessian), descending=True) if act_order else None
    if order is not None:  # one statement each: H[order][:, order] would hold three H-sized matrices at once
        hessian = hessian.index_select(0, order)
        hessian = hessian.index_select(1, order)
    hessian.diagonal().add_(DAMPING * torch.mean(torch.diag(hessian)))
    try:
        factor = torch.linalg.cholesky(hessian)
        del hessian
        inverse = torch.cholesky_inverse(factor)
        del factor
        inverse = torch.linalg.cholesky(inverse, upper=True)
    except torch.linalg.LinAlgError:
        return Solve(None, dead, order)
    return Solve(inverse if bool(torch.isfinite(inverse).all()) else None, dead, order)


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


def quantize(weight: torch.Tensor, solve: Solve, args: object,
             scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(the rounded weight, fp32; its scale; its zero point). The scales are static: taken per group (or per
    output channel) from the weight as stored, before any error is spread, so rounding in activation order
    leaves every column on its own group's grid and the file needs no g_idx (IST-DASLab's `static_groups`,
    llmcompressor's `actorder="static"`)."""
    w = weight.float().clone()
    w[:, solve.dead] = 0.0
    scale, zero = weight_qparams(w, args, scale_dtype)  # (rows, groups) or (rows, 1)
    if solve.inverse is None:
        return fake_quantize(w, scale, args), scale, zero
    columns = w.shape[1]
    low, high = bounds(args)
    order = solve.order if solve.order is not None else torch.arange(columns, device=w.device)
    group_of = (order // args.group_size).tolist() if args.group_size else [0] * columns  # by rounding position
    steps = scale.float()
    if solve.order is not None:
        w = w[:, solve.order]
    inverse = solve.inverse
    out = torch.zeros_like(w)
    with one_thread():
        for start in range(0, columns, BLOCK):
            end = min(start + BLOCK, columns)
            block = w[:, start:end].clone()
            errors = torch.zeros_like(block)
            block_inverse = inverse[start:end, start:end]
            for i in range(end - start):
                column, step = block[:, i], steps[:, group_of[start + i]]
                rounded = torch.clamp(torch.round(column / step), low, high) * step
                out[:, start + i] = rounded
                error = (column - rounded) / block_inverse[i, i]
                block[:, i:] -= error[:, None] * block_inverse[i, i:][None, :]
                errors[:, i] = error
            w[:, end:] -= errors @ inverse[start:end, end:]
    del w  # before the permuted copy of `out`: two weight-sized fp32 matrices at most, as in stored order
    if solve.order is not None:
        out = out[:, torch.argsort(solve.order)]
    return out, scale, zero


class GptqUnit:
    """The linear layers that read one input: its Hessian, then each of them rounded by GPTQ in activation order
    (or to nearest, listed in `fallbacks`, where H cannot be factored even damped)."""

    stage = 1
    """After any scaling unit of the same decoder layer (collect.py): the Hessian must be of the scaled inputs."""

    def __init__(self, linears: list[torch.nn.Linear], args: object, scale_dtype: torch.dtype,
                 qparams: dict[torch.nn.Module, tuple[torch.Tensor, torch.Tensor]]):
        self.linears, self.args, self.scale_dtype, self.qparams = linears, args, scale_dtype, qparams
        self.module = linears[0]
        self.cost = self.module.in_features ** 2 * 4
        self.hessian: Hessian | None = None
        self.fallbacks: list[torch.nn.Linear] = []

    def add(self, x: torch.Tensor) -> None:
        if self.hessian is None:
            self.hessian = Hessian(x.shape[-1], x.device)
        self.hessian.add(x.detach())

    @torch.no_grad()
    def finish(self) -> None:
        if self.hessian is None:
            return
        solve = inverse_factor(self.hessian)
        self.hessian = None
        if solve.inverse is None:
            self.fallbacks += self.linears
        for linear in self.linears:
            device = linear.weight.device
            moved = Solve(None if solve.inverse is None else solve.inverse.to(device), solve.dead.to(device),
                          None if solve.order is None else solve.order.to(device))
            rounded, scale, zero = quantize(linear.weight, moved, self.args, self.scale_dtype)
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
