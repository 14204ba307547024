"""Reporter: the one writer of protocol events.

Every event goes to events.jsonl in the run folder (the record that survives the studio) and to the
protocol stream (the worker's original stdout). MetricsLogged on the stream is coalesced to at most
~10 lines a second so that a fast tiny model cannot flood the studio's event loop; the file keeps
every step.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import IO

from backend.core.protocol import MetricsLogged, TelemetrySampled, Message, encode

MIN_INTERVAL_S = 0.1


class Reporter:
    def __init__(self, stream: IO[str]):
        self._stream = stream
        self._file: IO[str] | None = None
        self._lock = threading.Lock()
        self._last_metric_at = 0.0
        self._pending: Message | None = None

    def attach_run(self, run_dir: Path) -> None:
        self._file = (run_dir / "events.jsonl").open("a", encoding="utf-8")

    def emit(self, event: Message) -> None:
        line = encode(event)
        with self._lock:
            if self._file is not None:
                self._file.write(line)
                self._file.flush()
            if isinstance(event, (MetricsLogged, TelemetrySampled)):
                now = time.monotonic()
                if now - self._last_metric_at < MIN_INTERVAL_S:
                    self._pending = event
                    return
                self._last_metric_at = now
                self._pending = None
            else:
                self._flush_pending()
            self._write(line)

    def flush(self) -> None:
        with self._lock:
            self._flush_pending()

    def _flush_pending(self) -> None:
        if self._pending is not None:
            self._write(encode(self._pending))
            self._pending = None
            self._last_metric_at = time.monotonic()

    def _write(self, line: str) -> None:
        try:
            self._stream.write(line)
            self._stream.flush()
        except (BrokenPipeError, ValueError):
            pass  # the client went away; events.jsonl still has everything

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None
