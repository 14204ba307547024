"""RunController: what Start, Stop, Cancel, Resume and closing the window do, and where worker news goes.

It is the only place that connects the window's requests, the WorkerClient (the process) and the
state objects (what is shown), so each of those stays testable on its own.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QMessageBox

from backend.config import RunConfig
from backend.memory_record import MemoryRecord
from backend.paths import runs_dir
from backend.protocol import WorkerReady
from backend.runs import RunFolder
from studio.main_window import MainWindow
from studio.pages.runs_page import RunsPage
from studio.pages.train_page import TrainPage
from studio.services.worker_client import WorkerClient
from studio.state.estimate_state import EstimateState
from studio.state.metric_store import MetricStore
from studio.state.run_state import RunState
from studio.state.telemetry_store import TelemetryStore

CloseChoice = Literal["save", "discard", "cancel"]
READOUT_S = 0.25
"""Progress, status and speed readouts refresh at most four times a second while events stream
(a progress bar repaints itself at once on every change: a few milliseconds each)."""


def newest_resumable(root: Path) -> RunFolder | None:
    """The newest run folder under `root` with a complete checkpoint (folder names start with the time)."""
    if not root.is_dir():
        return None
    for child in sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name, reverse=True):
        folder = RunFolder(child)
        if folder.latest_checkpoint() is not None:
            return folder
    return None


class RunController(QObject):
    """Starts, stops and resumes runs on the window's request and routes worker events to state and views."""

    def __init__(self, window: MainWindow, train_page: TrainPage, runs_page: RunsPage, client: WorkerClient,
                 store: MetricStore, telemetry: TelemetryStore, state: RunState, estimate: EstimateState,
                 config_factory: Callable[[], RunConfig], worker_command: Sequence[str] | None = None,
                 worker_env: dict[str, str] | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.window, self.page, self.runs_page, self.client = window, train_page, runs_page, client
        self.store, self.telemetry, self.state, self.estimate = store, telemetry, state, estimate
        self.config_factory = config_factory
        """Builds the validated RunConfig of the window's setup; raises ConfigError naming the field."""
        self.worker_command = list(worker_command) if worker_command else None
        self.worker_env = worker_env
        self.ask_stop_on_close: Callable[[], CloseChoice] = self._ask_stop_on_close
        """Asked when the window is closed during a run; tests replace it to skip the dialog."""
        self.folder: RunFolder | None = None
        """The run folder of the current (or last) run."""
        self.capabilities: Any = None
        """The last WorkerReady's capabilities (None until a worker has run)."""
        self._close_when_idle = False
        self._shown_at, self._shown_status = 0.0, ""
        self._details = ""
        self._readout_timer = QTimer(self)
        self._readout_timer.setSingleShot(True)
        self._readout_timer.timeout.connect(self._show_state)

        window.start_requested.connect(self._on_window_start_requested)
        window.stop_requested.connect(self._on_window_stop_requested)
        window.cancel_requested.connect(self._on_window_cancel_requested)
        window.resume_requested.connect(self._on_window_resume_requested)
        runs_page.resume_requested.connect(self._on_runs_page_resume_requested)
        runs_page.running_dir = lambda: str(self.folder.path) if self.folder and self.client.is_running() else ""
        window.close_guard = self._allow_close
        client.event_received.connect(self._on_client_event_received)
        client.worker_crashed.connect(self._on_client_worker_crashed)
        client.protocol_error.connect(self._on_client_protocol_error)
        client.log_line.connect(window.append_log)
        client.running_changed.connect(self._on_client_running_changed)
        state.changed.connect(self._on_state_changed)
        state.log_added.connect(window.append_log)
        self._on_state_changed()
        self.update_resume_target()

    # --- requests from the window -----------------------------------------------------------------
    def _on_window_start_requested(self) -> None:
        if self.client.is_running():
            return
        try:
            config = self.config_factory()
        except ValueError as exc:  # ConfigError and pydantic's ValidationError are ValueErrors
            self.state.mark_error(str(exc))
            return
        try:
            folder = RunFolder.create(config)
        except OSError as exc:
            self.state.mark_error(f"could not create the run folder: {exc}")
            return
        self._launch(folder, config, resume=False)

    def _on_window_stop_requested(self) -> None:
        if self.client.is_running():
            self.state.mark_stopping(save=True)
            self.client.stop(save=True)

    def _on_window_cancel_requested(self) -> None:
        if self.client.is_running():
            self.state.mark_stopping(save=False)
            self.client.stop(save=False)

    def _on_window_resume_requested(self) -> None:
        self.resume(self.resume_candidate())

    def _on_runs_page_resume_requested(self, path: str) -> None:
        self.resume(RunFolder(path))
        self.window.show_page("train")

    def resume_candidate(self) -> RunFolder | None:
        """The run Resume continues: the one selected on the Runs page, else the last run here,
        else the newest run on disk, whichever first has a complete checkpoint."""
        selected = [RunFolder(s.path) for s in self.runs_page.selected()]
        for folder in [*selected[:1], *([self.folder] if self.folder else [])]:
            if folder.latest_checkpoint() is not None:
                return folder
        return newest_resumable(runs_dir())

    def resume(self, folder: RunFolder | None) -> None:
        if self.client.is_running():
            return
        checkpoint = folder.latest_checkpoint() if folder is not None else None
        if folder is None or checkpoint is None:
            self.state.mark_error("no run with a complete checkpoint to resume")
            return
        try:
            config = folder.load_config()
        except ValueError as exc:
            self.state.mark_error(f"cannot resume {folder.run_id}: {exc}")
            return
        step = int(checkpoint.name.rsplit("-", 1)[-1]) if checkpoint.name.rsplit("-", 1)[-1].isdigit() else None
        self._launch(folder, config, resume=True, history_up_to=step)

    def _launch(self, folder: RunFolder, config: RunConfig, resume: bool, history_up_to: int | None = None) -> None:
        self.folder = folder
        self.store.clear()
        self.telemetry.clear()
        if resume:
            self.store.load_history(folder.iter_events(), up_to_step=history_up_to)
        self.page.gpu_panel.memory_chart.set_predicted_peak(self.estimate.peak_bytes)
        self._details = ""
        self.state.begin(str(folder.path), config.train.max_steps)
        self.client.start(folder, config, resume=resume, command=self.worker_command, env=self.worker_env)

    def _allow_close(self) -> bool:
        """Close at once when idle; during a run, stop first (asking how) and close once it exits."""
        if not self.client.is_running():
            return True
        choice = self.ask_stop_on_close()
        if choice == "cancel":
            return False
        self._close_when_idle = True
        if choice == "save":
            self.state.mark_stopping(save=True)
            self.client.stop(save=True)
        else:
            self.client.kill()
        return False

    def _ask_stop_on_close(self) -> CloseChoice:
        box = QMessageBox(QMessageBox.Icon.Question, "A run is in progress",
                          "Stop the run before closing?", parent=self.window)
        box.setInformativeText("Stop and save writes a checkpoint you can resume from; the window "
                               "closes when the worker has finished.")
        save = box.addButton("Stop and save", QMessageBox.ButtonRole.AcceptRole)
        discard = box.addButton("Discard run", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(save)
        box.exec()
        clicked = box.clickedButton()
        return "save" if clicked is save else "discard" if clicked is discard else "cancel"

    # --- news from the worker ---------------------------------------------------------------------
    def _on_client_event_received(self, event: Any) -> None:
        self.store.apply(event)
        self.telemetry.apply(event)
        self.state.apply(event)
        if isinstance(event, WorkerReady):
            self.capabilities = event.capabilities

    def _on_client_worker_crashed(self, report: str) -> None:
        self._details = report  # the crash report (log tails) shows as the status line's tooltip
        self.state.mark_crashed(report)
        self._show_state()

    def _on_client_protocol_error(self, message: str) -> None:
        self.state.note(f"Protocol error: {message}")

    def _on_client_running_changed(self, running: bool) -> None:
        self.window.set_running(running)
        if not running and self.state.running:
            # The process is gone but no terminal event reached the state (should not happen:
            # the client reports every ending); never leave the window saying "running".
            self.state.mark_crashed("the worker exited without reporting how")
        if not running:
            self._show_state()
            self.update_resume_target()
            self.show_peaks()
            if self.runs_page.isVisible():
                self.runs_page.refresh()
        if not running and self._close_when_idle:
            self._close_when_idle = False
            self.window.close()

    def _on_state_changed(self) -> None:
        """Show the state: at once outside a run or when its status changed, else at most every
        READOUT_S (a stream of MetricsLogged must not repaint the readouts a hundred times a second)."""
        if self._readout_timer.isActive():
            return
        wait = READOUT_S - (time.monotonic() - self._shown_at)
        if not self.state.running or self.state.status != self._shown_status or wait <= 0:
            self._show_state()
        else:
            self._readout_timer.start(int(wait * 1000) + 1)

    def _show_state(self) -> None:
        self._readout_timer.stop()
        state = self.state
        self._shown_at, self._shown_status = time.monotonic(), state.status
        self.page.set_status(state.message, details=self._details)
        self.window.run_status.setText(state.message)
        self.page.set_progress(state.step, state.max_steps, state.eta_s if state.running else None)
        self.page.set_throughput(state.tokens_per_s, state.mfu, state.compile_seconds)
        self.page.set_plan(state.plan)

    # --- readouts ---------------------------------------------------------------------------------
    def show_peaks(self) -> None:
        """Predicted peak beside the measured one: during a run the estimate it started with, else the
        current one (as the Techniques page shows it), with the last run's memory.json where it wrote one."""
        running = self.client.is_running()
        predicted = self.page.gpu_panel.memory_chart.predicted_peak if running else None
        self.page.gpu_panel.set_peaks(predicted or self.estimate.peak_bytes, self.telemetry.measured_peak,
                                      self.telemetry.measured_kind, None if running else self.memory_record())

    def memory_record(self) -> MemoryRecord | None:
        """The last run's predicted and measured memory (None before a run, or when it wrote none)."""
        return MemoryRecord.read(self.folder.path) if self.folder is not None else None

    def follow_estimate(self) -> None:
        """Between runs the Train page's predicted peak follows the draft's estimate."""
        if not self.client.is_running():
            self.show_peaks()

    def update_resume_target(self) -> None:
        folder = self.resume_candidate()
        checkpoint = folder.latest_checkpoint() if folder is not None else None
        self.window.set_resume_target(f"{folder.run_id} from {checkpoint.name}" if folder and checkpoint else "")
