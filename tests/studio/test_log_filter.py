"""Tracebacks stay in worker.log; the log pane gets one pointer line per traceback."""

from __future__ import annotations

from studio.services.log_filter import POINTER, TracebackFilter

LOG = """\
2026-01-01 INFO backend.worker: loading
2026-01-01 ERROR backend.worker: job failed: boom
Traceback (most recent call last):
  File "x.py", line 1, in <module>
    raise KeyError("a")
KeyError: 'a'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "x.py", line 3, in <module>
    raise ValueError("boom")
ValueError: boom
2026-01-01 INFO backend.worker: after"""


def test_traceback_becomes_one_pointer_line():
    keep = TracebackFilter()
    shown = [line for line in (keep.feed(raw) for raw in LOG.splitlines()) if line is not None]
    assert shown == [
        "2026-01-01 INFO backend.worker: loading",
        "2026-01-01 ERROR backend.worker: job failed: boom",
        POINTER,
        "2026-01-01 INFO backend.worker: after",
    ]
