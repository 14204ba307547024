"""Calibration one decoder layer at a time, with hooks on the inputs of chosen linear layers (llmcompressor's
sequential pipeline, and IST-DASLab/gptq's per-layer loop).

Each unit (a GPTQ Hessian, an AWQ or SmoothQuant mapping) hooks one module inside a decoder layer. The inputs
of decoder layer 0 are captured once for every batch of rows (the layers themselves are skipped while the
model's own forward computes their masks and position embeddings); then, layer by layer, the cached hidden
states are run through the layer with its units' hooks on, its units are finished (their weights changed),
and the layer is run again so that its now-quantized outputs become the next layer's inputs. Every unit so
sees the earlier layers quantized, as the references do; the units of one layer see each other unquantized
(they gather in one run), as llmcompressor's do, except that a unit of a later `stage` (GPTQ after SmoothQuant)
gathers in a run after the earlier stage's units are finished. After each layer `tell` gets a line with the
time left.

A unit defines `add(x)` (the hooked module's first input, real tokens only) or `add_call(args, kwargs)`
(the module's whole call, padding included: e.g. AWQ re-running its parent module).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from backend.export.calibrated.layers import decoder_layers
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


class Progress:
    """A line per decoder layer once its units are finished and its outputs propagated: the time left is the
    mean time per layer so far (the capture of layer 0's inputs included) times the layers left."""

    def __init__(self, total: int, last: int, name: str, tell: Callable[[str], None] | None):
        self.total, self.last, self.name, self.tell, self.began = total, last, name, tell, time.monotonic()

    def finished(self, index: int) -> None:
        if self.tell:
            left = (time.monotonic() - self.began) / (index + 1) * (self.last - index)
            self.tell(f"{self.name}: layer {index + 1}/{self.total}, {left:.0f} s left")


@dataclass
class Batch:
    """One batch of rows at the current decoder layer: its hidden states (replaced by each layer's outputs),
    its real tokens, and every layer's other arguments as the model computed them (masks and position
    embeddings; layers of one kind share the very same tensors)."""

    hidden: torch.Tensor
    mask: torch.Tensor
    calls: list[tuple[tuple, dict]] = field(default_factory=list)  # each layer's call less its hidden states
    positional: bool = True  # the hidden states go first, not as `hidden_states=`

    def run(self, layer: torch.nn.Module, index: int) -> torch.Tensor:
        args, kwargs = self.calls[index]
        out = layer(self.hidden, *args, **kwargs) if self.positional else layer(*args, hidden_states=self.hidden,
                                                                                **kwargs)
        return out[0] if isinstance(out, tuple) else out


class _Reached(Exception):
    """Raised by the hook on a group's last unit: the rest of the layer has nothing to give this group."""


@torch.no_grad()
def calibrate(model: Any, rows: list[list[int]], units: list[Unit], budget: int,
              should_stop: Callable[[], bool] | None = None, name: str = "calibration",
              tell: Callable[[str], None] | None = None) -> int:
    """Calibrate and finish `units` decoder layer by decoder layer; returns the runs of a layer with statistics
    (one per layer, more where a layer's units' statistics exceed `budget` bytes: each run gathers as many as
    fit, at least one). Rows go right-padded in batches of about BATCH_TOKENS, and only real tokens reach `add`.

    The cached hidden states, outside the budget, are tokens x hidden x dtype: one layer's width per token
    where the model holds thousands of weights per width: the default 128 rows of at most 512 tokens at a 7B
    model's 4096 widths in 16 bits are at most 0.5 GB, 4% of the model (the most rows, 1024, eight times that)."""
    _, stack = decoder_layers(model)
    by_layer = units_by_layer(stack, units)
    if not units:
        return 0
    last = max(index for index, found in enumerate(by_layer) if found)
    progress = Progress(len(stack), last, name, tell)
    threads = torch.get_num_threads()
    with cpu_products_in_fp32(model):
        batches = capture(model, stack, rows, should_stop)
        _choose_threads(stack, batches, name, tell)
        try:
            _layers(stack, by_layer, batches, last, budget, should_stop, progress)
        finally:
            torch.set_num_threads(threads)
    return sum(len(layer_groups(found, budget)) for found in by_layer[:last + 1])


def _layers(stack: torch.nn.ModuleList, by_layer: list[list[Unit]], batches: list[Batch], last: int, budget: int,
            should_stop: Callable[[], bool] | None, progress: Progress) -> None:
    """Each decoder layer's units gathered and finished, then the layer's outputs propagated to the next."""
    for index in range(last + 1):
        layer = stack[index]
        for group in layer_groups(by_layer[index], budget):
            gather(layer, index, group, batches, should_stop)
            trim_heap()  # the run's activations: the heap keeps them, and each finish's larger blocks are fresh maps
            for unit in group:
                unit.finish()
                trim_heap()
        if index < last:
            for batch in batches:
                _check(should_stop)
                batch.hidden = batch.run(layer, index)
        progress.finished(index)


def _choose_threads(stack: torch.nn.ModuleList, batches: list[Batch], name: str,
                    tell: Callable[[str], None] | None) -> None:
    """On a CPU, the calibration's thread count measured on its own work (thread_choice.py, as training does):
    decoder layer 0 run on the first batch at torch's count, then at half while that is faster. On busy
    cores every parallel region waits for a thread another process holds: the bundled model's GPTQ write took
    58.5 s on 2 threads and 3.7 s on 1 with 2 cores at load 9-11 (docs/benchmarks.md). The thread count is
    left to the caller to restore; results differ from another count's only in the products' last bits."""
    if not batches or batches[0].hidden.device.type != "cpu" or torch.get_num_threads() <= 1:
        return
    from backend.training.shortcuts.thread_choice import choose_threads

    first = batches[0]
    choice = choose_threads(lambda: first.run(stack[0], 0), torch.get_num_threads(), budget_s=THREAD_BUDGET_S)
    if tell:
        tell(f"{name}: {choice.summary().replace('one training pass', 'one decoder layer on one batch')}")


THREAD_BUDGET_S = 5.0
"""No measuring where one decoder layer on one batch takes longer than this at torch's count: a layer that
large keeps its threads busy, and 5 passes of it would cost more than they could save."""


def layer_groups(units: list[Unit], budget: int) -> list[list[Unit]]:
    """One layer's units in the runs that gather them: by `stage` (a unit's optional attribute, 0 if absent:
    a GPTQ unit's Hessian must see the inputs a scaling unit of its layer has changed, so it runs after), then
    as many per run as `budget` bytes of statistics hold."""
    stages = sorted({getattr(unit, "stage", 0) for unit in units})
    return [group for stage in stages
            for group in passes([u for u in units if getattr(u, "stage", 0) == stage], budget)]


def units_by_layer(stack: torch.nn.ModuleList, units: list[Unit]) -> list[list[Unit]]:
    """`units` by the decoder layer holding their module, in their given order; ValueError for a unit outside
    every decoder layer (this pipeline never runs the model past its decoder layers)."""
    where = {module: index for index, layer in enumerate(stack) for module in layer.modules()}
    found: list[list[Unit]] = [[] for _ in stack]
    for unit in units:
        if unit.module not in where:
            raise ValueError(f"calibration unit on {type(unit.module).__name__} outside the decoder layers: only "
                             "layers inside them can be calibrated layer by layer")
        found[where[unit.module]].append(unit)
    return found


def capture(model: Any, stack: torch.nn.ModuleList, rows: list[list[int]],
            should_stop: Callable[[], bool] | None) -> list[Batch]:
    """Every batch's inputs of decoder layer 0 and every layer's other arguments, from one run of the model in
    which each decoder layer only records its call and hands its input on unchanged (nothing is computed but
    the embeddings, masks and position embeddings)."""
    device = next(p.device for p in model.parameters())
    batches: list[Batch] = []
    current: list[tuple[tuple, dict]] = []
    saved = [layer.__dict__.get("forward") for layer in stack]

    def recorder(layer_index: int) -> Callable:
        def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
            current.append((args, kwargs))
            if layer_index == len(stack) - 1:
                raise _Reached
            return args[0] if args else kwargs["hidden_states"]
        return forward

    for index, layer in enumerate(stack):
        layer.forward = recorder(index)
    try:
        for inputs, mask in feeds(rows, device):
            _check(should_stop)
            current = []
            try:
                model(**inputs, use_cache=False, logits_to_keep=1)
            except _Reached:
                pass
            if len(current) != len(stack):
                raise RuntimeError(f"the model ran {len(current)} of its {len(stack)} decoder layers")
            args, kwargs = current[0]
            positional = bool(args)
            hidden = args[0] if positional else kwargs["hidden_states"]
            calls = [(a[1:], kw) if positional else (a, {k: v for k, v in kw.items() if k != "hidden_states"})
                     for a, kw in current]  # without the hidden states, which the cache replaces layer by layer
            batches.append(Batch(hidden, mask.to(device).bool(), calls, positional))
    finally:
        for layer, before in zip(stack, saved):
            if before is None:
                del layer.forward
            else:
                layer.forward = before
    return batches


def gather(layer: torch.nn.Module, index: int, group: list[Unit], batches: list[Batch],
           should_stop: Callable[[], bool] | None) -> None:
    """Run every batch through decoder layer `index` with the hooks of `group` on, stopping at its last unit."""
    current: dict[str, Any] = {}
    handles = [_register(unit, current) for unit in group]
    try:
        for batch in batches:
            _check(should_stop)
            current["mask"], current["waiting"] = batch.mask, set(group)
            try:
                batch.run(layer, index)
            except _Reached:
                pass
    finally:
        for handle in handles:
            handle.remove()


def _check(should_stop: Callable[[], bool] | None) -> None:
    if should_stop and should_stop():
        raise InterruptedError("stop requested")


BATCH_TOKENS = 1024
"""Positions per batch. A batch's activations and their fp32 products are the calibration's largest transient
(about 0.3 GB over 2048 tokens at TinyLlama's widths, in a whole-model pass); 1024 halves it for about 4% more
time on a GPTQ write (docs/benchmarks.md)."""


def feeds(rows: list[list[int]], device: torch.device) -> list[tuple[dict[str, Any], torch.Tensor]]:
    """Each batch's forward arguments and its real tokens: the rows' own `feeds(device)` where they have one
    (image rows with their pixels: vision_capture.py), else right-padded batches of token ids."""
    own = getattr(rows, "feeds", None)
    if own is not None:
        return own(device)
    return [({"input_ids": ids.to(device), "attention_mask": mask.to(device)}, mask) for ids, mask in _batches(rows)]


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


def _register(unit: Unit, current: dict[str, Any]) -> torch.utils.hooks.RemovableHandle:
    """The unit's pre-hook: its whole call to `add_call` where it has one, else the first input's real tokens
    to `add`; the group's last unit to be reached ends the run."""
    def reached() -> None:
        current["waiting"].discard(unit)
        if not current["waiting"]:
            raise _Reached

    if hasattr(unit, "add_call"):
        def call_hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            unit.add_call(args, kwargs)
            reached()
        return unit.module.register_forward_pre_hook(call_hook, with_kwargs=True)

    def hook(module: torch.nn.Module, args: tuple) -> None:
        x = args[0]
        mask = current.get("mask")
        unit.add(x[mask] if mask is not None and x.shape[:2] == mask.shape else x)
        reached()
    return unit.module.register_forward_pre_hook(hook)
