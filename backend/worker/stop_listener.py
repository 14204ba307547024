"""StopListener: reads commands from stdin on a thread while the job runs on the main thread.

The training callback polls `requested` at each step boundary, so a stop never interrupts a step
halfway and a stop-and-save always leaves a complete checkpoint.
"""

from __future__ import annotations

import logging
import threading
from typing import IO

from backend.protocol import ProtocolError, StopJob, decode_command

log = logging.getLogger(__name__)


class StopListener:
    def __init__(self, stream: IO[str]):
        self._stream = stream
        self._event = threading.Event()
        self.save = True
        self._thread = threading.Thread(target=self._run, name="stop-listener", daemon=True)

    def start(self) -> "StopListener":
        self._thread.start()
        return self

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self, save: bool = True) -> None:
        self.save = save
        self._event.set()

    def _run(self) -> None:
        for line in self._stream:
            if not line.strip():
                continue
            try:
                command = decode_command(line)
            except ProtocolError as exc:
                log.warning("ignored command: %s", exc)
                continue
            if isinstance(command, StopJob):
                log.info("stop requested (save=%s)", command.save)
                self.request(command.save)
        # stdin closed: the client is gone. Keep running; events.jsonl records the run.
