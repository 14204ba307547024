"""ParentWatch: a worker ends with its client (stop and save first), never runs on detached.

A closed terminal or a killed CLI or studio would otherwise leave the worker training with no one to
stop it. The client names itself in FINETUNE_STUDIO_CLIENT_PID (backend/runtime/processes.py); a thread checks
that it is alive every second, and SIGTERM (a terminal closing, `kill`) asks for the same stop. Both
become a stop-and-save at the next step boundary; a second SIGTERM ends the worker at once.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

from backend.runtime.processes import alive
from backend.runtime.stop_listener import StopListener

log = logging.getLogger(__name__)
CLIENT_PID_ENV = "FINETUNE_STUDIO_CLIENT_PID"
POLL_S = 1.0




class ParentWatch:
    """Turns the client's disappearance or a SIGTERM into StopListener.request(save=True)."""

    def __init__(self, stop: StopListener, client_pid: int | None = None, poll_s: float = POLL_S) -> None:
        self.stop = stop
        raw = os.environ.get(CLIENT_PID_ENV, "")
        self.client_pid = client_pid if client_pid is not None else (int(raw) if raw.isdigit() else None)
        self.poll_s = poll_s
        self.terms = 0
        self._thread = threading.Thread(target=self._run, name="parent-watch", daemon=True)

    def start(self) -> "ParentWatch":
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)
        if self.client_pid and self.client_pid != os.getpid():
            log.info("ending with the client (pid %s): stop and save if it goes", self.client_pid)
            self._thread.start()
        return self

    def _on_sigterm(self, _signum: int, _frame: Any) -> None:
        self.terms += 1
        if self.terms > 1 or self.stop.requested:
            log.warning("SIGTERM again: ending now")
            os._exit(128 + signal.SIGTERM)
        log.warning("SIGTERM: stopping at the next step boundary and saving a checkpoint")
        self.stop.request(save=True)

    def _run(self) -> None:
        event = threading.Event()
        while not event.wait(self.poll_s):
            if not alive(self.client_pid):  # type: ignore[arg-type]
                log.warning("the client (pid %s) is gone: stopping at the next step and saving a checkpoint",
                            self.client_pid)
                if not self.stop.requested:
                    self.stop.request(save=True)
                return
