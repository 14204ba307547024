"""ProtocolSession: the client's half of one worker conversation, shared by the CLI and the studio.

Both clients must reach the same verdict on the same lines: the handshake (WorkerReady, then our one
StartJob), the version check (a worker from another release is refused at its first line, in one
sentence, and ended at once), the terminal event, and what an exit without one means (a crash,
recorded in the run folder, with its reason left in worker.log when the worker wrote none). The
process itself (subprocess or QProcess) stays with each client. Torch-free.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from typing import Any, Iterable

from backend.core.protocol import (
    PROTOCOL_VERSION,
    TERMINAL_EVENTS,
    JobFailed,
    ProtocolError,
    WorkerReady,
    decode_event,
)
from backend.core.runs.run_folder import RunFolder

MISMATCH_HINT = "install the studio and the worker from the same release"
TAIL_LINES = 12
"""How many lines of worker.log a crash report quotes."""


@dataclass
class Reply:
    """What one stdout line means for the client."""

    event: Any = None
    """The decoded event to pass on (None for a line that could not be read)."""
    write: str = ""
    """Text to write to the worker's stdin now (the StartJob, once it said WorkerReady)."""
    problem: str = ""
    """Why the line was skipped (it is not an event this side can read)."""
    failure: JobFailed | None = None
    """The session ended here (another protocol version): shown, recorded; the client ends the worker."""

    @property
    def terminal(self) -> bool:
        return self.failure is not None or (self.event is not None and self.event.type in TERMINAL_EVENTS)


class ProtocolSession:
    """The state of one worker conversation: ready, StartJob sent, last word seen."""

    def __init__(self, folder: RunFolder | None = None, start_text: str = "", client: str = "this client") -> None:
        self.folder = folder
        self.start_text = start_text
        self.client = client
        self.ready = self.start_sent = self.terminal_seen = False

    def handle(self, line: str) -> Reply:
        """Read one stdout line of the worker."""
        if not line.strip():
            return Reply()
        try:
            event = decode_event(line)
        except ProtocolError as exc:
            text = str(exc) if line[:40] in str(exc) else f"{exc} (line: {line[:120]!r})"
            if not self.ready and not self.terminal_seen and _message_type(line) == "WorkerReady":
                return Reply(problem=text, failure=self.fail("bad_input", f"the worker cannot talk to {self.client}: "
                                                             f"{exc}", MISMATCH_HINT))
            return Reply(problem=text)
        if isinstance(event, WorkerReady):
            if event.protocol_version != PROTOCOL_VERSION:
                return Reply(failure=self.fail(
                    "bad_input", f"the worker speaks protocol v{event.protocol_version} but {self.client} speaks "
                                 f"v{PROTOCOL_VERSION}", MISMATCH_HINT))
            self.ready = True
            if not self.start_sent:
                self.start_sent = True
                return Reply(event=event, write=self.start_text)
            return Reply(event=event)
        if event.type in TERMINAL_EVENTS:
            self.terminal_seen = True
        return Reply(event=event)

    def fail(self, kind: str, message: str, hint: str = "") -> JobFailed:
        """A failure the worker could not report itself: recorded as the run's last word."""
        event = JobFailed(kind=kind, message=message, hint=hint)  # type: ignore[arg-type]
        self.terminal_seen = True
        self.record(event)
        return event

    def record(self, event: JobFailed) -> str:
        """Append `event` to events.jsonl; returns why it could not be ("" when it was)."""
        if self.folder is None:
            return ""
        try:
            self.folder.append_event(event.model_dump(mode="json"))
        except OSError as exc:  # a vanished run folder must not turn a report into a traceback
            return f"could not record the failure in {self.folder.path}: {exc}"
        return ""

    def exited(self, exit_code: int, signal_number: int | None = None, stderr_tail: Iterable[str] = (),
               cancelled: bool = False) -> JobFailed | None:
        """The worker's process ended: None when it had said its last word, else the failure it
        could not report (cancelled, or a crash whose reason is left in worker.log), recorded."""
        if self.terminal_seen:
            return None
        if cancelled:
            return self.fail("cancelled", "the run was cancelled: the worker was stopped at once",
                             "checkpoints saved before the cancel are kept in the run folder")
        headline, hint = describe_exit(signal_number if signal_number is not None else exit_code,
                                       signal_number is not None)
        tail = list(stderr_tail)
        last = self._last_line(tail)
        self.leave_reason(headline, tail)
        where = f"see {self.folder.log_path}" if self.folder is not None else "see worker.log in the run folder"
        return self.fail("crashed", headline + (f"; last log line: {last[:200]}" if last else ""),
                         hint.replace("see worker.log in the run folder", where))

    def crash_report(self, failure: JobFailed) -> str:
        """The failure, its hint and the last lines of worker.log (which exists now), for a tooltip."""
        parts = [failure.message + ".", failure.hint]
        if self.folder is not None:
            tail = self.folder.tail_log(TAIL_LINES)
            if tail:
                parts.append(f"Last lines of {self.folder.log_path}:\n{tail}")
        return "\n".join(parts)

    def leave_reason(self, headline: str, stderr_tail: list[str]) -> None:
        """worker.log gets what the client saw: how the process ended and its stderr's last lines (a
        worker that died before redirecting its stderr, or a launcher that never started it, wrote none)."""
        if self.folder is None or not self.folder.path.is_dir():
            return
        wrote = self.folder.log_path.is_file() and self.folder.log_path.stat().st_size > 0
        lines = [f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} the client: {headline}"
                 + ("" if wrote else "; the worker wrote no log of its own")]
        if stderr_tail:
            lines.append("its stderr (not in this file above) ended with:")
            lines += [f"    {line}" for line in stderr_tail]
        else:
            lines.append("its stderr was empty")
        try:
            with self.folder.log_path.open("a", encoding="utf-8") as handle:
                handle.write("\n".join(lines) + "\n")
        except OSError:
            pass

    def _last_line(self, stderr_tail: list[str]) -> str:
        """The last line the worker wrote to worker.log, else the last of its stderr."""
        log = self.folder.tail_log(5) if self.folder is not None else ""
        for source in (log.splitlines(), stderr_tail):
            lines = [line.strip() for line in source if line.strip()]
            if lines:
                return lines[-1]
        return ""


def describe_exit(exit_code: int, crashed: bool) -> tuple[str, str]:
    """A sentence for an exit without a final event, and a hint on what usually causes it.
    `crashed`: `exit_code` is the signal that killed the process."""
    hint = "see worker.log in the run folder for the last thing the worker did"
    if not crashed:
        return f"the worker stopped unexpectedly (exit code {exit_code})", hint
    try:
        name = signal.Signals(exit_code).name
    except ValueError:
        name = "unknown signal"
    if exit_code == signal.SIGKILL:
        hint = "SIGKILL usually means the system ran out of memory (the OOM killer); " + hint
    return f"the worker stopped unexpectedly (killed by signal {exit_code}, {name})", hint


def _message_type(line: str) -> Any:
    try:
        raw = json.loads(line)
    except ValueError:
        return None
    return raw.get("type") if isinstance(raw, dict) else None
