"""One protocol session for both clients (backend/api/protocol_session.py): a worker of another release is
one line, at once, in the CLI and the studio; a worker that dies before writing its log leaves the
reason in worker.log, which the crash message points at."""

from __future__ import annotations

import sys
import time

import pytest

import backend.cli.app
from backend.cli.app import main
from backend.core.config.run_config import RunConfig
from backend.core.protocol import PROTOCOL_VERSION, JobStarted, WorkerReady, encode
from backend.api.protocol_session import ProtocolSession
from backend.core.runs.run_folder import RunFolder
from backend.cli.worker_process import WorkerProcess
from tests.conftest import PRESET
from tests.fakes import FAKE_WORKER

OTHER = [sys.executable, str(FAKE_WORKER.parent / "other_release_worker.py")]
DIES_EARLY = [sys.executable, "-c", "import sys; sys.stderr.write('ImportError: DeepSpeed is not installed\\n'); "
              "sys.exit(1)"]
MISMATCH = f"the worker speaks protocol v{PROTOCOL_VERSION + 1} but "


def new_folder() -> tuple[RunFolder, RunConfig]:
    config = RunConfig.load(PRESET)
    return RunFolder.create(config), config


def test_the_session_sends_the_start_once_and_sees_the_last_word(tmp_path):
    folder, _ = new_folder()
    session = ProtocolSession(folder, "START\n")
    assert session.handle(encode(WorkerReady())).write == "START\n"
    assert session.handle(encode(JobStarted(run_dir=str(folder.path)))).write == ""
    assert not session.terminal_seen
    assert session.handle('{"type": "JobFinished", "run_dir": "x"}\n').terminal and session.terminal_seen
    assert session.exited(0) is None  # it had said its last word: not a crash


@pytest.mark.parametrize("how", ["field", "message"])
def test_the_cli_client_refuses_another_release_at_once(how):
    folder, config = new_folder()
    began = time.monotonic()
    terminal = WorkerProcess(command=[*OTHER, "--how", how]).run(folder, config)
    assert time.monotonic() - began < 10  # not the 20 s wait, then "crashed (exit code 0)"
    assert terminal["type"] == "JobFailed" and terminal["kind"] == "bad_input", terminal
    assert f"v{PROTOCOL_VERSION + 1}" in terminal["message"] and "\n" not in terminal["message"]
    assert "same release" in terminal["hint"]
    assert folder.terminal_event()["message"] == terminal["message"]


def test_the_cli_says_another_release_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(backend.cli.app, "WorkerProcess", lambda **kw: WorkerProcess(command=OTHER, **kw))
    assert main(["train", str(PRESET)]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(("error:", "hint:"))]
    assert lines == [f"error: {MISMATCH}this finetune-studio speaks v{PROTOCOL_VERSION}",
                     "hint: install the studio and the worker from the same release"]


def test_the_studio_client_refuses_another_release_with_the_same_sentence(qtbot):
    from studio.services.worker_client import WorkerClient

    folder, config = new_folder()
    client = WorkerClient()
    failed, crashed = [], []
    client.job_failed.connect(failed.append)
    client.worker_crashed.connect(crashed.append)
    began = time.monotonic()
    client.start(folder, config, command=OTHER)
    qtbot.waitUntil(lambda: not client.is_running(), timeout=10_000)
    assert time.monotonic() - began < 10
    assert [f.message for f in failed] == [f"{MISMATCH}this studio speaks v{PROTOCOL_VERSION}"] and not crashed
    assert folder.terminal_event()["kind"] == "bad_input"


def test_a_worker_dead_before_its_log_leaves_the_reason_in_worker_log_cli():
    folder, config = new_folder()
    terminal = WorkerProcess(command=DIES_EARLY).run(folder, config)
    assert terminal["kind"] == "crashed"
    assert "exit code 1" in terminal["message"] and "ImportError: DeepSpeed is not installed" in terminal["message"]
    assert str(folder.log_path) in terminal["hint"]
    log = folder.log_path.read_text()
    assert "exit code 1" in log and "ImportError: DeepSpeed is not installed" in log and "no log of its own" in log


def test_a_worker_dead_before_its_log_leaves_the_reason_in_worker_log_studio(qtbot):
    from studio.services.worker_client import WorkerClient

    folder, config = new_folder()
    client = WorkerClient()
    reports = []
    client.worker_crashed.connect(reports.append)
    client.start(folder, config, command=DIES_EARLY)
    qtbot.waitUntil(lambda: not client.is_running(), timeout=10_000)
    assert len(reports) == 1
    headline, hint = reports[0].splitlines()[:2]
    assert "exit code 1" in headline and "ImportError: DeepSpeed is not installed" in headline
    assert f"see {folder.log_path}" in hint and folder.log_path.is_file()
    assert "ImportError: DeepSpeed is not installed" in folder.log_path.read_text()
    assert folder.terminal_event()["kind"] == "crashed"
