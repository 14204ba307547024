"""The real worker on the bundled model: it learns, it leaves a whole run folder, it obeys a stop."""

from __future__ import annotations

import json
import subprocess
import sys

from backend.core.config.run_config import RunConfig
from backend.api.run_index import RunIndex
from backend.core.runs.run_folder import CHECKPOINT_MARKER, RunFolder
from backend.cli.worker_process import WorkerProcess
from tests.conftest import PRESET, ROOT


def test_thirty_steps_lower_the_loss_and_fill_the_run_folder(thirty_step_run):
    folder, config, events, terminal = thirty_step_run  # also test_evaluate's run (on a copy)

    assert terminal["type"] == "JobFinished", terminal
    assert terminal["stopped"] is False and terminal["steps"] == 30
    losses = {e["step"]: e["loss"] for e in events if e["type"] == "MetricsLogged"}
    assert 1 in losses and 30 in losses
    assert losses[30] < losses[1], losses
    assert terminal["tokens_per_s"] and terminal["tokens_per_s"] > 0

    assert (folder.path / "config.yaml").is_file()
    assert RunConfig.load(folder.config_path) == config
    assert folder.log_path.is_file() and folder.log_path.stat().st_size > 0
    recorded = [json.loads(line)["type"] for line in folder.events_path.read_text().splitlines()]
    assert recorded[0] == "JobStarted" and recorded[-1] == "JobFinished"
    assert recorded.count("MetricsLogged") == 30  # the file keeps every step, the stream is coalesced
    checkpoints = folder.complete_checkpoints()
    assert [c.name for c in checkpoints] == ["checkpoint-15", "checkpoint-30"]
    assert all((c / CHECKPOINT_MARKER).is_file() for c in checkpoints)
    assert (folder.adapter_dir / "adapter_model.safetensors").is_file()
    assert (folder.adapter_dir / "adapter_config.json").is_file()
    assert (folder.adapter_dir / "tokenizer.json").is_file()
    assert folder.status() == "finished"

    # memory.json: the estimate the studio shows for this config beside the worker's measured peak
    from backend.estimate.calibration import Calibration
    from backend.core.runs.memory_record import MemoryRecord
    from backend.estimate.run_estimate import estimate_run, longest_answer

    record = MemoryRecord.read(folder.path)
    assert record is not None and (record.device, record.outcome) == ("cpu", "finished")
    shown = estimate_run(config, "cpu", target_tokens=longest_answer(config), calibration=Calibration())
    assert record.predicted_total_bytes == shown.total_bytes and record.predicted_parts == shown.breakdown.breakdown()
    assert "not calibrated yet" in record.calibration  # a fresh studio home: no run measured before
    assert record.measured_kind == "worker peak RSS (VmHWM)" and record.measured_peak_bytes == record.peak_rss_bytes
    assert 100 << 20 < record.process_baseline_bytes < record.measured_peak_bytes
    calibration = Calibration.read(folder.path.parent)  # the runs of the run's own (fresh) studio home
    assert calibration.runs == 1 and calibration.baseline_bytes == record.process_baseline_bytes


def test_stop_and_save_mid_run_leaves_a_complete_checkpoint(bundled_model):
    config = RunConfig.load(PRESET, ["train.max_steps=2000", "train.save_steps=1000", "name=stop"])
    folder = RunFolder.create(config)
    worker = WorkerProcess()
    sent = []

    def on_event(event: dict) -> None:
        if event["type"] == "MetricsLogged" and event["step"] >= 3 and not sent:
            sent.append(event["step"])
            worker.stop(save=True)

    terminal = worker.run(folder, config, on_event=on_event)
    assert terminal["type"] == "JobFinished" and terminal["stopped"] is True, terminal
    assert sent and terminal["steps"] < 2000
    latest = folder.latest_checkpoint()
    assert latest is not None and latest.name == f"checkpoint-{terminal['steps']}"
    assert (latest / "optimizer.pt").is_file() and (latest / "trainer_state.json").is_file()
    assert (folder.adapter_dir / "adapter_model.safetensors").is_file()
    assert folder.status() == "stopped"
    from backend.core.runs.memory_record import MemoryRecord

    assert MemoryRecord.read(folder.path).outcome == "stopped"


