"""BackgroundCall: run one slow, pure function off the GUI thread and get its result as a signal.

Reading and tokenizing a large dataset takes seconds; the window must keep painting meanwhile. The
function runs on Qt's global thread pool and must not touch widgets. Only the newest call's result
is delivered: a person who picks another file before the first one is read sees only the second.
"""

from __future__ import annotations

from typing import Any, Callable

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal


class _Relay(QObject):
    done = Signal(int, object, str)
    """Emitted from the pool thread with (ticket, result, error); delivered queued to the GUI thread."""


class _Task(QRunnable):
    def __init__(self, relay: _Relay, ticket: int, function: Callable[[], Any]) -> None:
        super().__init__()
        self._relay, self._ticket, self._function = relay, ticket, function

    def run(self) -> None:
        try:
            result, error = self._function(), ""
        except Exception as exc:  # reported, never raised into the pool
            result, error = None, f"{type(exc).__name__}: {exc}"
        try:
            self._relay.done.emit(self._ticket, result, error)
        except RuntimeError:  # the receiver was deleted meanwhile (the window closed)
            pass


class BackgroundCall(QObject):
    """`call(fn)` runs fn() in the pool; `finished` or `failed` reports the newest call's outcome."""

    finished = Signal(object)
    """Emitted in the GUI thread with the return value of the newest call."""
    failed = Signal(str)
    """Emitted in the GUI thread with "Type: message" when the newest call raised."""

    def __init__(self, parent: QObject | None = None, synchronous: bool = False) -> None:
        super().__init__(parent)
        self.synchronous = synchronous
        """Run in the calling thread instead (tests that want no waiting)."""
        self._ticket = 0
        self._busy = False
        self._relay = _Relay(self)
        self._relay.done.connect(self._on_relay_done)

    def is_busy(self) -> bool:
        return self._busy

    def call(self, function: Callable[[], Any]) -> None:
        self._ticket += 1
        self._busy = True
        task = _Task(self._relay, self._ticket, function)
        if self.synchronous:
            task.run()
        else:
            QThreadPool.globalInstance().start(task)

    def _on_relay_done(self, ticket: int, result: object, error: str) -> None:
        if ticket != self._ticket:
            return  # superseded by a newer call
        self._busy = False
        if error:
            self.failed.emit(error)
        else:
            self.finished.emit(result)
