"""RunController: what Start, Stop, Cancel, Resume and closing the window do, and where worker news goes.

It is the only place that connects the window's requests, the WorkerClient (the process) and the
state objects (what is shown), so each of those stays testable on its own.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Literal

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication, QInputDialog, QLineEdit, QMessageBox

from backend.core.config.run_config import RunConfig
from backend.core.runs.memory_record import MemoryRecord
from backend.core.protocol import WorkerReady
from backend.api.distributed import RENDEZVOUS_HINT, rendezvous_wait
from backend.api.run_index import RunIndex
from backend.core.runs.run_continuation import checkpoint_step, continue_run, resume_mismatch
from backend.core.runs.run_folder import RunFolder
from studio.job_controller import JobController, JobOutcome
from studio.main_window import MainWindow
from studio.pages.runs_page import RunsPage
from studio.pages.train_page import TrainPage
from studio.state.estimate_state import EstimateState
from studio.state.metric_store import MetricStore
from studio.state.run_state import READY, RunState
from studio.state.telemetry_store import TelemetryStore
from studio.widgets.run_picker_widget import resume_words

CloseChoice = Literal["save", "discard", "cancel"]
NOT_READY = "Not ready: Start waits for the problems listed below."
READOUT_S = 0.25
"""Progress, status and speed readouts refresh at most four times a second while events stream
(a progress bar repaints itself at once on every change: a few milliseconds each)."""


INTERRUPTED = ("incomplete", "stopped", "failed")
"""Statuses of a run that ended before its last step (the window closed, Stop, a crash): Resume's first offer."""


def newest_resumable(index: RunIndex) -> RunFolder | None:
    """The run Resume offers after a restart: the newest interrupted run with a complete checkpoint, else
    the newest finished one (to train more). A cancelled run was thrown away on purpose: never offered.
    The statuses come from the run index, which re-reads only the runs whose events changed."""
    finished = None
    for summary in index.sync():  # newest first
        folder = RunFolder(summary.path)
        if folder.latest_checkpoint() is None:
            continue
        if summary.status in INTERRUPTED:
            return folder
        if summary.status == "finished" and finished is None:
            finished = folder
    return finished