def test_cancel_saves_nothing(bundled_model):
    config = RunConfig.load(PRESET, ["train.max_steps=2000", "train.save_steps=1000", "name=cancel"])
    folder = RunFolder.create(config)
    worker = WorkerProcess()

    def on_event(event: dict) -> None:
        if event["type"] == "MetricsLogged" and event["step"] >= 2:
            worker.stop(save=False)

    terminal = worker.run(folder, config, on_event=on_event)
    assert terminal["type"] == "JobFailed" and terminal["kind"] == "cancelled", terminal
    assert folder.latest_checkpoint() is None and not folder.adapter_dir.exists()
    assert folder.status() == "cancelled"


def test_cli_train_with_overrides_and_runs_list(bundled_model, studio_home):
    """--set train.num_epochs=2 over tiny_lora.yaml's max_steps: 2 epochs of 8 rows at micro-batch 4 rule
    (test_schedule's CLI case: one worker run for both), then runs list and train --resume --more-steps."""
    overrides = ["train.num_epochs=2", "data.max_examples=8", "data.validation_split=0", "train.micro_batch_size=4",
                 "train.seq_len=128", "name=cli-run", "train.save_steps=2"]
    env_cmd = [sys.executable, "-m", "studio", "train", str(PRESET), *sum((["--set", o] for o in overrides), [])]
    done = subprocess.run(env_cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "finished" in done.stdout and "tokens/s:" in done.stdout and "adapter:" in done.stdout
    assert "Traceback" not in done.stderr
    assert "[schedule] train.num_epochs rules: 2 epochs of 8 rows = 4 steps" in done.stderr
    assert "steps:       4" in done.stdout
    runs = subprocess.run([sys.executable, "-m", "studio", "runs", "list", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    listed = json.loads(runs.stdout)
    assert len(listed) == 1 and listed[0]["name"] == "cli-run" and listed[0]["status"] == "finished"
    assert listed[0]["steps"] == 4
    config = RunConfig.load(listed[0]["path"] + "/config.yaml")
    assert (config.train.num_epochs, config.train.max_steps, config.train.save_steps) == (2, None, 2)  # what ruled
    table = subprocess.run([sys.executable, "-m", "studio", "runs", "list"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60).stdout.splitlines()
    assert "useful tok/s" in table[0] and table[1].startswith(listed[0]["run_id"])
    # A finished run trains more steps as a new run (`train --resume RUN` alone is refused: test_bad_inputs_cli)
    more = subprocess.run([sys.executable, "-m", "studio", "train", "--resume", listed[0]["path"], "--more-steps", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert more.returncode == 0, more.stderr[-2000:]
    assert "for 2 more steps as a new run" in more.stderr and "Traceback" not in more.stderr
    new_dir = more.stderr.split("run folder: ", 1)[1].splitlines()[0]
    assert new_dir != listed[0]["path"] and f"run folder:  {new_dir}" in more.stdout
    index = RunIndex()
    after = {r.path: r for r in index.sync()}
    index.close()
    assert after[new_dir].steps == 6 and after[new_dir].status == "finished"
    assert after[listed[0]["path"]].steps == 4 and after[listed[0]["path"]].status == "finished"


def test_cli_failure_is_one_line_without_traceback(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "studio", "train", str(PRESET), "--set", f"model.path={tmp_path}/missing"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2  # bad input, refused before any run folder or torch
    assert "error: model.path:" in done.stderr and "does not exist" in done.stderr
    assert "Traceback" not in done.stderr


def test_cli_typo_in_override_names_the_field():
    done = subprocess.run([sys.executable, "-m", "studio", "train", str(PRESET), "--set", "train.max_stepz=3"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "unknown field train.max_stepz" in done.stderr and "Traceback" not in done.stderr
