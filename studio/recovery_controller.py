"""RecoveryController: what the Train page offers after a failed run, and what its buttons do.

An out-of-memory carries the worker's proposed fix (dotted config overrides): applying it changes
the draft config, so the Techniques page shows the new values, and Start again runs it. A crash or
a full disk offers Resume when the run left a complete checkpoint. Sample answers emitted during
training go to the page's sample list.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject

from backend.core.protocol import JobFailed
from studio.job_controller import JobOutcome
from studio.run_controller import RunController
from studio.state.config_state import ConfigState
from studio.widgets.failure_panel_widget import FailurePanelWidget

RESUMABLE = ("crashed", "disk_full")


class RecoveryController(QObject):
    """Shows failures on the Train page's failure panel and applies the fixes it offers."""

    def __init__(self, controller: RunController, config: ConfigState, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.controller, self.config = controller, config
        self.panel: FailurePanelWidget = controller.page.failure_panel
        jobs = controller.jobs
        jobs.ended.connect(self._on_jobs_ended)
        jobs.started.connect(lambda _folder: self.panel.clear())
        jobs.event_received.connect(controller.page.samples.apply)
        self.panel.fix_requested.connect(self._on_panel_fix_requested)
        self.panel.restart_requested.connect(self._on_panel_restart_requested)
        self.panel.resume_requested.connect(self._on_panel_resume_requested)

    def _checkpoint(self) -> str:
        folder = self.controller.jobs.folder
        checkpoint = folder.latest_checkpoint() if folder is not None else None
        return checkpoint.name if checkpoint is not None else ""

    def _on_jobs_ended(self, outcome: JobOutcome) -> None:
        event = outcome.event
        if isinstance(event, JobFailed) and event.kind in ("out_of_memory", *RESUMABLE):
            self.panel.show_failure(event, self._checkpoint())
        elif outcome.status == "crashed":
            self.panel.show_crash(outcome.report or outcome.message, self._checkpoint())

    def _on_panel_fix_requested(self, overrides: dict[str, Any]) -> None:
        for key, value in overrides.items():
            self.config.set(key, value)
        self.controller.state.note("Applied the fix: " + ", ".join(f"{k} = {v}" for k, v in overrides.items()))

    def _on_panel_restart_requested(self) -> None:
        self.controller.window.start_action.trigger()

    def _on_panel_resume_requested(self) -> None:
        self.controller.resume(self.controller.jobs.folder)
