"""How many CPU threads a run uses: measured on the run's own model and batch, not assumed.

The default (all cores but one) is right for models whose products are large, and wrong for small
ones: each parallel region wakes the sleeping threads (OMP_WAIT_POLICY=PASSIVE, so that an idle
worker does not spin a core away from the desktop), and a small model's step is hundreds of small
regions (docs/benchmarks.md, "Figures moved from docstrings"). Where the crossover lies depends on the model, the batch and the machine, so the worker measures:
before training, one forward and backward pass of the first micro-batch at the default thread
count, then at half of it, and so on down while that gets faster, keeping the fastest.

The passes leave no trace on training: they run with the random state forked and restored, the
gradients they make are dropped, and the optimizer does not exist yet; the loss curve is the one a
run pinned to the chosen count gives (a test holds that). Skipped where the person set
`train.cpu_threads`, on GPUs, under torch.compile (it would compile twice) and for distributed
ranks (which share the cores by rule); and not tried where even a pass at 100% MFU would take
half a second, nor continued where the first pass takes longer than `budget_s`: models that large
are the ones whose products use every thread, and measuring them would cost more than it saves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass
class ThreadChoice:
    threads: int
    seconds: dict[int, float] = field(default_factory=dict)  # thread count -> best pass time

    def summary(self) -> str:
        tried = ", ".join(f"{n} thread{'s' if n > 1 else ''} {1000 * s:.0f} ms"
                          for n, s in sorted(self.seconds.items(), reverse=True))
        return f"{self.threads} CPU thread{'s' if self.threads > 1 else ''} (one training pass measured: {tried})"


def choose_threads(step: Callable[[], None], start: int, *, budget_s: float = 2.0, repeats: int = 2,
                   clock: Callable[[], float] = time.perf_counter) -> ThreadChoice:
    """Run `step` at `start` threads, then halving, while it gets faster; leaves torch at the best count.

    Each count gets one untimed pass first (oneDNN builds its kernels per thread count), then the
    best of `repeats` timed passes, so that one interruption by another process does not decide.
    """
    choice = ThreadChoice(threads=start)
    if start <= 1:
        return choice
    candidates = [start]
    while candidates[-1] > 1:
        candidates.append(max(1, candidates[-1] // 2))
    for threads in candidates:
        torch.set_num_threads(threads)
        began = clock()
        step()
        if threads == start and clock() - began > budget_s:
            break  # a model this slow per pass keeps every thread busy; measuring would cost minutes
        times = []
        for _ in range(repeats):
            began = clock()
            step()
            times.append(clock() - began)
        choice.seconds[threads] = min(times)
        if choice.seconds[threads] < choice.seconds[choice.threads]:
            choice.threads = threads
        elif threads != start:
            break  # slower than the best so far: fewer threads will not turn that around
    torch.set_num_threads(choice.threads)
    return choice


def training_pass(trainer: Any, batch: dict[str, Any]) -> Callable[[], None]:
    """One forward and backward pass of `batch` through the trainer's own loss path, leaving no trace."""
    model = trainer.model
    inputs = trainer._prepare_inputs(batch)

    def run() -> None:
        was_training = model.training
        model.train()  # the training path: loss positions, dropout, last-layer rows
        try:
            with torch.random.fork_rng(devices=[]):
                trainer.compute_loss(model, dict(inputs)).backward()
        finally:
            model.zero_grad(set_to_none=True)
            if getattr(trainer, "rows", None) is not None:
                trainer.rows.mask = None
            model.train(was_training)

    return run
