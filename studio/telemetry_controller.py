"""TelemetryController: where GPU samples and the worker's capabilities go.

GpuMonitor samples feed the memory chart's store, the GPU panel's readouts, the estimate's device
limit (the first GPU's memory, or system RAM without NVML) and, until a worker has reported its
capabilities, the status bar's environment check. The worker's pid (from WorkerReady) tells the
monitor whose memory to follow.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject

from backend.core.protocol import WorkerReady
from studio.main_window import MainWindow
from studio.services.environment_check import EnvironmentCheck
from studio.services.gpu_monitor import GpuMonitor
from studio.services.nvml_sampler import TelemetrySample
from studio.services.worker_client import WorkerClient
from studio.state.estimate_state import EstimateState
from studio.state.telemetry_store import TelemetryStore
from studio.widgets.gpu_panel_widget import GpuPanelWidget
from studio.widgets.units import human_bytes


class TelemetryController(QObject):
    """Routes GpuMonitor samples and WorkerReady capabilities to the views that show them."""

    def __init__(self, window: MainWindow, monitor: GpuMonitor, client: WorkerClient, store: TelemetryStore,
                 estimate: EstimateState, panel: GpuPanelWidget, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.window, self.monitor, self.client = window, monitor, client
        self.store, self.estimate, self.panel = store, estimate, panel
        self.environment: EnvironmentCheck | None = None
        self._confirmed = False
        monitor.sampled.connect(self._on_monitor_sampled)
        client.event_received.connect(self._on_client_event_received)
        client.running_changed.connect(self._on_client_running_changed)
        if monitor.latest is not None:
            self._on_monitor_sampled(monitor.latest)

    def _on_monitor_sampled(self, sample: TelemetrySample) -> None:
        self.store.add_sample(sample)
        self.panel.show_sample(sample)
        if sample.devices:
            device = sample.devices[0]
            self.estimate.set_device("cuda", device.total_bytes,
                                     f"GPU {device.index} ({device.name}): {human_bytes(device.total_bytes)}")
        elif sample.ram_total:
            self.estimate.set_device("cpu", sample.ram_total, f"no GPU: system RAM {human_bytes(sample.ram_total)}")
        if not self._confirmed and self.environment is None:
            self._show(EnvironmentCheck.before_worker(sample))

    def _on_client_event_received(self, event: Any) -> None:
        if isinstance(event, WorkerReady):
            self.monitor.set_worker_pid(event.pid or self.client.pid())
            self._confirmed = True
            self._show(EnvironmentCheck.from_capabilities(event.capabilities))

    def _on_client_running_changed(self, running: bool) -> None:
        if not running:
            self.monitor.set_worker_pid(None)

    def _show(self, check: EnvironmentCheck) -> None:
        self.environment = check
        self.window.set_environment(check.summary(), check.details())
