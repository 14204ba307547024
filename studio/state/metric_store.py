"""MetricStore: the numbers of the current run, in bounded ring buffers.

A long run logs every step; ring buffers keep memory flat (the oldest points go first) and let the
chart redraw from plain sequences. Views listen to `changed`; nothing here knows about drawing.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from PySide6.QtCore import QObject, Signal

from backend.protocol import EvalFinished, MetricsLogged

SERIES = ("loss", "learning_rate", "grad_norm", "tokens_per_s", "memory_allocated", "eval_loss")
"""Names accepted by `series()` and `latest()`."""


class MetricStore(QObject):
    """Per-series (step, value) ring buffers fed by MetricsLogged and EvalFinished events."""

    changed = Signal()
    """Emitted after points were added or the store was cleared."""

    def __init__(self, capacity: int = 100_000, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.capacity = capacity
        self._steps: dict[str, deque[int]] = {name: deque(maxlen=capacity) for name in SERIES}
        self._values: dict[str, deque[float]] = {name: deque(maxlen=capacity) for name in SERIES}
        self.step = 0
        self.max_steps = 0

    def apply(self, event: Any) -> None:
        """Take the events that carry numbers; ignore the rest (so it can listen to every event)."""
        if isinstance(event, MetricsLogged):
            self.step, self.max_steps = event.step, event.max_steps
            self._add(event.step, "loss", event.loss)
            self._add(event.step, "learning_rate", event.learning_rate)
            self._add(event.step, "grad_norm", event.grad_norm)
            self._add(event.step, "tokens_per_s", event.tokens_per_s)
            self._add(event.step, "memory_allocated", event.memory.allocated_bytes)
            self.changed.emit()
        elif isinstance(event, EvalFinished) and event.eval_loss is not None:
            self._add(event.step, "eval_loss", event.eval_loss)
            self.changed.emit()

    def clear(self) -> None:
        """Forget every point (a new run starts)."""
        for name in SERIES:
            self._steps[name].clear()
            self._values[name].clear()
        self.step = self.max_steps = 0
        self.changed.emit()

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one series, oldest first."""
        return list(self._steps[name]), list(self._values[name])

    def latest(self, name: str) -> float | None:
        values = self._values[name]
        return values[-1] if values else None

    def count(self, name: str = "loss") -> int:
        return len(self._values[name])

    def _add(self, step: int, name: str, value: float | int | None) -> None:
        if value is None or value != value:  # None or NaN: no point (a gap, not a zero)
            return
        self._steps[name].append(step)
        self._values[name].append(float(value))