class RunController(QObject):
    """Starts, stops and resumes runs on the window's request and routes worker events to state and views."""

    def __init__(self, window: MainWindow, train_page: TrainPage, runs_page: RunsPage, jobs: JobController,
                 store: MetricStore, telemetry: TelemetryStore, state: RunState, estimate: EstimateState,
                 config_factory: Callable[[], RunConfig], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.window, self.page, self.runs_page, self.jobs = window, train_page, runs_page, jobs
        self.store, self.telemetry, self.state, self.estimate = store, telemetry, state, estimate
        self.config_factory = config_factory
        """Builds the validated RunConfig of the window's setup; raises ConfigError naming the field."""
        self.ask_stop_on_close: Callable[[], CloseChoice] = self._ask_stop_on_close
        """Asked when the window is closed during a run; tests replace it to skip the dialog."""
        self.ask_more_steps: Callable[[RunFolder, int], int | None] = self._ask_more_steps
        """Asked how many more steps to train a finished run (None: not now); tests replace it."""
        self.folder: RunFolder | None = None
        """The run the Train page shows: the one started, resumed or continued last in this window."""
        self._started_over = False
        """The draft was replaced since the last run: Resume offers no run of the old setup."""
        self.capabilities: Any = None
        """The last WorkerReady's capabilities (None until a worker has run)."""
        self._close_when_idle = False
        self._shown_at, self._shown_status = 0.0, ""
        self._details = ""
        self._history: tuple[RunFolder, int | None] | None = None
        """(folder, step) whose past metrics a resumed run's charts start with."""
        self._rendezvous = ""
        self._rendezvous_timer = QTimer(self)
        self._rendezvous_timer.setSingleShot(True)
        self._rendezvous_timer.timeout.connect(self._on_rendezvous_timer_timeout)
        self._readout_timer = QTimer(self)
        self._readout_timer.setSingleShot(True)
        self._readout_timer.timeout.connect(self._show_state)

        window.start_requested.connect(self.start)
        train_page.start_anyway_requested.connect(self._on_page_start_anyway_requested)
        window.stop_requested.connect(self._on_window_stop_requested)
        window.cancel_requested.connect(self._on_window_cancel_requested)
        window.resume_requested.connect(self._on_window_resume_requested)
        runs_page.resume_requested.connect(self._on_runs_page_resume_requested)
        window.add_close_guard(self._allow_close)
        jobs.started.connect(self._on_jobs_started)
        jobs.event_received.connect(self._on_jobs_event_received)
        jobs.ended.connect(self._on_jobs_ended)
        jobs.protocol_error.connect(self._on_jobs_protocol_error)
        jobs.log_line.connect(window.append_log)
        jobs.running_changed.connect(self._on_jobs_running_changed)
        state.changed.connect(self._on_state_changed)
        state.log_added.connect(window.append_log)
        self._on_state_changed()
        self.update_resume_target()

    # --- requests from the window -----------------------------------------------------------------
    def _on_page_start_anyway_requested(self) -> None:
        self.start(anyway=True)

    def start(self, anyway: bool = False) -> None:
        """A new run of the draft, once the verdicts, judged again now (a data file deleted since the last
        change), let it; `anyway` overrides the memory verdict and records that in the run folder."""
        if self.jobs.is_running():
            return
        focused = QApplication.focusWidget()
        if isinstance(focused, QLineEdit):
            focused.editingFinished.emit()  # a name typed, then Ctrl+Return: the run gets that name
        try:
            config = self.config_factory()
        except ValueError as exc:  # ConfigError and pydantic's ValidationError are ValueErrors
            self.state.mark_error(str(exc))
            return
        self.estimate.recompute()
        blocker = self.estimate.start_blocker(anyway=anyway)
        if blocker:
            self.state.mark_error(blocker.splitlines()[0])
            return
        overridden = self.estimate.blocking_lines() if anyway else []
        try:
            folder = RunFolder.create(config)
            if overridden:
                folder.record_started_anyway(overridden)
        except OSError as exc:
            self.state.mark_error(f"could not create the run folder: {exc}")
            return
        self._launch(folder, config, resume=False)

    def _on_window_stop_requested(self) -> None:
        if self.jobs.is_running():
            self.state.mark_stopping(save=True)
            self.jobs.stop(save=True)

    def _on_window_cancel_requested(self) -> None:
        if self.jobs.is_running():
            self.state.mark_stopping(save=False)
            self.jobs.cancel()

    def _on_window_resume_requested(self) -> None:
        folder = self.resume_candidate()
        if folder is not None and folder.status() == "finished":
            self.train_more(folder)
        else:
            self.resume(folder)

    def _on_runs_page_resume_requested(self, path: str) -> None:
        """Resume or train more, then show the Train page; a "train more" the person cancelled stays here."""
        folder = RunFolder(path)
        if folder.status() == "finished":
            if not self.train_more(folder):
                return
        else:
            self.resume(folder)
        self.window.show_page("train")

    def resume_candidate(self) -> RunFolder | None:
        """The run Resume continues: the one the Train page shows; before any run in this window, the
        newest interrupted run on disk (else the newest finished one, to train more; see newest_resumable).
        Named on the button, never a hidden selection."""
        if self.folder is not None:
            return self.folder if self.folder.latest_checkpoint() is not None else None
        return None if self._started_over else newest_resumable(self.runs_page.index())

    def forget_run(self) -> None:
        """Another preset or config file replaced the draft: the Train page drops the last run's charts,
        plan, readouts and Resume target (the Runs page still resumes any run). Not during a run."""
        if self.jobs.is_running():
            return
        self.folder, self._history, self._details, self._started_over = None, None, "", True
        self.store.clear()
        self.telemetry.clear()
        self.page.clear_run()
        self.state.reset()
        self.show_peaks()
        self.update_resume_target()

    def resume(self, folder: RunFolder | None) -> None:
        """Continue an unfinished run in its own folder from its newest complete checkpoint."""
        if self.jobs.is_running():
            return
        checkpoint = folder.latest_checkpoint() if folder is not None else None
        if folder is None or checkpoint is None:
            self.state.mark_error("no run with a complete checkpoint to resume")
            return
        if folder.status() == "finished":
            self.state.mark_error(f"{folder.run_id} has finished: train it for more steps instead "
                                  "(a new run; the finished one is kept as it is)")
            return
        try:
            config = folder.load_config()
        except ValueError as exc:
            self.state.mark_error(f"cannot resume {folder.run_id}: {exc}")
            return
        mismatch = resume_mismatch(checkpoint, config)
        if mismatch:
            self.state.mark_error(f"cannot resume {folder.run_id}: {mismatch}")
            return
        self._launch(folder, config, resume=True, history_up_to=checkpoint_step(checkpoint))

    def train_more(self, source: RunFolder, steps: int | None = None) -> bool:
        """Train a finished run for `steps` more (asked when None) as a new run; the finished one is untouched.
        False when nothing happened: a run in progress, or the person cancelled the question."""
        if self.jobs.is_running():
            return False
        try:
            checkpoint = source.latest_checkpoint()  # an epoch-counted run: as many steps again as it took
            default = source.load_config().train.max_steps or (checkpoint_step(checkpoint) if checkpoint else 1)
        except ValueError as exc:
            self.state.mark_error(f"cannot continue {source.run_id}: {exc}")
            return True
        steps = steps if steps is not None else self.ask_more_steps(source, default)
        if not steps:
            return False
        try:
            folder = continue_run(source, steps)
            config = folder.load_config()
        except (OSError, ValueError) as exc:
            self.state.mark_error(f"cannot continue {source.run_id}: {exc}")
            return True
        checkpoint = folder.latest_checkpoint()
        self.state.note(f"Training {source.run_id} for {steps} more steps as a new run, {folder.run_id} "
                        f"(from its {checkpoint.name if checkpoint else 'checkpoint'}; the finished run is kept)")
        self._launch(folder, config, resume=True, history_up_to=checkpoint_step(checkpoint) if checkpoint else None)
        return True

    def _launch(self, folder: RunFolder, config: RunConfig, resume: bool, history_up_to: int | None = None) -> None:
        self.folder = folder
        self._history = (folder, history_up_to) if resume else None
        self._details = ""
        self.state.begin(str(folder.path), config.train.max_steps or 0)  # num_epochs: known from the worker
        self.jobs.start(folder, config, job="finetune", resume=resume)
        if config.hardware.num_machines > 1:
            notice, failure = rendezvous_wait(config)
            self.state.note(notice[0].upper() + notice[1:])
            self._rendezvous = failure
            self._rendezvous_timer.start(config.hardware.rendezvous_timeout_s * 1000)

    def _on_rendezvous_timer_timeout(self) -> None:
        if self.jobs.is_running() and self.jobs.status == "starting":  # no JobStarted: nobody joined
            self.jobs.give_up(self._rendezvous, RENDEZVOUS_HINT)

    def _on_jobs_started(self, folder: RunFolder) -> None:
        """A new run: nothing the previous one showed stays on the Train page."""
        self.runs_page.set_running_dir(str(folder.path))
        self.store.clear()
        self.telemetry.clear()
        self.page.clear_run()
        if self._history is not None and self._history[0] is folder:
            self.store.load_history(folder.iter_events(), up_to_step=self._history[1])
        self.page.gpu_panel.memory_chart.set_predicted_peak(self.estimate.peak_bytes)
        self.show_peaks()
        self.update_resume_target()

    def _allow_close(self) -> bool:
        """Close at once when idle; during a run, stop first (asking how) and close once it exits."""
        if not self.jobs.is_running():
            return True
        choice = self.ask_stop_on_close()
        if choice == "cancel":
            return False
        self._close_when_idle = True
        if choice == "save":
            self.state.mark_stopping(save=True)
            self.jobs.stop(save=True)
        else:
            self.jobs.kill()
        return False

    def _ask_stop_on_close(self) -> CloseChoice:
        box = QMessageBox(QMessageBox.Icon.Question, "A run is in progress",
                          "Stop the run before closing?", parent=self.window)
        box.setInformativeText("Stop and save writes a checkpoint you can resume from; the window "
                               "closes when the worker has finished.")
        save = box.addButton("Stop and save, then close", QMessageBox.ButtonRole.AcceptRole)
        discard = box.addButton("Stop without saving, then close", QMessageBox.ButtonRole.DestructiveRole)
        keep = box.addButton("Keep the window open", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(save)
        box.setEscapeButton(keep)
        box.exec()
        clicked = box.clickedButton()
        return "save" if clicked is save else "discard" if clicked is discard else "cancel"

    def _ask_more_steps(self, source: RunFolder, default: int) -> int | None:
        steps, ok = QInputDialog.getInt(self.window, "Train more steps",
                                        f"{source.run_id} has finished. Train it for how many more steps? "
                                        "(A new run starts from its last checkpoint; the finished run is kept.)",
                                        default, 1, 10_000_000)
        return steps if ok else None

    # --- news from the worker ---------------------------------------------------------------------
    def _on_jobs_event_received(self, event: Any) -> None:
        self.store.apply(event)
        self.telemetry.apply(event)
        self.state.apply(event)
        if isinstance(event, WorkerReady):
            self.capabilities = event.capabilities

    def _on_jobs_protocol_error(self, message: str) -> None:
        self.state.note(f"Protocol error: {message}")

    def _on_jobs_running_changed(self, running: bool) -> None:
        if running:  # the end is shown by _on_jobs_ended, which comes first
            self.window.set_running(True)

    def _on_jobs_ended(self, outcome: JobOutcome) -> None:
        self._rendezvous_timer.stop()
        self.runs_page.set_running_dir("")
        if outcome.status == "crashed" or self.state.running:
            # A crash (or an exit without a last word): the report's log tails go to the status tooltip.
            self._details = outcome.report
            self.state.mark_crashed(outcome.report or outcome.message)
        self.window.set_running(False)
        self._show_state()
        self.update_resume_target()
        self.show_peaks()
        if self.runs_page.isVisible():
            self.runs_page.refresh()
        if self._close_when_idle:
            self._close_when_idle = False
            self.window.close()

    def _on_state_changed(self) -> None:
        """Stop and Cancel end with the run's last event (the worker may take seconds more to exit).
        Show the state: at once outside a run or when its status changed, else at most every
        READOUT_S (a stream of MetricsLogged must not repaint the readouts a hundred times a second)."""
        self.window.set_stoppable(self.state.running)
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
        message = state.message
        if state.status == "idle" and message == READY and self.estimate.start_blocker():
            message = NOT_READY  # "Ready" beside a disabled Start would contradict it
        self.page.set_status(message, details=self._details)
        self.window.run_status.setText(message)
        self.page.set_progress(state.step, state.max_steps, state.eta_s if state.running else None, state.running)
        self.page.set_throughput(state.tokens_per_s, state.mfu, state.compile_seconds, state.images_seen)
        self.page.set_plan(state.plan)

    # --- readouts ---------------------------------------------------------------------------------
    def show_readiness(self) -> None:
        """The status line between runs follows the verdicts: "Ready" only when Start may go."""
        if not self.jobs.is_running():
            self._show_state()

    def show_peaks(self) -> None:
        """Predicted peak beside the measured one: during a run the estimate it started with, else the
        current one (as the Techniques page shows it), with the last run's memory.json where it wrote one."""
        running = self.jobs.is_running()
        predicted = self.page.gpu_panel.memory_chart.predicted_peak if running else None
        self.page.gpu_panel.set_peaks(predicted or self.estimate.peak_bytes, self.telemetry.measured_peak,
                                      self.telemetry.measured_kind, None if running else self.memory_record())

    def memory_record(self) -> MemoryRecord | None:
        """The last run's predicted and measured memory (None before a run, or when it wrote none)."""
        return MemoryRecord.read(self.folder.path) if self.folder is not None else None

    def follow_estimate(self) -> None:
        """Between runs the Train page's predicted peak follows the draft's estimate."""
        if not self.jobs.is_running():
            self.show_peaks()

    def update_resume_target(self) -> None:
        """Name the run Resume acts on, on the button: "Resume NAME (step K)" or "Train NAME more…"."""
        folder = self.resume_candidate()
        self.window.set_resume_target(*(resume_words(folder) if folder is not None else ("", "")))
