"""One kill trial: the real worker under the studio's WorkerClient, SIGKILLed at a chosen point.

Shared by tests/reliability/test_kill_points.py (5 points in CI) and bench/kill_trials.py (20).
A trial passes when the studio reports the crash, the run is marked failed, every checkpoint that
claims to be complete loads, and a resume from the newest one finishes the run.
"""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEventLoop, QTimer

from backend.core.config.run_config import RunConfig
from backend.core.runs.run_folder import RunFolder
from backend.cli.worker_process import WorkerProcess

ROOT = Path(__file__).resolve().parents[2]
PRESET = ROOT / "resources" / "presets" / "tiny_lora.yaml"
OVERRIDES = ["train.max_steps=16", "train.save_steps=4", "data.max_examples=96", "train.seq_len=128",
             "train.micro_batch_size=4", "data.validation_split=0.1"]


@dataclass
class TrialResult:
    point: str
    crash_reported: bool = False
    crash_message: str = ""
    status_after_kill: str = ""
    checkpoints: list[str] = field(default_factory=list)
    checkpoints_loaded: int = 0
    resumed: str = ""  # "finished", "no checkpoint: refused", or the failure
    finished_first: bool = False  # the run ended before the kill landed (a late random point)
    survived: bool = False


def _checkpoint_loads(path: Path) -> bool:
    from safetensors import safe_open

    json.loads((path / "trainer_state.json").read_text())
    with safe_open(str(path / "adapter_model.safetensors"), "pt") as handle:
        return len(list(handle.keys())) > 0


def run_trial(point: str, after: dict, timeout_s: float = 180.0) -> TrialResult:
    """Kill when `after` matches an event: {"type": ..., optional "step"/"phase"/"delay_ms"}."""
    from studio.services.worker_client import WorkerClient

    _app = QCoreApplication.instance() or QCoreApplication([])  # noqa: F841 - the loop needs one
    config = RunConfig.load(PRESET, [*OVERRIDES, f"name=kill-{point}"])
    folder = RunFolder.create(config)
    result = TrialResult(point)
    client = WorkerClient()
    loop = QEventLoop()
    state = {"pid": None, "killed": False}

    def kill() -> None:
        if state["pid"] and not state["killed"]:
            state["killed"] = True
            try:
                os.kill(state["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass  # it finished first: the trial records that

    def on_event(event) -> None:
        if event.type == "WorkerReady":
            state["pid"] = event.pid
        # Metrics reach the stream coalesced (at most ~10 a second): match a step or any later one.
        matches = event.type == after["type"] and all(
            getattr(event, key) >= value if key == "step" else getattr(event, key) == value
            for key, value in after.items() if key not in ("type", "delay_ms"))
        if matches and not state["killed"]:
            QTimer.singleShot(after.get("delay_ms", 0), kill)

    def on_crash(message: str) -> None:
        result.crash_reported = True
        result.crash_message = message
        loop.quit()

    client.event_received.connect(on_event)
    client.worker_crashed.connect(on_crash)
    def on_finished(_event) -> None:
        result.finished_first = True
        loop.quit()

    client.job_finished.connect(on_finished)
    client.job_failed.connect(lambda _e: loop.quit())
    QTimer.singleShot(int(timeout_s * 1000), loop.quit)
    client.start(folder, config)
    loop.exec()
    client.shutdown(5000)

    result.status_after_kill = folder.status()
    if result.finished_first:
        result.survived = result.status_after_kill == "finished"
        return result
    complete = folder.complete_checkpoints()
    result.checkpoints = [c.name for c in complete]
    result.checkpoints_loaded = sum(1 for c in complete if _checkpoint_loads(c))
    if complete:
        terminal = WorkerProcess().run(folder, config, resume=True)
        result.resumed = "finished" if terminal["type"] == "JobFinished" else terminal["message"]
        ok = terminal["type"] == "JobFinished" and terminal["steps"] == 16 and folder.status() == "finished"
    else:
        terminal = WorkerProcess().run(folder, config, resume=True)
        refused = terminal["type"] == "JobFailed" and "no complete checkpoint" in terminal["message"]
        result.resumed = "no checkpoint: refused" if refused else terminal.get("message", "")
        ok = refused
    result.survived = (result.crash_reported and result.status_after_kill == "failed"
                       and result.checkpoints_loaded == len(complete) and ok)
    return result


POINTS = {
    "while loading": {"type": "PhaseChanged", "phase": "load_model"},
    "first training steps": {"type": "MetricsLogged", "step": 2},
    "just after a checkpoint": {"type": "CheckpointSaved", "step": 4},
    "between checkpoints": {"type": "MetricsLogged", "step": 10},
    "during the final save": {"type": "PhaseChanged", "phase": "save"},
}
