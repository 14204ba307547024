"""Running calibration rows through the model with hooks on the inputs of chosen linear layers.

Each unit (a GPTQ Hessian, an AWQ or SmoothQuant mapping) states the bytes its statistics hold; units
are taken in the order the layers run, as many per pass over the rows as fit the budget, and each pass's
units are finished (their weights changed) before the next pass, so later layers see the earlier ones'
result. Only the last position's logits are computed.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

from backend.export.memory import trim_heap
from backend.export.verify import cpu_products_in_fp32


class Unit(Protocol):
    module: torch.nn.Module
    cost: int

    def add(self, x: torch.Tensor) -> None: ...

    def finish(self) -> None: ...


def passes(units: list[Unit], budget: int) -> list[list[Unit]]:
    """Consecutive units grouped so that each group's statistics fit `budget` bytes (at least one each)."""
    groups: list[list[Unit]] = []
    used = 0
    for unit in units:
        if not groups or used + unit.cost > budget:
            groups.append([])
            used = 0
        groups[-1].append(unit)
        used += unit.cost
    return groups


@torch.no_grad()
def calibrate(model: Any, rows: list[list[int]], units: list[Unit], budget: int,
              should_stop: Callable[[], bool] | None = None) -> int:
    """Feed every row through the model once per pass, finishing each pass's units; returns the passes run.
    Rows go right-padded in batches of about BATCH_TOKENS (each pass widens every 16-bit weight once per
    batch on a CPU: verify.cpu_products_in_fp32), and only real tokens reach the statistics."""
    device = next(p.device for p in model.parameters())
    groups = passes(units, budget)
    batches = _batches(rows)
    for group in groups:
        current: dict[str, torch.Tensor] = {}
        handles = [unit.module.register_forward_pre_hook(_hook(unit, current)) for unit in group]
        try:
            with cpu_products_in_fp32(model):
                for ids, mask in batches:
                    if should_stop and should_stop():
                        raise InterruptedError("stop requested")
                    current["mask"] = mask.to(device).bool()
                    model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False, logits_to_keep=1)
        finally:
            for handle in handles:
                handle.remove()
        trim_heap()  # the passes' activations: the heap keeps them, and each finish's larger blocks are fresh maps
        for unit in group:
            unit.finish()
            trim_heap()
    return len(groups)


BATCH_TOKENS = 1024
"""Positions per forward pass. The pass's activations and their fp32 products are the calibration's largest
transient (about 0.3 GB over 2048 tokens at TinyLlama's widths, more than half of a 2-layer model's 16-bit
size); 1024 halves it for about 4% more time on a GPTQ write (docs/benchmarks.md)."""


def _batches(rows: list[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rows sorted by length (less padding), right-padded into batches of at most BATCH_TOKENS positions."""
    ordered = sorted(rows, key=len)
    batches, current = [], []
    for row in ordered:
        if current and len(row) * (len(current) + 1) > BATCH_TOKENS:
            batches.append(current)
            current = []
        current.append(row)
    if current:
        batches.append(current)
    out = []
    for batch in batches:
        width = max(len(r) for r in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, row in enumerate(batch):
            ids[i, :len(row)] = torch.tensor(row)
            mask[i, :len(row)] = 1
        out.append((ids, mask))
    return out


def _hook(unit: Unit, current: dict[str, torch.Tensor]) -> Callable:
    def hook(module: torch.nn.Module, args: tuple) -> None:
        x = args[0]
        mask = current.get("mask")
        unit.add(x[mask] if mask is not None and x.shape[:2] == mask.shape else x)
    return hook
