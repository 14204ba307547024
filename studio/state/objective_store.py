"""ObjectiveStore: the numbers and completions of a DPO, KTO or GRPO run, beside MetricStore's loss.

TRL logs each objective's own metrics (MetricsLogged.extra: rewards/chosen, reward, kl, ...); they
are kept here by name in bounded ring buffers, so a new metric needs no code to be stored. GRPO's
CompletionScored events are kept too, only the newest MAX_COMPLETIONS (a long run samples thousands).
An SFT run logs none of this, so the Train page knows from `kind()` whether to show the objective's charts.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Iterable

import numpy as np
from PySide6.QtCore import QObject, Signal

from backend.core.protocol import CompletionScored, MetricsLogged
from studio.state.series_buffer import SeriesBuffer

MAX_COMPLETIONS = 50
"""Completions kept for the live list (the newest)."""
PREFERENCE_KEYS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")
"""DPO's and KTO's implicit rewards: the metrics that say a run is a preference run."""
GRPO_KEYS = ("reward", "reward_std")
"""GRPO's mean reward and its spread: the metrics that say a run is a GRPO run."""
EMPTY = np.empty(0)


class ObjectiveStore(QObject):
    """Per-metric (step, value) series from MetricsLogged.extra, and the latest GRPO completions."""

    changed = Signal()
    """Emitted after metric points were added or the store was cleared."""
    completion_added = Signal(object)
    """Emitted with each CompletionScored kept (the list adds it on top)."""
    cleared = Signal()
    """Emitted when a new run starts: every series and completion is gone."""

    def __init__(self, capacity: int = 100_000, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.capacity = capacity
        self._series: dict[str, SeriesBuffer] = {}
        self.completions: deque[CompletionScored] = deque(maxlen=MAX_COMPLETIONS)
        """The newest completions, oldest first."""

    def apply(self, event: Any) -> None:
        """Take MetricsLogged.extra and CompletionScored; ignore everything else."""
        if isinstance(event, MetricsLogged) and event.extra:
            for name, value in event.extra.items():
                self._add(event.step, name, value)
            self.changed.emit()
        elif isinstance(event, CompletionScored):
            self.completions.append(event)
            self.completion_added.emit(event)

    def load_history(self, events: Iterable[dict[str, Any]], up_to_step: int | None = None) -> None:
        """A resumed run's recorded metrics and completions (events.jsonl dicts), up to a step."""
        for item in events:
            step = int(item.get("step", 0) or 0)
            if up_to_step is not None and step > up_to_step:
                continue
            if item.get("type") == "MetricsLogged":
                for name, value in (item.get("extra") or {}).items():
                    self._add(step, name, value if isinstance(value, (int, float)) else None)
            elif item.get("type") == "CompletionScored":
                try:
                    event = CompletionScored.model_validate(item)
                except ValueError:
                    continue
                self.completions.append(event)
                self.completion_added.emit(event)
        self.changed.emit()

    def clear(self) -> None:
        self._series.clear()
        self.completions.clear()
        self.cleared.emit()
        self.changed.emit()

    # --- reading ---------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Every metric seen so far, in the order it first came."""
        return list(self._series)

    def kind(self) -> str:
        """"grpo", "preference" (DPO or KTO) or "" (nothing objective-specific: SFT, or no step yet)."""
        if any(name in self._series for name in GRPO_KEYS):
            return "grpo"
        if any(name in self._series for name in PREFERENCE_KEYS):
            return "preference"
        return ""

    def reward_labels(self) -> list[str]:
        """GRPO's reward functions, from their rewards/<label>/mean metrics."""
        return [name[len("rewards/"):-len("/mean")] for name in self._series
                if name.startswith("rewards/") and name.endswith("/mean")]

    def arrays(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) of one metric (empty when it was never logged), for drawing."""
        buffer = self._series.get(name)
        return buffer.arrays() if buffer is not None else (EMPTY, EMPTY)

    def latest(self, name: str) -> float | None:
        buffer = self._series.get(name)
        return buffer.latest() if buffer is not None else None

    def count(self, name: str) -> int:
        buffer = self._series.get(name)
        return len(buffer) if buffer is not None else 0

    def _add(self, step: int, name: str, value: float | int | None) -> None:
        if value is None or value != value:
            return
        buffer = self._series.get(name)
        if buffer is None:
            buffer = self._series[name] = SeriesBuffer(self.capacity)
        buffer.append(step, float(value))
