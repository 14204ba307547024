"""JobController: the one lifecycle of a worker job, shared by every page that starts one.

Training, export, evaluation and chat all start a worker, follow its events, stop or cancel it and
end in finished, stopped, failed, cancelled or crashed. Each page owns one JobController, so it sees
only the job it started; `started` tells it to clear what belonged to the previous job and `ended`
(emitted once, after the process is gone) tells it how the job ended, in one sentence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence

from PySide6.QtCore import QObject, Signal

from backend.core.config.run_config import RunConfig
from backend.core.protocol import JobFailed, JobFinished, JobKind, Message
from backend.core.runs.run_folder import RunFolder
from studio.services.worker_client import WorkerClient

JobStatus = Literal["idle", "starting", "running", "stopping", "finished", "stopped", "failed", "cancelled",
                    "crashed"]
ACTIVE: tuple[JobStatus, ...] = ("starting", "running", "stopping")


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended: its status, one sentence, the hint, and the terminal event (None after a crash)."""

    job: str
    status: JobStatus
    message: str
    hint: str = ""
    event: JobFinished | JobFailed | None = None
    report: str = ""
    """A crash's full report (headline, hint, log tails), for a tooltip."""

    @property
    def ok(self) -> bool:
        return self.status in ("finished", "stopped")


class JobController(QObject):
    """Starts one job at a time on its own WorkerClient and reports its life as signals."""

    started = Signal(object)
    """Emitted with the RunFolder when a job starts: a page clears what the previous job left."""
    event_received = Signal(object)
    """Every event of the current job, terminal ones included."""
    status_changed = Signal(str)
    """Emitted with the new JobStatus."""
    ended = Signal(object)
    """Emitted once per job with its JobOutcome, after the worker process has exited."""
    log_line = Signal(str)
    """The worker's log lines (a traceback becomes one pointer line)."""
    protocol_error = Signal(str)
    running_changed = Signal(bool)

    def __init__(self, client: WorkerClient | None = None, worker_command: Sequence[str] | None = None,
                 worker_env: dict[str, str] | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = client or WorkerClient()
        self.client.setParent(self)
        self.worker_command = list(worker_command) if worker_command else None
        self.worker_env = worker_env
        self.status: JobStatus = "idle"
        self.job = ""
        self.folder: RunFolder | None = None
        self.outcome: JobOutcome | None = None
        """How the last job ended (None while one runs, or before the first)."""
        self._pending: JobOutcome | None = None
        self.client.event_received.connect(self._on_client_event_received)
        self.client.worker_crashed.connect(self._on_client_worker_crashed)
        self.client.running_changed.connect(self._on_client_running_changed)
        self.client.log_line.connect(self.log_line)
        self.client.protocol_error.connect(self.protocol_error)

    # --- requests -------------------------------------------------------------------------------
    def is_running(self) -> bool:
        return self.client.is_running()

    def start(self, folder: RunFolder, config: RunConfig, job: JobKind = "finetune",
              params: dict[str, Any] | None = None, resume: bool = False) -> bool:
        """Start `job` on `folder`; False (and nothing happens) while another job of this controller runs."""
        if self.client.is_running():
            return False
        self.job, self.folder, self.outcome, self._pending = job, folder, None, None
        self._set_status("starting")
        self.started.emit(folder)
        self.client.start(folder, config, resume=resume, command=self.worker_command, env=self.worker_env,
                          job=job, params=params or {})
        return True

    def stop(self, save: bool = True) -> None:
        """Stop at the next step boundary, saving a checkpoint when `save` (a cancel otherwise)."""
        if self.client.is_running() and self.status in ("starting", "running"):
            self._set_status("stopping")
            self.client.stop(save=save)

    def cancel(self) -> None:
        self.stop(save=False)

    def kill(self) -> None:
        """End the worker now; the job ends cancelled."""
        self.client.kill()

    def give_up(self, message: str, hint: str = "") -> None:
        """End the job as failed (bad input) with `message`: the studio's own verdict, not the worker's."""
        self.client.give_up("bad_input", message, hint)

    def send(self, command: Message) -> bool:
        """Write one more command to the running worker (a chat message); False when none runs."""
        return self.client.send(command)

    def shutdown(self) -> None:
        """Kill and reap the worker (application exit)."""
        self.client.shutdown()

    # --- news -----------------------------------------------------------------------------------
    def _on_client_event_received(self, event: Any) -> None:
        if isinstance(event, JobFinished):
            status: JobStatus = "stopped" if event.stopped else "finished"
            self._pending = JobOutcome(self.job, status, _finished_sentence(self.job, event), event=event)
        elif isinstance(event, JobFailed):
            status = "cancelled" if event.kind == "cancelled" else "failed"
            self._pending = JobOutcome(self.job, status, event.message, event.hint, event=event)
        elif self.status == "starting" and type(event).__name__ == "JobStarted":
            self._set_status("running")
        self.event_received.emit(event)
        if self._pending is not None and self.status != self._pending.status:
            self._set_status(self._pending.status)

    def _on_client_worker_crashed(self, report: str) -> None:
        lines = report.splitlines() or ["the worker stopped unexpectedly"]
        hint = lines[1] if len(lines) > 1 else ""
        self._pending = JobOutcome(self.job, "crashed", lines[0].rstrip("."), hint, report=report)

    def _on_client_running_changed(self, running: bool) -> None:
        if running:
            self.running_changed.emit(True)
            return
        outcome = self._pending or JobOutcome(self.job, "crashed", "the worker exited without reporting how")
        self._pending, self.outcome = None, outcome
        self._set_status(outcome.status)
        self.running_changed.emit(False)
        self.ended.emit(outcome)

    def _set_status(self, status: JobStatus) -> None:
        if status != self.status:
            self.status = status
            self.status_changed.emit(status)


def _finished_sentence(job: str, event: JobFinished) -> str:
    if event.stopped:
        return "stopped on request" + (f"; checkpoint in {event.checkpoint_path}" if event.checkpoint_path else "")
    return f"{job} finished"


def failure_text(what: str, outcome: JobOutcome) -> str:
    """One line for a page's status: "Export failed (out_of_memory): ... Hint: ..."."""
    if outcome.status == "crashed":
        return f"{what} crashed: {outcome.message}."
    kind = outcome.event.kind if isinstance(outcome.event, JobFailed) else outcome.status
    hint = f" Hint: {outcome.hint}" if outcome.hint else ""
    return f"{what} failed ({kind}): {outcome.message}.{hint}"
