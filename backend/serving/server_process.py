"""ServerProcess: start a server, know when it answers, and stop it so that nothing lingers. Torch-free.

The server runs in a session (process group) of its own (backend/runtime/child_process.py), so Stop
reaches the processes it starts too (vLLM's engine core, tokenizer workers): SIGTERM to the group, then
SIGKILL after a grace period, then a wait until the port takes a new listener. On Linux the server also
gets SIGTERM when its launcher dies (PR_SET_PDEATHSIG), for a launcher killed without a chance to stop it.
"""

from __future__ import annotations

import collections
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from typing import Callable

from backend.runtime.child_process import ChildProcess
from backend.serving.engines import HOST, ServeLaunch

TAKEN_MARKERS = ("address already in use", "errno 98", "only one usage of each socket address")


def port_taken_line(port: int) -> str:
    return (f"port {port} on {HOST} is taken (another server is listening there): pick a free one with --port, "
            "or stop what holds it")


def check_port(port: int) -> None:
    """A one-line ValueError when `port` cannot be listened on (bound as uvicorn binds: SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError:
            raise ValueError(port_taken_line(port)) from None


def free_port() -> int:
    """A port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def port_free(port: int) -> bool:
    try:
        check_port(port)
    except ValueError:
        return False
    return True


class ServerFailed(RuntimeError):
    """The server process ended or never answered; the message is one line."""


class ServerProcess:
    """One server process group: start, wait_ready, stop; its output kept (and echoed to `on_line`)."""

    def __init__(self, launch: ServeLaunch, token: str, on_line: Callable[[str], None] | None = None) -> None:
        self.launch = launch
        self.token = token
        self.on_line = on_line
        self.lines: collections.deque[str] = collections.deque(maxlen=200)
        self.child: ChildProcess | None = None
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.child.pid if self.child else None

    def start(self) -> None:
        check_port(self.launch.port)
        self.child = ChildProcess(self.launch.argv, die_with_parent=True, env=self.launch.env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self._reader = threading.Thread(target=self._read, name="server-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.child is not None and self.child.process.stdout is not None
        for raw in self.child.process.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if line.strip():
                self.lines.append(line)
                if self.on_line is not None:
                    self.on_line(line)

    def alive(self) -> bool:
        return self.child is not None and self.child.running()

    def answers(self) -> bool:
        """Whether GET /v1/models with the token answers 200 (the model is loaded: every engine loads first)."""
        request = urllib.request.Request(f"{self.launch.base_url}/models",
                                         headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                if self._reader is not None:
                    self._reader.join(timeout=2)
                raise ServerFailed(self.failure())
            if self.answers():
                return
            time.sleep(0.25)
        self.stop()
        raise ServerFailed(f"the {self.launch.engine} server did not answer within {timeout_s:.0f} s; "
                           f"its last line: {self.last_line()}")

    def last_line(self) -> str:
        return self.lines[-1] if self.lines else "(nothing printed)"

    def failure(self) -> str:
        """One line for a server that ended: a taken port said plainly, else its last line."""
        text = "\n".join(self.lines).lower()
        if any(marker in text for marker in TAKEN_MARKERS):
            return port_taken_line(self.launch.port)
        code = self.child.process.returncode if self.child else None
        return f"the {self.launch.engine} server ended (exit code {code}): {self.last_line()}"

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the group, SIGKILL what is left after `grace_s`, reap, and wait for the port to be free."""
        if self.child is None:
            return
        self.child.stop(grace_s)
        if self._reader is not None:
            self._reader.join(timeout=2)
        deadline = time.monotonic() + 5
        while not port_free(self.launch.port) and time.monotonic() < deadline:
            time.sleep(0.1)
