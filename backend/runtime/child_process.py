"""ChildProcess: one child in a session of its own, stopped together with everything it started. Torch-free.

The CLI's worker (backend/cli/worker_process.py) and the server (backend/serving/server_process.py, run by
backend/cli/serve_run.py) both start their child here. Its own session keeps the terminal's Ctrl-C with
the CLI (which turns it into a stop of its own), and makes the child's pid the id of a process group
that also holds what the child starts (accelerate's ranks, vLLM's engine core), so one signal reaches
them all. On Linux a child can also be given SIGTERM when its launcher dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
from typing import Any

KILL_WAIT_S = 5.0
"""How long `stop` waits for the leader after SIGKILL before it simply waits on."""


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the launcher's thread dies (Linux only; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        except OSError:
            pass


class ChildProcess:
    """`subprocess.Popen` in a new session (the group id is its pid), and the ways to end that group."""

    def __init__(self, argv: list[str], *, die_with_parent: bool = False, **popen: Any) -> None:
        """Start `argv`; `popen` is passed on (env, pipes, text). `die_with_parent`: PR_SET_PDEATHSIG."""
        self.process: subprocess.Popen[Any] = subprocess.Popen(
            argv, start_new_session=True, preexec_fn=_die_with_parent if die_with_parent else None, **popen)

    @property
    def pid(self) -> int:
        """The leader's pid, which is also its session's and process group's id."""
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        """Reap the leader; its exit code (negative: the signal that ended it)."""
        return self.process.wait(timeout)

    def kill(self) -> None:
        """SIGKILL the leader alone, as a crash would end it (what it started is left to notice)."""
        self.process.kill()

    def kill_group(self) -> None:
        """SIGKILL the whole group at once; the leader alone if the group cannot be signalled."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            self.process.kill()

    def stop(self, grace_s: float, kill_wait_s: float = KILL_WAIT_S) -> int:
        """SIGTERM the group, SIGKILL it if the leader outlives `grace_s` (and what the leader left behind
        once it is gone), then reap the leader; returns its exit code."""
        group = self.pid
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
            try:
                os.killpg(group, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self.process.wait(timeout=wait_s)
            except subprocess.TimeoutExpired:
                continue
            try:  # the leader is gone; members it started may not be
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            break
        return self.process.wait()
