"""WorkerClient: one worker process per job, spoken to in typed JSON lines through QProcess.

The studio never runs training in its own process: a CUDA abort or the OOM killer must take down
only the worker. So this class treats the child as untrusted: a line it cannot read is reported and
skipped, and a process that ends without its last word (JobFinished / JobFailed) is reported as a
crash *and* recorded in the run folder, so the run history never shows a dead run as "incomplete".
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

from backend.core.config.run_config import RunConfig
from backend.api.launch import job_argv, start_line, worker_env
from backend.core.protocol import JobFailed, JobFinished, StopJob, encode
from backend.api.protocol_session import TAIL_LINES, ProtocolSession, describe_exit
from backend.core.runs.run_folder import RunFolder
from studio.services.line_buffer import LineBuffer
from studio.services.log_filter import TracebackFilter

__all__ = ["WorkerClient", "describe_exit"]


class WorkerClient(QObject):
    """Starts `python -m backend.worker`, feeds it one StartJob, turns its stdout into signals."""

    event_received = Signal(object)
    """Emitted for every event decoded from the worker's stdout, terminal ones included."""
    job_finished = Signal(object)
    """Emitted when the worker reported JobFinished (completed, or stopped on request)."""
    job_failed = Signal(object)
    """Emitted when the job failed with a JobFailed (from the worker, or recorded here on cancel)."""
    worker_crashed = Signal(str)
    """Emitted when the process ended without a terminal event; says how, quotes the last log lines."""
    protocol_error = Signal(str)
    """Emitted when a stdout line could not be read as an event; it was skipped and the run goes on."""
    log_line = Signal(str)
    """Emitted per worker log line (stderr, then worker.log); a traceback becomes one pointer line."""
    running_changed = Signal(bool)
    """Emitted True when a worker was started and False once it has exited."""

    def __init__(self, parent: QObject | None = None, log_poll_ms: int = 300,
                 exit_grace_ms: int = 15_000, stop_grace_ms: int = 120_000, term_grace_ms: int = 5_000) -> None:
        super().__init__(parent)
        self._process: QProcess | None = None
        self._folder: RunFolder | None = None
        self._stdout = LineBuffer()
        self._stderr = LineBuffer()
        self._log = LineBuffer()
        self._log_offset = 0
        self._filter = TracebackFilter()
        self._stderr_tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._session = ProtocolSession(client="this studio")
        self._kill_requested = False
        self._running = False
        self._log_timer = QTimer(self)
        self._log_timer.setInterval(log_poll_ms)
        self._log_timer.timeout.connect(self._on_log_timer_timeout)
        # A worker that said its last word but hangs in interpreter teardown is killed after a grace.
        self._exit_timer = QTimer(self)
        self._exit_timer.setSingleShot(True)
        self._exit_timer.setInterval(exit_grace_ms)
        self._exit_timer.timeout.connect(self._on_exit_timer_timeout)
        # Three levels: a stop request (save or cancel); if unanswered after a grace, SIGTERM;
        # if that is ignored too, SIGKILL. A hung worker can never hold the studio hostage.
        self._stop_timer = QTimer(self)
        self._stop_timer.setSingleShot(True)
        self._stop_timer.setInterval(stop_grace_ms)
        self._stop_timer.timeout.connect(self._on_stop_timer_timeout)
        self._term_timer = QTimer(self)
        self._term_timer.setSingleShot(True)
        self._term_timer.setInterval(term_grace_ms)
        self._term_timer.timeout.connect(self._on_term_timer_timeout)

    # --- public API -----------------------------------------------------------------------------
    @property
    def folder(self) -> RunFolder | None:
        """The run folder of the current (or last) job."""
        return self._folder

    def is_running(self) -> bool:
        return self._running

    def pid(self) -> int | None:
        """The worker's process id while it runs (None before it started or after it ended)."""
        if self._process is None or self._process.state() == QProcess.ProcessState.NotRunning:
            return None
        return int(self._process.processId()) or None

    def start(self, folder: RunFolder, config: RunConfig, resume: bool = False,
              command: Sequence[str] | None = None, env: dict[str, str] | None = None,
              job: str = "finetune", params: dict | None = None) -> None:
        """Launch a worker for `folder` to run `job` (finetune, export, evaluate, chat) with `params`;
        the StartJob is written once it says WorkerReady."""
        if self._running:
            raise RuntimeError("a worker is already running; stop it before starting another")
        argv = list(command) if command else job_argv(folder, config, resume, job, params)
        self._reset(folder, start_line(folder, config, resume, job, params))
        process = QProcess(self)
        environment = QProcessEnvironment()
        for key, value in (worker_env() if env is None else env).items():
            environment.insert(key, value)
        process.setProcessEnvironment(environment)
        process.setProgram(argv[0])
        process.setArguments(argv[1:])
        process.readyReadStandardOutput.connect(self._on_process_ready_read_standard_output)
        process.readyReadStandardError.connect(self._on_process_ready_read_standard_error)
        process.finished.connect(self._on_process_finished)
        process.errorOccurred.connect(self._on_process_error_occurred)
        self._process = process
        self._running = True
        self.running_changed.emit(True)
        self._log_timer.start()  # before start(): a failed start may stop it synchronously
        process.start()

    def stop(self, save: bool = True) -> None:
        """Ask the worker to stop at the next step boundary (with a checkpoint when `save`).

        Before the job has started there is nothing to save, so the worker is simply killed.
        """
        if not self._running or self._terminal_seen:
            return
        if self._start_sent:
            self._write(encode(StopJob(save=save)))
            self._stop_timer.start()
        else:
            self.kill()

    def send(self, command: Any) -> bool:
        """Write one more command (a protocol message) to the running job; False when there is none."""
        if not self._running or not self._start_sent or self._terminal_seen:
            return False
        self._write(encode(command))
        return True

    def give_up(self, kind: str, message: str, hint: str = "") -> None:
        """End the worker with a failure the studio found (a multi-node run nobody joined), recorded as such."""
        if self._running and not self._terminal_seen:
            self._fail_locally(kind, message, hint)

    def _on_stop_timer_timeout(self) -> None:
        """The worker ignored the stop request: ask the OS to terminate it."""
        if self._process is not None and self._process.state() != QProcess.ProcessState.NotRunning:
            self.log_line.emit("the worker did not stop in time; terminating it")
            self._kill_requested = True
            self._process.terminate()
            self._term_timer.start()

    def _on_term_timer_timeout(self) -> None:
        """Terminate was ignored too: kill."""
        if self._process is not None and self._process.state() != QProcess.ProcessState.NotRunning:
            self.log_line.emit("the worker ignored terminate; killing it")
            self._process.kill()

    def kill(self) -> None:
        """End the worker now (SIGKILL); the run is recorded as cancelled."""
        if self._process is not None and self._process.state() != QProcess.ProcessState.NotRunning:
            self._kill_requested = True
            self._process.kill()

    def shutdown(self, timeout_ms: int = 3000) -> None:
        """Kill and reap the worker synchronously (application exit: never leave an orphan)."""
        process = self._process
        if process is not None and process.state() != QProcess.ProcessState.NotRunning:
            self.kill()
            process.waitForFinished(timeout_ms)

    def feed_stdout(self, data: bytes) -> None:
        """Frame and decode a chunk of stdout bytes (the QProcess handler; tests call it directly)."""
        for line in self._stdout.feed(data):
            self._handle_line(line)

    # --- stdout: events -------------------------------------------------------------------------
    def _handle_line(self, line: str) -> None:
        reply = self._session.handle(line)
        if reply.problem:
            self.protocol_error.emit(f"skipped a worker line the studio could not read: {reply.problem}")
        if reply.failure is not None:  # a worker of another release: one sentence, and it is ended
            self._end_with(reply.failure)
            return
        if reply.write:
            self._write(reply.write)
        event = reply.event
        if event is None:
            return
        if isinstance(event, (JobFinished, JobFailed)):
            self._on_log_timer_timeout()  # what the worker logged before its last word ("stopping at step N") first
        self.event_received.emit(event)
        if isinstance(event, JobFinished):
            self._mark_terminal()
            self.job_finished.emit(event)
        elif isinstance(event, JobFailed):
            self._mark_terminal()
            self.job_failed.emit(event)

    @property
    def _terminal_seen(self) -> bool:
        return self._session.terminal_seen

    @property
    def _start_sent(self) -> bool:
        return self._session.start_sent

    def _mark_terminal(self) -> None:
        if self._process is not None:
            self._process.closeWriteChannel()
            self._exit_timer.start()

    def _fail_locally(self, kind: str, message: str, hint: str) -> None:
        """Record a failure the worker could not report itself, then end the worker."""
        self._end_with(self._session.fail(kind, message, hint))

    def _end_with(self, event: JobFailed) -> None:
        self.event_received.emit(event)
        self.job_failed.emit(event)
        if self._process is not None and self._process.state() != QProcess.ProcessState.NotRunning:
            self._process.kill()

    # --- process callbacks ------------------------------------------------------------------------
    def _on_process_ready_read_standard_output(self) -> None:
        if self._process is not None:
            self.feed_stdout(bytes(self._process.readAllStandardOutput().data()))

    def _on_process_ready_read_standard_error(self) -> None:
        if self._process is not None:
            self._emit_stderr(self._stderr.feed(bytes(self._process.readAllStandardError().data())))

    def _emit_stderr(self, lines: list[str]) -> None:
        for line in lines:
            self._stderr_tail.append(line)
            self._emit_log(line)

    def _emit_log(self, line: str) -> None:
        line = line.rsplit("\r", 1)[-1]  # a progress bar redraws with \r: show its last state
        shown = self._filter.feed(line)
        if shown is not None and shown.strip():
            self.log_line.emit(shown)

    def _on_process_error_occurred(self, error: QProcess.ProcessError) -> None:
        if error != QProcess.ProcessError.FailedToStart or self._process is None:
            return  # crashes and pipe errors are followed by finished(), handled there
        detail = self._process.errorString()
        program = self._process.program()
        self._log_timer.stop()
        headline = f"could not start the worker ({program}): {detail}"
        self._session.leave_reason(headline, [])  # the run folder says why, as for a crash
        self._session.fail("crashed", headline, "check the Python environment")
        self._release_process()
        self.worker_crashed.emit(headline)
        self.running_changed.emit(False)

    def _on_process_finished(self, exit_code: int, exit_status: QProcess.ExitStatus) -> None:
        process = self._process
        if process is None:
            return
        self._log_timer.stop()
        self.feed_stdout(bytes(process.readAllStandardOutput().data()))
        tail = self._stdout.flush()
        if tail is not None:
            self._handle_line(tail)
        self._emit_stderr(self._stderr.feed(bytes(process.readAllStandardError().data())))
        last = self._stderr.flush()
        if last is not None:
            self._emit_stderr([last])
        self._on_log_timer_timeout()
        last_log = self._log.flush()
        if last_log is not None:
            self._emit_log(last_log)
        crashed = exit_status == QProcess.ExitStatus.CrashExit
        self._exit_timer.stop()
        self._stop_timer.stop()
        self._term_timer.stop()
        self._release_process()
        code = int(exit_code)
        failure = self._session.exited(code if not crashed else 0, code if crashed else None,
                                       list(self._stderr_tail), cancelled=self._kill_requested)
        if failure is not None and failure.kind == "cancelled":
            self.event_received.emit(failure)
            self.job_failed.emit(failure)
        elif failure is not None:
            self.worker_crashed.emit(self._session.crash_report(failure))
        self.running_changed.emit(False)

    def _on_exit_timer_timeout(self) -> None:
        if self._process is not None and self._process.state() != QProcess.ProcessState.NotRunning:
            self._process.kill()

    # --- worker.log follower ------------------------------------------------------------------
    def _on_log_timer_timeout(self) -> None:
        """Show what the worker writes to worker.log once it has redirected its stderr there."""
        if self._folder is None:
            return
        try:
            with self._folder.log_path.open("rb") as handle:
                handle.seek(0, 2)
                if handle.tell() < self._log_offset:
                    self._log_offset = 0  # truncated or replaced: read it again from the start
                handle.seek(self._log_offset)
                data = handle.read(1 << 20)
        except OSError:
            return
        self._log_offset += len(data)
        for line in self._log.feed(data):
            self._emit_log(line)

    # --- helpers ----------------------------------------------------------------------------------
    def _reset(self, folder: RunFolder, start_text: str) -> None:
        self._folder = folder
        self._stdout, self._stderr, self._log = LineBuffer(), LineBuffer(), LineBuffer()
        self._log_offset = 0
        self._filter = TracebackFilter()
        self._stderr_tail.clear()
        self._session = ProtocolSession(folder, start_text, client="this studio")
        self._kill_requested = False

    def _write(self, text: str) -> None:
        if self._process is not None and self._process.state() == QProcess.ProcessState.Running:
            self._process.write(text.encode("utf-8"))

    def _release_process(self) -> None:
        if self._process is not None:
            self._process.deleteLater()
        self._process = None
        self._running = False
