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
from backend.export.memory import trim_heap

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
    """The Solve of `running`'s H, computed once for all the layers that share it, in H's own memory: the
    permutation and all three factorisations write over it (one H-sized matrix, where a new result per step
    held two: 254 MB at a 5632-wide down_proj, more than the model's other 0.5x of its 16-bit size)."""
    hessian, running.matrix = running.matrix, None
    dead = torch.diag(hessian) == 0
    hessian[dead, dead] = 1.0
    order = torch.argsort(torch.diag(hessian), descending=True) if act_order else None
    if order is not None:
        permute_(hessian, order)
    hessian.diagonal().add_(DAMPING * torch.mean(torch.diag(hessian)))
    mirror_lower_(hessian)
    # Symmetric now, so its transpose is the same matrix in column-major order: the layout LAPACK factors in
    # place, which torch then does without a copy (the values, order and results of the copying calls).
    # At the calibration's measured thread count (collect._choose_threads): on busy cores MKL's threads wait on
    # each other at every step of its blocked factorisations (a 3000-wide H: 5 s on one thread, 35 s on two),
    # while on idle cores a 14336-wide H (an 8 B model's down_proj, about 4e12 flops) needs all of them.
    work = hessian.mT
    try:
        torch.linalg.cholesky(work, out=work)
        torch.cholesky_inverse(work, out=work)
        torch.linalg.cholesky(work, upper=True, out=work)
    except torch.linalg.LinAlgError:
        return Solve(None, dead, order)
    return Solve(work if bool(torch.isfinite(work).all()) else None, dead, order)


CHUNK = 256
"""Rows per step of the in-place permutation and mirroring: a few MB of scratch at a time."""


def permute_(matrix: torch.Tensor, order: torch.Tensor) -> None:
    """matrix[order][:, order] in place: the rows by following the permutation's cycles (one row of scratch),
    the columns a band of rows at a time."""
    moves = order.tolist()
    done = [False] * len(moves)
    for start in range(len(moves)):
        if done[start] or moves[start] == start:
            continue
        held, at = matrix[start].clone(), start
        while True:
            done[at] = True
            source = moves[at]
            if source == start:
                matrix[at] = held
                break
            matrix[at] = matrix[source]
            at = source
    permute_columns_(matrix, order)


def mirror_lower_(matrix: torch.Tensor) -> None:
    """The lower triangle copied onto the upper, in place: the triangle a Cholesky factorisation reads, made the
    whole matrix (H is symmetric up to its accumulation's rounding)."""
    n = matrix.shape[0]
    for begin in range(0, n, CHUNK):
        end = min(begin + CHUNK, n)
        square = matrix[begin:end, begin:end]
        square.copy_(torch.tril(square) + torch.tril(square, -1).mT)
        if end < n:
            matrix[begin:end, end:] = matrix[end:, begin:end].mT


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
    llmcompressor's `actorder="static"`). One weight-sized fp32 matrix lives: each block's rounded columns
    replace the block, whose unrounded values nothing reads again, and the permutations are made in place."""
    w = weight.to(torch.float32, copy=True)
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
        permute_columns_(w, solve.order)
    inverse = solve.inverse
    with one_thread():
        for start in range(0, columns, BLOCK):
            end = min(start + BLOCK, columns)
            block = w[:, start:end].clone()
            rounded_block = torch.empty_like(block)
            errors = torch.zeros_like(block)
            block_inverse = inverse[start:end, start:end]
            for i in range(end - start):
                column, step = block[:, i], steps[:, group_of[start + i]]
                rounded = torch.clamp(torch.round(column / step), low, high) * step
                rounded_block[:, i] = rounded
                error = (column - rounded) / block_inverse[i, i]
                block[:, i:] -= error[:, None] * block_inverse[i, i:][None, :]
                errors[:, i] = error
            w[:, start:end] = rounded_block
            for later in range(end, columns, SPREAD):  # the product a band at a time: the same sums, less scratch
                w[:, later:later + SPREAD] -= errors @ inverse[start:end, later:later + SPREAD]
    if solve.order is not None:
        permute_columns_(w, torch.argsort(solve.order))
    return w, scale, zero


SPREAD = 1024
"""Later columns per product when a block's errors are spread: (rows x SPREAD) fp32 of scratch in place of
(rows x columns), and on one thread the same sums (each entry is one 128-term dot product either way)."""


def permute_columns_(matrix: torch.Tensor, order: torch.Tensor) -> None:
    """matrix[:, order] in place, a band of rows at a time."""
    for begin in range(0, matrix.shape[0], CHUNK):
        band = matrix[begin:begin + CHUNK]
        band.copy_(band.index_select(1, order))


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
            trim_heap()  # the spread's products (up to 23 MB each) come from glibc's heap, which keeps them


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
