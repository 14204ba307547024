"""Studio test setup: an offscreen Qt platform, a private studio home, a studio on a fake worker."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")  # before anything creates a QApplication

from pathlib import Path
from typing import Callable, Iterator

import pytest


@pytest.fixture(autouse=True)
def studio_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test writes its runs under its own tmp folder, never the user's data directory."""
    home = tmp_path / "home"
    monkeypatch.setenv("FINETUNE_STUDIO_HOME", str(home))
    return home


@pytest.fixture
def make_studio(qtbot) -> Iterator[Callable[..., object]]:
    """Build the studio window wired to a worker command (and a GPU sampler); kills any worker left at teardown.

    Datasets are read synchronously, so a test never waits for the Data page's background read.
    """
    from studio.app import build_studio

    built = []

    def make(command: list[str] | None = None, sampler=None, show: bool = True):
        studio = build_studio(worker_command=command, sampler=sampler, synchronous_data=True)
        studio.controller.ask_stop_on_close = lambda: "discard"
        qtbot.addWidget(studio.window)
        if show:
            studio.window.show()
        built.append(studio)
        return studio

    yield make
    for studio in built:
        studio.monitor.stop()
        for jobs in studio.jobs.values():
            jobs.shutdown()
