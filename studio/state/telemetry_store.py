"""TelemetryStore: memory and utilisation over time, in ring buffers on one time axis.

Two sources meet here: the GpuMonitor's samples (NVML, or psutil without a driver) and the worker's
own allocator figures (MetricsLogged.memory, TelemetrySampled). Both are stamped on arrival with
the studio's monotonic clock, so they share one axis without trusting two processes' clocks to
agree. Evaluations and checkpoint saves become markers on the same axis.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal

import numpy as np

from backend.core.protocol import CheckpointSaved, EvalFinished, MetricsLogged, TelemetrySampled
from studio.services.nvml_sampler import TelemetrySample
from studio.state.series_buffer import SeriesBuffer

SERIES = ("gpu_used", "reserved", "allocated", "rss", "utilization", "cpu")
"""gpu_used: NVML memory of the worker's process (or of its device); reserved / allocated: the
torch caching allocator; rss: the worker's resident memory (psutil); utilization: GPU busy percent;
cpu: the worker's CPU percent."""

MARKER_CAPACITY = 500
"""Markers kept (evaluations and saves); more would only clutter the chart."""


class TelemetryStore(QObject):
    """Per-series (seconds, value) ring buffers, event markers, and the run's measured peak."""

    changed = Signal()
    """Emitted after points or markers were added, or the store was cleared."""

    def __init__(self, capacity: int = 100_000, clock: Callable[[], float] = time.monotonic,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._clock = clock
        self._origin = clock()
        self._series = {name: SeriesBuffer(capacity) for name in SERIES}
        self.markers: deque[tuple[float, str, int]] = deque(maxlen=MARKER_CAPACITY)
        """(seconds, "eval" or "save", step), oldest first."""
        self.measured_peak: int | None = None
        """Highest memory the worker reported: torch's peak allocated on a GPU, else its RSS."""
        self.measured_kind = ""
        """"peak allocated" (GPU) or "worker RSS" (CPU): what measured_peak is."""
        self.device_total: int | None = None
        """Memory of the device the run uses (GPU total, or system RAM without NVML)."""

    # --- feeding ------------------------------------------------------------------------------
    def now(self) -> float:
        return self._clock() - self._origin

    def apply(self, event: Any) -> None:
        """Take the worker's memory figures and markers; ignore other events."""
        if isinstance(event, (MetricsLogged, TelemetrySampled)):
            t = self.now()
            memory = event.memory
            self._add(t, "reserved", memory.reserved_bytes)
            self._add(t, "allocated", memory.allocated_bytes)
            if memory.peak_bytes is not None:
                self._peak(memory.peak_bytes, "peak allocated")
            elif memory.rss_bytes is not None and self.measured_kind != "peak allocated":
                self._peak(memory.rss_bytes, "worker RSS")
            self.changed.emit()
        elif isinstance(event, (EvalFinished, CheckpointSaved)):
            self.markers.append((self.now(), "eval" if isinstance(event, EvalFinished) else "save", event.step))
            self.changed.emit()

    def add_sample(self, sample: TelemetrySample, device_index: int = 0) -> None:
        """A GpuMonitor reading: GPU memory and utilisation when NVML works, else the worker's RSS."""
        t = sample.time - self._origin
        if sample.devices:
            index = device_index if device_index < len(sample.devices) else 0
            device = sample.devices[index]
            used = device.process_bytes if device.process_bytes is not None else device.used_bytes
            self._add(t, "gpu_used", used)
            self._add(t, "utilization", device.utilization)
            self.device_total = device.total_bytes
        else:
            self.device_total = sample.ram_total or self.device_total
        self._add(t, "rss", sample.process_rss)
        self._add(t, "cpu", sample.process_cpu)
        self.changed.emit()

    def clear(self) -> None:
        """Forget everything and restart the time axis at zero (a new run starts)."""
        self._origin = self._clock()
        for buffer in self._series.values():
            buffer.clear()
        self.markers.clear()
        self.measured_peak = None
        self.measured_kind = ""
        self.changed.emit()

    # --- reading ------------------------------------------------------------------------------
    def series(self, name: str) -> tuple[list[float], list[float]]:
        """(seconds since the run started, values), oldest first."""
        return self._series[name].lists()

    def arrays(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(seconds, values) as numpy views for drawing (valid until the next sample)."""
        return self._series[name].arrays()

    def count(self, name: str) -> int:
        return len(self._series[name])

    def latest(self, name: str) -> float | None:
        return self._series[name].latest()

    def _add(self, t: float, name: str, value: float | int | None) -> None:
        if value is None or value != value:
            return
        self._series[name].append(t, float(value))

    def _peak(self, value: int, kind: str) -> None:
        if self.measured_kind != kind:
            self.measured_peak, self.measured_kind = value, kind
        elif self.measured_peak is None or value > self.measured_peak:
            self.measured_peak = value
