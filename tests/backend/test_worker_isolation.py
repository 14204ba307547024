"""The worker never imports from the folder its client was started in: a `backend/` (or `accelerate/`)
package there must not change what runs (backend/runtime/processes.py module_command, distributed.launch_argv)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from backend.core.config.run_config import RunConfig
from backend.api.distributed import launch_argv
from backend.runtime.processes import WORKER_SCRIPT, module_command, worker_command, worker_env
from backend.core.runs.run_folder import RunFolder
from backend.cli.worker_process import WorkerProcess
from tests.conftest import PRESET

POISON = 'import sys\nsys.stderr.write("POISONED: imported from the current folder\\n")\nsys.exit(97)\n'


@pytest.fixture
def poisoned(tmp_path, monkeypatch) -> Path:
    """A user's project folder holding its own `backend` and `accelerate` packages, as the cwd."""
    folder = tmp_path / "project"
    for name in ("backend", "accelerate"):
        (folder / name).mkdir(parents=True)
        (folder / name / "__init__.py").write_text(POISON)
    monkeypatch.chdir(folder)
    return folder


def test_plain_dash_m_would_run_the_poisoned_package(poisoned):
    """The hazard itself, so the tests below can fail: `python -m backend.worker` runs the cwd's code."""
    done = subprocess.run([sys.executable, "-m", "backend.worker"], env=worker_env(), capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode == 97 and "POISONED" in done.stderr


def test_the_worker_a_client_starts_runs_the_real_package(poisoned):
    config = RunConfig.load(PRESET, [f"data.path={poisoned / 'no-such.jsonl'}"])
    folder = RunFolder.create(config)
    worker = WorkerProcess()
    terminal = worker.run(folder, config)
    text = folder.log_path.read_text() + "\n".join(worker.stderr_tail)
    assert "POISONED" not in text
    assert terminal["type"] == "JobFailed" and terminal["kind"] == "bad_input", terminal  # the real worker's refusal
    assert "no-such.jsonl" in terminal["message"]
    assert worker_command()[1] == "-c"


def test_the_accelerate_launcher_and_its_ranks_run_the_real_packages(poisoned, tmp_path):
    launcher = subprocess.run([*module_command("accelerate.commands.launch"), "--help"], env=worker_env(),
                              capture_output=True, text=True, timeout=120)
    assert launcher.returncode == 0 and "POISONED" not in launcher.stderr, launcher.stderr[-500:]
    argv = launch_argv(sys.executable, tmp_path, tmp_path / "a.yaml", tmp_path / "job.json")
    assert argv[1] == "-c" and argv[3] == "accelerate.commands.launch" and str(WORKER_SCRIPT) in argv
    assert "-m" not in argv
    # A rank runs the worker as a script: it answers WorkerReady from the real package.
    rank = subprocess.run([sys.executable, str(WORKER_SCRIPT)], env=worker_env(), capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert "POISONED" not in rank.stderr and '"type":"WorkerReady"' in rank.stdout, rank.stderr[-500:]
