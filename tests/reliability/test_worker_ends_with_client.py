"""A worker never trains on detached: its client killed or terminated, it stops, saves and exits."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from backend.core.runs.run_folder import RunFolder
from backend.worker.parent_watch import ParentWatch, alive
from backend.runtime.stop_listener import StopListener
from tests.fakes import fake_command

ROOT = Path(__file__).resolve().parents[2]


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _only_run(home: Path) -> RunFolder:
    runs = [p for p in (home / "runs").iterdir() if p.is_dir()] if (home / "runs").is_dir() else []
    assert len(runs) <= 1, runs
    return RunFolder(runs[0]) if runs else None  # type: ignore[return-value]


def _steps(folder: RunFolder | None) -> int:
    return len(folder.metrics()) if folder is not None else 0


def test_the_real_worker_stops_and_saves_when_its_cli_is_killed(tmp_path):
    env = {**os.environ, "FINETUNE_STUDIO_HOME": str(tmp_path / "home")}
    cli = subprocess.Popen([sys.executable, "-m", "backend.cli", "train", "resources/presets/tiny_lora.yaml",
                            "--set", "train.max_steps=5000", "--set", "train.save_steps=5000"],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    home = tmp_path / "home"
    try:
        _wait(lambda: _steps(_only_run(home)) >= 2, 240, "two training steps")
        folder = _only_run(home)
        pid = int(re.search(r"worker (\d+) starting", folder.log_path.read_text()).group(1))
        cli.kill()  # the CLI dies without a word: no StopJob ever reaches the worker
        cli.wait(10)
        _wait(lambda: not alive(pid) or _zombie(pid), 120, "the worker to exit")
    finally:
        if cli.poll() is None:
            cli.kill()
    assert folder.status() == "stopped", folder.tail_log(20)
    assert folder.latest_checkpoint() is not None  # the steps done were saved, not lost
    assert "is gone: stopping at the next step and saving a checkpoint" in folder.log_path.read_text()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_sigterm_to_the_cli_stops_and_saves_before_it_exits(tmp_path):
    folder_root = tmp_path / "runs"
    script = textwrap.dedent(f"""
        import sys
        from backend.core.config.run_config import RunConfig
        from backend.core.runs.run_folder import RunFolder
        from backend.cli.worker_process import WorkerProcess
        folder = RunFolder.create(RunConfig(name="term"), root=__import__("pathlib").Path({str(folder_root)!r}))
        print(folder.path, flush=True)
        terminal = WorkerProcess(command={fake_command("slow", 0.05)!r}).run(folder, RunConfig(name="term"))
        print(terminal["type"], terminal.get("stopped"), flush=True)
    """)
    cli = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    folder = RunFolder(cli.stdout.readline().strip())
    _wait(lambda: _steps(folder) >= 3, 60, "three steps")
    cli.send_signal(signal.SIGTERM)
    out, _ = cli.communicate(timeout=60)
    assert cli.returncode == 0 and out.split()[-2:] == ["JobFinished", "True"], out
    assert folder.status() == "stopped" and folder.latest_checkpoint() is not None


def test_sigterm_asks_for_a_stop_with_a_checkpoint_and_a_gone_client_does_too():
    stop = StopListener(iter([]))  # type: ignore[arg-type]
    watch = ParentWatch(stop, client_pid=os.getpid())
    watch._on_sigterm(signal.SIGTERM, None)  # noqa: SLF001
    assert stop.requested and stop.save
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stop = StopListener(iter([]))  # type: ignore[arg-type]
    ParentWatch(stop, client_pid=gone.pid, poll_s=0.05).start()
    _wait(lambda: stop.requested, 5, "the watch to notice")
    assert stop.save


def test_a_multi_node_run_says_whom_it_waits_for_and_gives_up(tmp_path, capsys):
    from backend.core.config.run_config import RunConfig
    from backend.cli.worker_process import WorkerProcess

    config = RunConfig.from_dict({"name": "two", "hardware": {
        "strategy": "ddp", "num_machines": 2, "main_process_ip": "10.0.0.7", "main_process_port": 29511,
        "rendezvous_timeout_s": 5}})
    folder = RunFolder.create(config, root=tmp_path)
    began = time.monotonic()
    hung = [sys.executable, "-c", "import time; time.sleep(120)"]  # a launcher waiting for machine 2
    terminal = WorkerProcess(command=hung).run(folder, config)
    assert time.monotonic() - began < 30
    said = capsys.readouterr().err
    assert "waiting for machine 2 of 2 to join at 10.0.0.7:29511 (giving up after 5 s" in said
    assert terminal["type"] == "JobFailed" and terminal["kind"] == "bad_input"
    assert terminal["message"] == ("machine 2 of 2 did not join at 10.0.0.7:29511 within 5 s "
                                   "(hardware.rendezvous_timeout_s)")
    assert "--machine-rank" in terminal["hint"] and folder.status() == "failed"
