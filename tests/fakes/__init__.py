"""Test doubles. `fake_command` builds the argv of the scripted fake worker for a scenario."""

from __future__ import annotations

import sys
from pathlib import Path

FAKE_WORKER = Path(__file__).resolve().parent / "fake_worker.py"


def fake_command(scenario: str, delay: float | None = None, *extra: str) -> list[str]:
    """argv that runs tests/fakes/fake_worker.py with `scenario` (see its docstring) and extra options."""
    command = [sys.executable, str(FAKE_WORKER), "--scenario", scenario]
    return command + (["--delay", str(delay)] if delay is not None else []) + list(extra)
