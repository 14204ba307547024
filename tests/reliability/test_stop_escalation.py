"""Stop-and-save, then terminate, then kill: a worker that stops answering cannot hang the studio."""

from __future__ import annotations

import sys

import pytest

from backend.core.config.run_config import RunConfig
from backend.core.runs.run_folder import RunFolder
from studio.services.worker_client import WorkerClient
from tests.conftest import PRESET, ROOT

DEAF = str(ROOT / "tests" / "fakes" / "deaf_worker.py")


@pytest.mark.parametrize("ignore_term, expected_log", [
    (False, "terminating it"),
    (True, "killing it"),
])
def test_unanswered_stop_escalates(qtbot, ignore_term, expected_log):
    config = RunConfig.load(PRESET)
    folder = RunFolder.create(config)
    client = WorkerClient(stop_grace_ms=800, term_grace_ms=800)
    logs: list[str] = []
    client.log_line.connect(logs.append)
    command = [sys.executable, DEAF] + (["--ignore-term"] if ignore_term else [])
    with qtbot.waitSignal(client.event_received, timeout=15_000, check_params_cb=lambda e: e.type == "MetricsLogged"):
        client.start(folder, config, command=command)
    with qtbot.waitSignal(client.running_changed, timeout=15_000, check_params_cb=lambda running: not running):
        client.stop(save=True)
    assert any("did not stop in time" in line for line in logs)
    assert any(expected_log in line for line in logs)
    assert folder.status() == "cancelled"
