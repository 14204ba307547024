"""GpuPanelWidget: live GPU (or, without NVML, worker process) readouts over the memory chart.

One line per device: memory used / total, utilisation, temperature, power, and what the worker
holds on it. Without an NVIDIA driver a single line says so and the charts show the worker's RAM
and CPU from psutil instead. Beside the memory chart, a utilisation chart (GPU busy %, or the
worker's CPU %). The legend names only what the memory chart draws.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSplitter, QVBoxLayout, QWidget

from backend.core.runs.memory_record import MemoryRecord
from studio.services.nvml_sampler import TelemetrySample
from studio.state.telemetry_store import TelemetryStore
from studio.widgets.memory_chart import ElapsedAxis, MemoryChart
from studio.widgets.metric_chart import MetricChart
from studio.widgets.units import human_bytes


def device_line(sample: TelemetrySample) -> list[str]:
    """The readout lines for one sample."""
    if not sample.devices:
        lines = [sample.note or "No GPU telemetry"]
        if sample.process_rss is not None:
            cpu = f", CPU {sample.process_cpu:.0f}%" if sample.process_cpu is not None else ""
            lines.append(f"Worker: RSS {human_bytes(sample.process_rss)}{cpu} · "
                         f"system RAM {human_bytes(sample.ram_used)} / {human_bytes(sample.ram_total)}")
        else:
            lines.append(f"System RAM {human_bytes(sample.ram_used)} / {human_bytes(sample.ram_total)} · "
                         "no worker running")
        return lines
    lines = []
    for d in sample.devices:
        bits = [f"GPU {d.index} {d.name}: {human_bytes(d.used_bytes)} / {human_bytes(d.total_bytes)}"]
        if d.utilization is not None:
            bits.append(f"{d.utilization:.0f}% busy")
        if d.temperature_c is not None:
            bits.append(f"{d.temperature_c:.0f} °C")
        if d.power_w is not None:
            bits.append(f"{d.power_w:.0f} W")
        if d.process_bytes is not None:
            bits.append(f"worker {human_bytes(d.process_bytes)}")
        lines.append(" · ".join(bits))
    return lines


class GpuPanelWidget(QWidget):
    """Readout lines, the memory chart and the utilisation chart; fed by `show_sample()`."""

    def __init__(self, store: TelemetryStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.readout = QLabel("Reading GPU telemetry…")
        self.readout.setWordWrap(True)
        self.readout.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.peak_label = QLabel()
        self.peak_label.setWordWrap(True)
        self.legend = QLabel()
        self.legend.setWordWrap(True)  # a narrow window wraps it between entries; the chart keeps its room
        self.memory_chart = MemoryChart(store)
        self.memory_chart.legend_changed.connect(self.legend.setText)
        self.util_chart = MetricChart(store, "utilization", "GPU utilisation", color="#a855f7", left="%",
                                      bottom="elapsed", axis_items={"bottom": ElapsedAxis("bottom")})
        self._nvml: bool | None = None
        charts = QSplitter(Qt.Orientation.Horizontal)
        charts.addWidget(self.memory_chart)
        charts.addWidget(self.util_chart)
        charts.setStretchFactor(0, 3)
        charts.setStretchFactor(1, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.readout)
        layout.addWidget(self.peak_label)
        layout.addWidget(self.legend)
        layout.addWidget(charts, 1)

    def show_sample(self, sample: TelemetrySample) -> None:
        self.readout.setText("\n".join(device_line(sample)))
        nvml = bool(sample.devices)
        if nvml != self._nvml:
            self._nvml = nvml
            self.util_chart.set_series("utilization" if nvml else "cpu",
                                       "GPU utilisation" if nvml else "Worker CPU (psutil)")

    def set_peaks(self, predicted: int | None, measured: int | None, measured_kind: str,
                  record: MemoryRecord | None = None) -> None:
        """Predicted (estimate) beside measured: the last run's memory.json where it wrote one, else
        the run's highest report."""
        text = f"Predicted peak {human_bytes(predicted)}" if predicted else "Predicted peak: no estimate"
        if record is not None:
            text += f" · last run: {record.comparison()}, {record.measured_kind}"
        elif measured:
            ratio = f" ({measured / predicted:.0%} of predicted)" if predicted else ""
            text += f" · measured {human_bytes(measured)} ({measured_kind}){ratio}"
        else:
            text += " · measured: after a run"
        self.peak_label.setText(text)
