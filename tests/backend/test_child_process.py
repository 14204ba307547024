"""ChildProcess (backend/runtime/child_process.py) on real children: its own session, the stop's order
(SIGTERM to the group, the grace period, SIGKILL), the stragglers a leader leaves, reaping, and the
parent-death signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from backend.runtime.child_process import ChildProcess
from backend.runtime.processes import alive, worker_env
from tests.conftest import ROOT

STUBBORN = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(60)")
"""A child that ignores SIGTERM: only SIGKILL ends it."""


def _ready(child: ChildProcess) -> str:
    """The child's first line, once it has set itself up."""
    assert child.process.stdout is not None
    return child.process.stdout.readline().strip()


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    """Whether `pid`, not our child, ends within `timeout_s` (a zombie counts: reaping it is its new parent's)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_the_child_leads_a_session_and_a_group_of_its_own():
    child = ChildProcess(["sleep", "30"])
    try:
        assert os.getsid(child.pid) == child.pid != os.getsid(0)
        assert os.getpgid(child.pid) == child.pid
    finally:
        child.stop(grace_s=5)


def test_a_child_that_honours_sigterm_ends_by_it_and_is_reaped():
    child = ChildProcess(["sleep", "30"])
    began = time.monotonic()
    assert child.stop(grace_s=10) == -signal.SIGTERM
    assert time.monotonic() - began < 5  # no grace period spent: it ended at once
    assert not child.running() and not alive(child.pid)  # reaped: not even a zombie


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period():
    child = ChildProcess([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True)
    assert _ready(child) == "ready"
    began = time.monotonic()
    assert child.stop(grace_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - began >= 0.5
    assert not alive(child.pid)


def test_what_the_leader_started_is_killed_once_the_leader_is_gone():
    """The leader ends at SIGTERM; a member of its group that ignores SIGTERM gets the SIGKILL after it."""
    leader = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {STUBBORN!r}], "
              "stdout=subprocess.PIPE, text=True); p.stdout.readline(); print(p.pid, flush=True); time.sleep(60)")
    child = ChildProcess([sys.executable, "-c", leader], stdout=subprocess.PIPE, text=True)
    member = int(_ready(child))
    assert os.getpgid(member) == child.pid
    assert child.stop(grace_s=10) == -signal.SIGTERM
    assert _gone(member)


def test_kill_group_ends_every_member_and_kill_the_leader_alone():
    child = ChildProcess([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, text=True)
    assert _ready(child) == "ready"
    child.kill_group()
    assert child.wait(10) == -signal.SIGKILL
    child.kill_group()  # a reaped leader: the group is gone, and nothing is raised
    solo = ChildProcess(["sleep", "30"])
    solo.kill()
    assert solo.wait(10) == -signal.SIGKILL


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_started_to_die_with_its_parent_gets_sigterm_when_the_parent_is_killed():
    launcher = ("import sys, time; from backend.runtime.child_process import ChildProcess; "
                "child = ChildProcess(['sleep', '60'], die_with_parent=True); "
                "print(child.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", launcher], cwd=ROOT, env=worker_env(), stdout=subprocess.PIPE,
                              text=True)
    try:
        assert parent.stdout is not None
        orphan = int(parent.stdout.readline())
        assert alive(orphan)
    finally:
        parent.kill()  # SIGKILL: the launcher has no chance to stop its child
        parent.wait(10)
    assert _gone(orphan)
