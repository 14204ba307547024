"""StopListener: reads commands from stdin on a thread while the job runs on the main thread.

The training callback polls `requested` at each step boundary, so a stop never interrupts a step
halfway and a stop-and-save always leaves a complete checkpoint. A chat session also takes its
ChatMessage commands from here (a queue, so the main thread can wait for the next one), polls
`cut_requested` (StopAnswer) at every token, and ends when StopJob arrives or stdin closes.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import IO, Union

from backend.core.protocol import ChatMessage, ProtocolError, StopAnswer, StopJob, decode_command

log = logging.getLogger(__name__)
Inbox = Union[ChatMessage, str, None]
"""A message to answer, a line that could not be read (its sentence), or None: the session is over."""


class StopListener:
    def __init__(self, stream: IO[str]):
        self._stream = stream
        self._event = threading.Event()
        self._cut = threading.Event()
        self._inbox: queue.Queue[Inbox] = queue.Queue()
        self.save = True
        self.closed = False
        """True once stdin has closed: the client is gone."""
        self._thread = threading.Thread(target=self._run, name="stop-listener", daemon=True)

    def start(self) -> "StopListener":
        self._thread.start()
        return self

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    @property
    def cut_requested(self) -> bool:
        """A StopAnswer (or a StopJob) arrived since the current answer began."""
        return self._cut.is_set() or self._event.is_set()

    def request(self, save: bool = True) -> None:
        self.save = save
        self._event.set()
        self._inbox.put(None)  # wakes a session waiting for its next message

    def cut(self) -> None:
        self._cut.set()

    def next_message(self, timeout: float | None = None) -> Inbox:
        """Wait for the next chat message; None when the session is over (or on `timeout`).

        Taking a message clears an earlier StopAnswer: it cut the previous answer, not this one."""
        if self.requested or self.closed and self._inbox.empty():
            return None
        try:
            item = self._inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is not None:
            self._cut.clear()
        return item

    def _run(self) -> None:
        for line in self._stream:
            if not line.strip():
                continue
            try:
                command = decode_command(line)
            except ProtocolError as exc:
                log.warning("ignored command: %s", exc)
                self._inbox.put(f"the worker could not read that command: {exc}")
                continue
            if isinstance(command, StopJob):
                log.info("stop requested (save=%s)", command.save)
                self.request(command.save)
            elif isinstance(command, StopAnswer):
                log.info("answer cut requested")
                self.cut()
            elif isinstance(command, ChatMessage):
                self._inbox.put(command)
            else:
                log.warning("ignored a second %s", command.type)
        # stdin closed: the client is gone. A training run keeps running (events.jsonl records it);
        # a chat session has no one left to answer and ends.
        self.closed = True
        self._inbox.put(None)
