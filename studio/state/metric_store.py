"""MetricStore: the numbers of the current run, in bounded ring buffers.

A long run logs every step; ring buffers keep memory flat (the oldest points go first) and let the
chart redraw from plain sequences. Views listen to `changed`; nothing here knows about drawing.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from PySide6.QtCore import QObject, Signal

from backend.core.protocol import EvalFinished, MetricsLogged
from studio.state.objective_store import ObjectiveStore
from studio.state.series_buffer import SeriesBuffer

SERIES = ("loss", "learning_rate", "grad_norm", "tokens_per_s", "memory_allocated", "eval_loss")
"""Names accepted by `series()` and `latest()`."""


class MetricStore(QObject):
    """Per-series (step, value) ring buffers fed by MetricsLogged and EvalFinished events."""

    changed = Signal()
    """Emitted after points were added or the store was cleared."""

    def __init__(self, capacity: int = 100_000, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.capacity = capacity
        self._series = {name: SeriesBuffer(capacity) for name in SERIES}
        self.step = 0
        self.max_steps = 0
        self.objective = ObjectiveStore(capacity, parent=self)
        """DPO/KTO/GRPO metrics and GRPO's completions of the same run (fed through `apply`)."""

    def apply(self, event: Any) -> None:
        """Take the events that carry numbers; ignore the rest (so it can listen to every event)."""
        self.objective.apply(event)
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

    def load_history(self, events: Iterable[dict[str, Any]], up_to_step: int | None = None) -> None:
        """Put a run's recorded events back (MetricsLogged and EvalFinished dicts from events.jsonl),
        up to a step: what the chart showed before the run was stopped, so a resume continues it."""
        events = list(events)
        self.objective.load_history(events, up_to_step)
        for item in events:
            kind, step = item.get("type"), int(item.get("step", 0) or 0)
            if up_to_step is not None and step > up_to_step:
                continue
            names = ("loss", "learning_rate", "grad_norm", "tokens_per_s") if kind == "MetricsLogged" else \
                ("eval_loss",) if kind == "EvalFinished" else ()
            for name in names:
                value = item.get(name)
                self._add(step, name, value if isinstance(value, (int, float)) else None)
            if kind == "MetricsLogged":
                self.step, self.max_steps = step, int(item.get("max_steps", 0) or 0)
        self.changed.emit()

    def clear(self) -> None:
        """Forget every point (a new run starts)."""
        for buffer in self._series.values():
            buffer.clear()
        self.objective.clear()
        self.step = self.max_steps = 0
        self.changed.emit()

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one series, oldest first."""
        steps, values = self._series[name].lists()
        return [int(s) for s in steps], values

    def arrays(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) as numpy views for drawing (valid until the next event)."""
        return self._series[name].arrays()

    def latest(self, name: str) -> float | None:
        return self._series[name].latest()

    def count(self, name: str = "loss") -> int:
        return len(self._series[name])

    def _add(self, step: int, name: str, value: float | int | None) -> None:
        if value is None or value != value:  # None or NaN: no point (a gap, not a zero)
            return
        self._series[name].append(step, float(value))
