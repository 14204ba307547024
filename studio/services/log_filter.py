"""TracebackFilter: keeps Python tracebacks out of the log pane.

The worker's log (stderr, then worker.log) is shown live, but a traceback is forty lines a person
cannot act on: the JobFailed event already says what went wrong in one sentence, and the full
traceback stays in worker.log for a bug report. So each traceback becomes one pointer line.
"""

from __future__ import annotations

TRACEBACK_START = "Traceback (most recent call last):"
CHAINING = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
POINTER = "(a traceback was written to worker.log in the run folder)"


class TracebackFilter:
    """Feed raw log lines; get back the line to show, or None to hide it.

    A chained traceback ("During handling of the above exception...") stays one pointer line.
    """

    def __init__(self) -> None:
        self._state = "outside"  # outside | inside (frames) | after (exception line seen)

    def feed(self, line: str) -> str | None:
        if line.endswith(TRACEBACK_START):
            shown = None
            if self._state == "outside":
                prefix = line[: -len(TRACEBACK_START)].rstrip()
                shown = prefix or POINTER
            self._state = "inside"
            return shown
        if self._state == "outside":
            return line
        if not line.strip() or line in CHAINING or (self._state == "inside" and line[:1].isspace()):
            return None
        if self._state == "inside":  # the exception line ("ValueError: ...") closes the frames
            self._state = "after"
            return None
        self._state = "outside"
        return line
