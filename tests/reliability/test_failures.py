"""Out-of-memory (injected on the CPU) and a full or read-only disk: each a clear sentence, with
what was saved kept intact and what was half-written removed."""

from __future__ import annotations

import errno
import io
import subprocess
import sys

import pytest
import torch

from backend.core.config.run_config import RunConfig
from backend.core.protocol import Capabilities
from backend.core.runs.run_folder import RunFolder
from backend.worker.failures import classify_failure
from backend.runtime.reporter import Reporter
from backend.runtime.stop_listener import StopListener
from tests.conftest import PRESET, ROOT

SMALL = ["data.max_examples=64", "train.seq_len=128", "train.micro_batch_size=4", "train.max_steps=10",
         "train.save_steps=4", "data.validation_split=0.1", "train.eval_steps=5"]


def run_in_process(run_dir, overrides):
    """The fine-tune job in this process; returns (config, exception or None)."""
    from backend.jobs.finetune import run_finetune

    config = RunConfig.load(PRESET, [*SMALL, *overrides])
    run_dir.mkdir(exist_ok=True)
    config.save(run_dir / "config.yaml")
    reporter = Reporter(io.StringIO())
    reporter.attach_run(run_dir)
    try:
        run_finetune(config, run_dir, reporter, StopListener(io.StringIO()), capabilities=Capabilities())
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return config, exc
    finally:
        reporter.close()
    return config, None


@pytest.mark.parametrize("phase", ["load", "forward", "backward", "optimizer step", "evaluation"])
def test_injected_out_of_memory_names_phase_peak_prediction_and_fix(bundled_model, tmp_path, monkeypatch, phase):
    monkeypatch.setenv("FINETUNE_STUDIO_INJECT_OOM", phase if phase in ("load", "evaluation") else f"{phase}:3")
    config, exc = run_in_process(tmp_path / "run", [])
    assert isinstance(exc, torch.OutOfMemoryError)
    failure = classify_failure(exc, config, tmp_path / "run")
    assert failure.kind == "out_of_memory" and failure.phase == phase
    assert failure.message.startswith(f"out of memory during {phase}: peak ")
    assert failure.peak_bytes and failure.peak_bytes > 0
    assert failure.predicted_bytes and failure.predicted_bytes > 0
    assert failure.fix == {"train.micro_batch_size": 2, "train.gradient_accumulation_steps": 2}
    assert "same effective batch" in failure.hint
    from backend.core.runs.memory_record import MemoryRecord

    record = MemoryRecord.read(tmp_path / "run")  # the peak that did not fit, beside the prediction
    if phase == "load":
        assert record is None  # injected as the load phase begins, before the ledger takes its baseline
    else:
        assert record.outcome == "out_of_memory" and record.predicted_total_bytes == failure.predicted_bytes


def test_fix_ladder_when_the_batch_is_already_one():
    from backend.worker.failures import propose_fix

    assert propose_fix(RunConfig.load(PRESET, ["train.micro_batch_size=1"]))[0] == {"technique.gradient_checkpointing": True}
    assert propose_fix(RunConfig.load(PRESET, ["train.micro_batch_size=1", "technique.gradient_checkpointing=true"]))[0] \
        == {"technique.method": "qlora"}


def test_out_of_memory_through_the_cli_then_the_fix_applied_runs(bundled_model, monkeypatch):
    monkeypatch.setenv("FINETUNE_STUDIO_INJECT_OOM", "forward:2")
    base = [sys.executable, "-m", "studio", "train", str(PRESET), *sum((["--set", o] for o in SMALL), [])]
    done = subprocess.run(base, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "error: out of memory during forward: peak" in done.stderr
    assert "hint: proposed fix: halve the micro-batch to 2 and double gradient accumulation to 2" in done.stderr
    assert "Traceback" not in done.stderr
    monkeypatch.delenv("FINETUNE_STUDIO_INJECT_OOM")
    fixed = subprocess.run([*base, "--set", "train.micro_batch_size=2", "--set", "train.gradient_accumulation_steps=2"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert fixed.returncode == 0, fixed.stderr[-1500:]


@pytest.mark.parametrize("code, words", [(errno.ENOSPC, "the disk is full while writing"),
                                         (errno.EROFS, "cannot write")])
def test_disk_full_while_saving_a_checkpoint(bundled_model, tmp_path, monkeypatch, code, words):
    real_save = torch.save

    def failing_save(obj, f, *args, **kwargs):
        if "checkpoint-8" in str(f):
            raise OSError(code, errno.errorcode[code].lower(), str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing_save)
    run_dir = tmp_path / "run"
    config, exc = run_in_process(run_dir, [])
    assert isinstance(exc, OSError)
    failure = classify_failure(exc, config, run_dir)
    assert failure.kind == "disk_full"
    assert words in failure.message and "checkpoint-4 is intact" in failure.message
    if code == errno.ENOSPC:
        assert "MiB free is needed (" in failure.message and "MiB free now)" in failure.message
    assert failure.hint == f"free space on that disk, then start `finetune-studio train --resume {run_dir}`"
    folder = RunFolder(run_dir)
    assert [c.name for c in folder.complete_checkpoints()] == ["checkpoint-4"]
    assert not (run_dir / "checkpoints" / "checkpoint-8").exists()
    monkeypatch.setattr(torch, "save", real_save)
    config, exc = run_in_process(run_dir, [])  # resume-worthy: the intact checkpoint still loads
    assert exc is None


def test_no_listening_port_and_no_network_env(bundled_model):
    """Security defaults: the worker runs offline and opens no listening socket."""
    import psutil

    from backend.runtime.processes import worker_env
    from backend.cli.worker_process import WorkerProcess

    env = worker_env({})
    assert env["HF_HUB_OFFLINE"] == "1"
    config = RunConfig.load(PRESET, [*SMALL, "train.max_steps=3"])
    folder = RunFolder.create(config)
    worker = WorkerProcess()
    seen = []

    def on_event(event):
        if event["type"] == "MetricsLogged" and not seen and worker._proc is not None:
            process = psutil.Process(worker._proc.pid)
            seen.append([c for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN])

    assert worker.run(folder, config, on_event=on_event)["type"] == "JobFinished"
    assert seen == [[]]
    assert "token" not in folder.config_path.read_text().lower()
