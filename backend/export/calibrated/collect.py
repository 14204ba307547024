"""Running calibration rows through the model with hooks on the inputs of chosen linear layers.

Each unit (a GPTQ Hessian, an AWQ or SmoothQuant mapping) states the bytes its statistics hold; units
are taken in the order the layers run, as many per pass over the rows as fit the budget, and each pass's
units are finished (their weights changed) before the next pass, so later layers see the earlier ones'
result. Only the last position's logits are computed.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import torch

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
    """Feed every row through the model once per pass, finishing each pass's units; returns the passes run."""
    device = next(p.device for p in model.parameters())
    groups = passes(units, budget)
    for group in groups:
        handles = [unit.module.register_forward_pre_hook(_hook(unit)) for unit in group]
        try:
            with cpu_products_in_fp32(model):
                for row in rows:
                    if should_stop and should_stop():
                        raise InterruptedError("stop requested")
                    ids = torch.tensor([row], device=device)
                    model(input_ids=ids, use_cache=False, logits_to_keep=1)
        finally:
            for handle in handles:
                handle.remove()
        for unit in group:
            unit.finish()
    return len(groups)


def _hook(unit: Unit) -> Callable:
    def hook(module: torch.nn.Module, args: tuple) -> None:
        unit.add(args[0])
    return hook
