"""Running calibration rows through the model with hooks on the inputs of chosen linear layers.

Each unit (a GPTQ Hessian, an AWQ or SmoothQuant mapping) states the bytes its statistics hold; units
are taken in the order the layers run, as many per pass over the rows as fit the budget, and each pass's
units are finished (their weights changed) before the next pass, so later layers see the earlier ones'
result. Only the last position's logits are computed. As each decoder layer's units of a pass are finished,
`tell` gets a line with the time left (Progress).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, Callable, Protocol

import torch

from backend.export.calibrated.layers import decoder_layers
from backend.export.memory import trim_heap
from backend.export.verify import cpu_products_in_fp32


class Unit(Protocol):
    """What a pass feeds: `add(x)` gets the real tokens' rows of `module`'s input. A unit that also defines
    `add_call(args, kwargs)` gets `module`'s whole call instead (unmasked, every keyword), for an algorithm
    that runs the module again (AWQ's loss on the parent module's output)."""

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


class Progress:
    """The units' decoder layers, and a line per layer of a pass once its units there are finished: the time
    left is the mean time per layer so far (forward passes included) times the layers left."""

    def __init__(self, model: Any, units: list[Unit], name: str, tell: Callable[[str], None] | None):
        _, stack = decoder_layers(model)
        where = {module: index for index, layer in enumerate(stack) for module in layer.modules()}
        self.layer = [where.get(unit.module, -1) for unit in units]
        self.units = Counter(self.layer)  # a layer split over two passes counts its share done in each
        self.total = len(stack)
        self.name, self.tell, self.began, self.done = name, tell, time.monotonic(), 0.0

    def finished(self, position: int, last_of_pass: bool) -> None:
        """Unit `position` (of `units`) is finished; a line when it is its layer's last in this pass."""
        index = self.layer[position]
        self.done += 1 / self.units[index]
        if self.tell and (last_of_pass or self.layer[position + 1] != index):
            left = (time.monotonic() - self.began) / self.done * max(len(self.units) - self.done, 0.0)
            self.tell(f"{self.name}: layer {index + 1}/{self.total}, {left:.0f} s left")


class _Reached(Exception):
    """Raised by the hook on a pass's last unit: the layers after it have nothing to give this pass."""


@torch.no_grad()
def calibrate(model: Any, rows: list[list[int]], units: list[Unit], budget: int,
              should_stop: Callable[[], bool] | None = None, name: str = "calibration",
              tell: Callable[[str], None] | None = None) -> int:
    """Feed every row through the model once per pass, finishing each pass's units; returns the passes run.
    Rows go right-padded in batches of about BATCH_TOKENS (each pass widens every 16-bit weight once per
    batch on a CPU: verify.cpu_products_in_fp32), and only real tokens reach the statistics. A forward pass
    stops at its pass's last unit: the layers after it would only be run again by the next pass."""
    device = next(p.device for p in model.parameters())
    groups = passes(units, budget)
    batches = _batches(rows)
    progress, position = Progress(model, units, name, tell), 0
    for group in groups:
        current: dict[str, Any] = {}
        handles = [unit.module.register_forward_pre_hook(_hook(unit, current), with_kwargs=hasattr(unit, "add_call"))
                   for unit in group]
        try:
            with cpu_products_in_fp32(model):
                for ids, mask in batches:
                    if should_stop and should_stop():
                        raise InterruptedError("stop requested")
                    current["mask"], current["waiting"] = mask.to(device).bool(), set(group)
                    try:
                        model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False,
                              logits_to_keep=1)
                    except _Reached:
                        pass
        finally:
            for handle in handles:
                handle.remove()
        trim_heap()  # the passes' activations: the heap keeps them, and each finish's larger blocks are fresh maps
        for count, unit in enumerate(group, 1):
            unit.finish()
            trim_heap()
            progress.finished(position, count == len(group))
            position += 1
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


def _hook(unit: Unit, current: dict[str, Any]) -> Callable:
    def reached() -> None:
        current["waiting"].discard(unit)
        if not current["waiting"]:
            raise _Reached

    if hasattr(unit, "add_call"):
        def call_hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            unit.add_call(args, kwargs)
            reached()
        return call_hook

    def hook(module: torch.nn.Module, args: tuple) -> None:
        x = args[0]
        mask = current.get("mask")
        unit.add(x[mask] if mask is not None and x.shape[:2] == mask.shape else x)
        reached()
    return hook
