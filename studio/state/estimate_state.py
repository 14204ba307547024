"""EstimateState: the memory estimate of the draft config on the detected device, kept current.

Any change to the draft schedules one recomputation on the next turn of the event loop (several
changes in a row cost one estimate). The estimator is pure Python and reads only config.json, so
this stays in the GUI thread: a few milliseconds.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from backend.config import ConfigError
from studio.state.config_state import ConfigState


def predicted_peak(breakdown: Any) -> int:
    """The estimator's tighter phase-by-phase peak when it gives one, else its total."""
    phases = (getattr(breakdown, "details", None) or {}).get("peak_phases") or {}
    peak = phases.get("peak")
    return int(peak) if isinstance(peak, (int, float)) and peak > 0 else int(breakdown.total_bytes)


class EstimateState(QObject):
    """Breakdown of the draft (or the reason there is none), the device limit, and the verdict."""

    changed = Signal()
    """Emitted after the estimate or the device limit changed."""

    def __init__(self, config: ConfigState, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._config = config
        self.breakdown: Any = None
        """The last Breakdown (backend.estimate), None when it could not be computed."""
        self.problem = ""
        """Why there is no estimate, in one line."""
        self.device = "cpu"
        self.limit_bytes: int | None = None
        self.limit_label = ""
        """What the limit is, e.g. "GPU 0 (NVIDIA H200): 139.8 GiB" or "System RAM: 15.6 GiB"."""
        self._answers: tuple[str, int | None] = ("", None)
        """(data path, its longest answer in tokens) from the Data page's measurement."""
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(0)
        self._timer.timeout.connect(self.recompute)
        config.changed.connect(self._on_config_changed)

    # --- inputs -------------------------------------------------------------------------------
    def set_device(self, device: str, limit_bytes: int | None, label: str) -> None:
        """The device the run will use and its memory; recomputes only when the device kind changed."""
        if (device, limit_bytes, label) == (self.device, self.limit_bytes, self.limit_label):
            return
        kind_changed = device != self.device
        self.device, self.limit_bytes, self.limit_label = device, limit_bytes, label
        if kind_changed:
            self.recompute()
        else:
            self.changed.emit()

    def set_longest_answer(self, data_path: str, tokens: int | None) -> None:
        """The Data page measured the data: logits are counted for its longest answer, not every position."""
        if (data_path, tokens) != self._answers:
            self._answers = (data_path, tokens)
            self._timer.start()

    @property
    def longest_answer(self) -> int | None:
        """The measured longest answer, when it belongs to the draft's data path."""
        path, tokens = self._answers
        return tokens if path and path == self._config.get("data.path") else None

    def _on_config_changed(self, key: str) -> None:
        if key != "name" and not key.startswith("export."):
            self._timer.start()

    def recompute(self) -> None:
        from backend.cpu_features import native_bf16
        from backend.estimate import estimate  # pure Python; imported when first needed

        self._timer.stop()
        try:
            config = self._config.config()
            hardware = config.hardware
            zero_stage = {"deepspeed_zero2": 2, "deepspeed_zero3": 3}.get(hardware.strategy, 0)
            self.breakdown = estimate(config.model.path, config, device=self.device,  # type: ignore[arg-type]
                                      num_gpus=hardware.num_processes, zero_stage=zero_stage,
                                      target_tokens=self.longest_answer, cpu_bf16=native_bf16())
            self.problem = ""
        except (ConfigError, ValueError, OSError, KeyError, TypeError, ZeroDivisionError) as exc:
            self.breakdown, self.problem = None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self.changed.emit()

    # --- outputs ------------------------------------------------------------------------------
    @property
    def total_bytes(self) -> int | None:
        """The sum of the parts (the Breakdown's total_bytes is its peak, `peak_bytes` here)."""
        return None if self.breakdown is None else int(self.breakdown.sum_bytes)

    @property
    def peak_bytes(self) -> int | None:
        return None if self.breakdown is None else predicted_peak(self.breakdown)

    def verdict(self) -> str:
        """fits | tight (the tighter peak fits, the sum of parts does not) | too_big | unknown."""
        if self.breakdown is None or not self.limit_bytes:
            return "unknown"
        if self.total_bytes is not None and self.total_bytes <= self.limit_bytes:
            return "fits"
        if self.peak_bytes is not None and self.peak_bytes <= self.limit_bytes:
            return "tight"
        return "too_big"
