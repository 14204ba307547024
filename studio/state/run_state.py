"""RunState: where the current run stands, as the window should show it.

Events come in from the worker; this turns them into a status word, one status sentence, progress
numbers and one log line per noteworthy event. Keeping that here (not in the window) lets tests
check the wording without a widget, and keeps every view a plain reader of state.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from PySide6.QtCore import QObject, Signal

from backend.core.protocol import (
    CheckpointSaved,
    EvalFinished,
    JobFailed,
    JobFinished,
    JobStarted,
    MetricsLogged,
    PhaseChanged,
    WorkerReady,
)

ACTIVE = ("starting", "running", "stopping")
READY = "Ready. Pick a model and a dataset, then Start."
"""The status sentence before any run."""
"""Statuses during which a worker process is alive."""

PHASE_WORDS = {
    "plan": "Plan",
    "load_model": "Loading the model",
    "load_data": "Loading the data",
    "tokenize": "Tokenizing",
    "schedule": "Schedule",
    "threads": "CPU threads",
    "train": "Training",
    "eval": "Evaluating",
    "save": "Saving",
    "export": "Exporting",
}


class RunState(QObject):
    """Status of the run in progress (or the last one): idle, starting, running, stopping,
    finished, stopped, failed or cancelled."""

    changed = Signal()
    """Emitted after any field changed."""
    log_added = Signal(str)
    """Emitted with one line for the log pane (a phase, a checkpoint, an error: never a traceback)."""

    def __init__(self, parent: QObject | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(parent)
        self._clock = clock
        self._rate_start: tuple[float, int] | None = None
        self.eta_s: float | None = None
        """Seconds left at the pace since the first logged step (None until two steps are known)."""
        self.plan = ""
        """The worker's resolved techniques (PhaseChanged "plan")."""
        self.pid: int | None = None
        """The worker's process id (from WorkerReady) while it runs."""
        self.status = "idle"
        self.message = READY
        self.run_dir = ""
        self.phase = ""
        self.step = 0
        self.max_steps = 0
        self.tokens_per_s: float | None = None
        self.mfu: float | None = None
        self.compile_seconds: float | None = None
        self.images_seen: tuple[int, int] | None = None
        """(image rows, image tokens) a vision-language run has trained on; None for a text model."""
        self.loss: float | None = None

    @property
    def running(self) -> bool:
        return self.status in ACTIVE

    # --- transitions driven by the studio -------------------------------------------------------
    def reset(self) -> None:
        """Back to idle, as at start-up (the draft started over: the last run's figures no longer apply)."""
        if self.running:
            return
        self.status, self.message, self.run_dir, self.phase = "idle", READY, "", ""
        self.step, self.max_steps, self.tokens_per_s, self.loss = 0, 0, None, None
        self.mfu = self.compile_seconds = self.images_seen = None
        self.eta_s, self._rate_start, self.plan, self.pid = None, None, "", None
        self.changed.emit()

    def begin(self, run_dir: str, max_steps: int) -> None:
        self.status, self.run_dir, self.phase = "starting", run_dir, ""
        self.step, self.max_steps, self.tokens_per_s, self.loss = 0, max_steps, None, None
        self.mfu = self.compile_seconds = self.images_seen = None
        self.eta_s, self._rate_start, self.plan, self.pid = None, None, "", None
        self._say("Starting the worker…", log=f"Run folder: {run_dir}")

    def mark_stopping(self, save: bool) -> None:
        if self.running:
            self.status = "stopping"
            what = "saving a checkpoint" if save else "without saving"
            self._say(f"Stopping at the next step boundary, {what}…")

    def mark_crashed(self, report: str) -> None:
        """`report` is WorkerClient's crash text: a headline, a hint, then log tails (not logged)."""
        lines = report.splitlines() or ["the worker stopped unexpectedly"]
        self.status = "failed"
        self._say(f"Failed: {lines[0]}", log=f"Error: {lines[0]}")
        if len(lines) > 1 and lines[1].strip():
            self.note(f"Hint: {lines[1]}")

    def mark_error(self, message: str) -> None:
        """A problem found before any worker ran (for example an invalid form)."""
        self._say(f"Cannot start: {message}", log=f"Error: {message}")

    def note(self, line: str) -> None:
        """Add a log line without changing the status."""
        self.log_added.emit(line)

    # --- transitions driven by worker events ------------------------------------------------------
    def apply(self, event: Any) -> None:
        if isinstance(event, WorkerReady):
            caps = event.capabilities
            device = caps.devices[0].name if caps.cuda and caps.devices else "CPU"
            torch = f"torch {caps.torch_version}, " if caps.torch_version else ""
            self.pid = event.pid or None
            self._say("Worker ready, starting the job…", log=f"Worker ready ({torch}{device})")
        elif isinstance(event, JobStarted):
            self.status = "running" if self.status != "stopping" else self.status
            self.max_steps = event.max_steps or self.max_steps
            resumed = f" (resumed from {event.resumed_from})" if event.resumed_from else ""
            self._say(f"Started{resumed}", log=f"Job started{resumed}")
        elif isinstance(event, PhaseChanged):
            self.phase = event.phase
            if event.phase == "plan":
                self.plan = event.detail
            elif event.phase == "schedule":  # the steps the data came to, after the techniques
                self.plan = "; ".join(part for part in (self.plan, event.detail) if part)
            words = PHASE_WORDS.get(event.phase, event.phase.replace("_", " ").capitalize())
            text = f"{words}: {event.detail}" if event.detail else f"{words}…"
            self._say(text, log=f"Phase: {text}", quiet=self.status == "stopping")
        elif isinstance(event, MetricsLogged):
            self.step, self.max_steps = event.step, event.max_steps or self.max_steps
            self._update_eta()
            self.tokens_per_s = event.tokens_per_s if event.tokens_per_s is not None else self.tokens_per_s
            self.mfu = event.mfu if event.mfu is not None else self.mfu
            if event.image_rows_seen is not None:
                self.images_seen = (event.image_rows_seen, event.image_tokens_seen or 0)
            self.loss = event.loss if event.loss is not None else self.loss
            loss = f", loss {self.loss:.4f}" if self.loss is not None else ""
            self._say(f"Training: step {self.step} of {self.max_steps}{loss}",
                      quiet=self.status == "stopping")
        elif isinstance(event, CheckpointSaved):
            self.note(f"Checkpoint saved at step {event.step}: {event.path}")
        elif isinstance(event, EvalFinished):
            loss = f"{event.eval_loss:.4f}" if event.eval_loss is not None else "n/a"
            self.note(f"Evaluation at step {event.step}: eval loss {loss}")
        elif isinstance(event, JobFinished):
            self._apply_finished(event)
        elif isinstance(event, JobFailed):
            self.eta_s = None
            self.status = "cancelled" if event.kind == "cancelled" else "failed"
            word = "Cancelled" if event.kind == "cancelled" else "Failed"
            self._say(f"{word}: {event.message}", log=f"{word} ({event.kind}): {event.message}")
            if event.hint:
                self.note(f"Hint: {event.hint}")

    def _update_eta(self) -> None:
        now = self._clock()
        if self._rate_start is None or self.step < self._rate_start[1]:
            self._rate_start = (now, self.step)
            return
        started, first = self._rate_start
        if self.step > first and now > started:
            per_step = (now - started) / (self.step - first)
            self.eta_s = max(0.0, (self.max_steps - self.step) * per_step)

    def _apply_finished(self, event: JobFinished) -> None:
        self.eta_s = None
        self.status = "stopped" if event.stopped else "finished"
        self.step = event.steps or self.step
        self.tokens_per_s = event.tokens_per_s if event.tokens_per_s is not None else self.tokens_per_s
        self.mfu = event.mfu if event.mfu is not None else self.mfu
        self.compile_seconds = event.compile_seconds
        loss = f", final loss {event.final_loss:.4f}" if event.final_loss is not None else ""
        speed = f", {event.tokens_per_s:,.0f} useful tokens/s" if event.tokens_per_s else ""
        if event.stopped:
            saved = f"; checkpoint in {event.checkpoint_path}" if event.checkpoint_path else ""
            text = f"Stopped at step {self.step}{loss}{saved}"
        else:
            text = f"Finished: {self.step} steps{loss}{speed}"
        self._say(text, log=text)
        if event.adapter_path:
            self.note(f"Adapter saved: {event.adapter_path}")

    def _say(self, message: str, log: str | None = None, quiet: bool = False) -> None:
        if not quiet:
            self.message = message
        self.changed.emit()
        if log:
            self.log_added.emit(log)
