"""TracebackFilter: keeps Python tracebacks and library warnings out of the log pane.

The worker's log (stderr, then worker.log) is shown live, but a traceback is forty lines a person
cannot act on: the JobFailed event already says what went wrong in one sentence, and the full
traceback stays in worker.log for a bug report. So each traceback becomes one pointer line.
Python's DeprecationWarning / FutureWarning / UserWarning lines (with the source line Python prints
under them) and bitsandbytes' advice to `pip install kernels` are libraries talking to their own
developers: they are hidden here and, like everything else, kept in worker.log.
"""

from __future__ import annotations

import re

TRACEBACK_START = "Traceback (most recent call last):"
CHAINING = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
POINTER = "(a traceback was written to worker.log in the run folder)"
WARNING_LINE = re.compile(r"\S:\d+: (?:Pending)?(?:DeprecationWarning|FutureWarning|UserWarning): ")
"""`file.py:12: FutureWarning: ...`, bare or inside a logging line (`WARNING py.warnings: /x.py:12: ...`)."""
ADVICE = ("pip install kernels",)
"""Phrases of library advice that no one using the studio can act on (bitsandbytes' CPU kernels)."""


class WarningFilter:
    """Hides warning lines, the indented source lines after them, and library install advice."""

    def __init__(self) -> None:
        self._after_warning = False

    def feed(self, line: str) -> str | None:
        if self._after_warning and (not line.strip() or line[:1].isspace()):
            return None  # the source line Python prints under a warning, and the blank line after it
        self._after_warning = bool(WARNING_LINE.search(line))
        if self._after_warning or any(phrase in line for phrase in ADVICE):
            return None
        return line


class TracebackFilter:
    """Feed raw log lines; get back the line to show, or None to hide it.

    A chained traceback ("During handling of the above exception...") stays one pointer line;
    what is left then goes through a WarningFilter.
    """

    def __init__(self) -> None:
        self._state = "outside"  # outside | inside (frames) | after (exception line seen)
        self._warnings = WarningFilter()

    def feed(self, line: str) -> str | None:
        shown = self._without_tracebacks(line)
        return None if shown is None else self._warnings.feed(shown)

    def _without_tracebacks(self, line: str) -> str | None:
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
