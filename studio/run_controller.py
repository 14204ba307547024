"""RunController: what Start, Stop and closing the window do, and where worker news goes.

It is the only place that connects the window (what the person asks), the WorkerClient (the
process) and the state objects (what is shown), so each of those stays testable on its own.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Sequence

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QMessageBox

from backend.config import RunConfig
from backend.runs import RunFolder
from studio.main_window import MainWindow
from studio.services.worker_client import WorkerClient
from studio.state.form_values import FormValues
from studio.state.metric_store import MetricStore
from studio.state.run_state import RunState

CloseChoice = Literal["save", "discard", "cancel"]


class RunController(QObject):
    """Starts and stops runs on the window's request and routes worker events to state and view."""

    def __init__(self, window: MainWindow, client: WorkerClient, store: MetricStore, state: RunState,
                 config_factory: Callable[[FormValues], RunConfig],
                 worker_command: Sequence[str] | None = None,
                 worker_env: dict[str, str] | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.window, self.client, self.store, self.state = window, client, store, state
        self.config_factory = config_factory
        self.worker_command = list(worker_command) if worker_command else None
        self.worker_env = worker_env
        self.ask_stop_on_close: Callable[[], CloseChoice] = self._ask_stop_on_close
        """Asked when the window is closed during a run; tests replace it to skip the dialog."""
        self.folder: RunFolder | None = None
        self._close_when_idle = False

        window.start_requested.connect(self._on_window_start_requested)
        window.stop_requested.connect(self._on_window_stop_requested)
        window.close_guard = self._allow_close
        client.event_received.connect(self._on_client_event_received)
        client.worker_crashed.connect(self._on_client_worker_crashed)
        client.protocol_error.connect(self._on_client_protocol_error)
        client.log_line.connect(window.append_log)
        client.running_changed.connect(self._on_client_running_changed)
        state.changed.connect(self._on_state_changed)
        state.log_added.connect(window.append_log)
        self._on_state_changed()

    # --- requests from the window -----------------------------------------------------------------
    def _on_window_start_requested(self) -> None:
        if self.client.is_running():
            return
        try:
            config = self.config_factory(self.window.form_values())
        except ValueError as exc:  # ConfigError and pydantic's ValidationError are ValueErrors
            self.state.mark_error(str(exc))
            return
        try:
            folder = RunFolder.create(config)
        except OSError as exc:
            self.state.mark_error(f"could not create the run folder: {exc}")
            return
        self.folder = folder
        self.store.clear()
        self.state.begin(str(folder.path), config.train.max_steps)
        self.client.start(folder, config, command=self.worker_command, env=self.worker_env)

    def _on_window_stop_requested(self) -> None:
        if self.client.is_running():
            self.state.mark_stopping(save=True)
            self.client.stop(save=True)

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
        self.state.apply(event)

    def _on_client_worker_crashed(self, report: str) -> None:
        self.state.mark_crashed(report)
        self.window.set_status(self.state.message, details=report)

    def _on_client_protocol_error(self, message: str) -> None:
        self.state.note(f"Protocol error: {message}")

    def _on_client_running_changed(self, running: bool) -> None:
        self.window.set_running(running)
        if not running and self.state.running:
            # The process is gone but no terminal event reached the state (should not happen:
            # the client reports every ending); never leave the window saying "running".
            self.state.mark_crashed("the worker exited without reporting how")
        if not running and self._close_when_idle:
            self._close_when_idle = False
            self.window.close()

    def _on_state_changed(self) -> None:
        state = self.state
        self.window.set_status(state.message)
        self.window.set_progress(state.step, state.max_steps)
        self.window.set_tokens_per_s(state.tokens_per_s)
