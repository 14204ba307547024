"""GpuMonitor: samples the GPUs and the worker process on a timer, from the moment the window opens.

The sampler is injectable: the default is NvmlSampler (NVML, falling back to psutil without a
driver); tests and benchmarks pass a callable that returns scripted TelemetrySamples. A sampler
that raises is reported once in `latest.note` and the timer keeps going: telemetry must never be
the thing that breaks the studio.
"""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, QTimer, Signal

from studio.services.nvml_sampler import NvmlSampler, Sampler, TelemetrySample

DEFAULT_INTERVAL_MS = 1000
"""1 Hz: NVML itself refreshes utilisation about every 1/6 s to 1 s, so faster shows nothing new."""


class GpuMonitor(QObject):
    """Calls `sampler(worker_pid)` every `interval_ms` and emits the result."""

    sampled = Signal(object)
    """Emitted with each TelemetrySample, about once a second."""

    def __init__(self, sampler: Sampler | None = None, interval_ms: int = DEFAULT_INTERVAL_MS,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._sampler: Sampler = sampler if sampler is not None else NvmlSampler()
        self._pid: int | None = None
        self._failed = ""
        self.latest: TelemetrySample | None = None
        """The newest sample (None until the first one)."""
        self._timer = QTimer(self)
        self._timer.setInterval(interval_ms)
        self._timer.timeout.connect(self._on_timer_timeout)

    @property
    def worker_pid(self) -> int | None:
        return self._pid

    def start(self) -> None:
        """Take a sample now, then one per interval."""
        self._timer.start()
        self.sample_now()

    def stop(self) -> None:
        self._timer.stop()
        close = getattr(self._sampler, "close", None)
        if callable(close):
            close()

    def is_active(self) -> bool:
        return self._timer.isActive()

    def set_worker_pid(self, pid: int | None) -> None:
        """Follow this process (the running worker); None when no worker runs."""
        self._pid = pid or None

    def sample_now(self) -> TelemetrySample:
        try:
            sample = self._sampler(self._pid)
        except Exception as exc:  # a broken sampler: say it once, keep the studio alive
            if not self._failed:
                self._failed = f"telemetry unavailable: {exc}"
            sample = TelemetrySample(time=time.monotonic(), nvml=False, note=self._failed)
        self.latest = sample
        self.sampled.emit(sample)
        return sample

    def _on_timer_timeout(self) -> None:
        self.sample_now()
