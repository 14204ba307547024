"""continue_run: a finished run trains on as a new run; the finished one is left byte for byte."""

from __future__ import annotations

import json
import os

import pytest

from backend.core.config.run_config import RunConfig
from backend.core.runs.run_continuation import ORIGIN, continue_run
from backend.core.runs.run_folder import CHECKPOINT_MARKER, RunFolder


def _finished(tmp_path, config: RunConfig | None = None) -> RunFolder:
    folder = RunFolder.create(config or RunConfig(name="base-run"), root=tmp_path)
    checkpoint = folder.checkpoints_dir / "checkpoint-10"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter_model.safetensors").write_bytes(b"weights")
    (checkpoint / CHECKPOINT_MARKER).write_text("{}")
    events = [{"type": "JobStarted", "run_dir": str(folder.path), "max_steps": 10}]
    events += [{"type": "MetricsLogged", "step": s, "max_steps": 10, "loss": 1.0 / s} for s in range(1, 11)]
    events += [{"type": "JobFinished", "run_dir": str(folder.path), "steps": 10},
               {"type": "JobStarted", "job": "export", "run_dir": str(folder.path)},
               {"type": "MetricsLogged", "step": 1, "max_steps": 3}]
    folder.events_path.write_text("".join(json.dumps(e) + "\n" for e in events))
    return folder


def test_continue_run_links_the_checkpoint_and_carries_the_history(tmp_path):
    source = _finished(tmp_path)
    before = {p: p.read_bytes() for p in source.path.rglob("*") if p.is_file()}
    more = continue_run(source, 7)
    config = more.load_config()
    assert config.train.max_steps == 17 and config.name == "base-run-more"
    linked = more.latest_checkpoint()
    assert linked is not None and linked.name == "checkpoint-10"
    original = source.checkpoints_dir / "checkpoint-10" / "adapter_model.safetensors"
    assert os.path.samefile(linked / "adapter_model.safetensors", original)  # a hard link, not a copy
    steps = [e["step"] for e in more.metrics()]
    assert steps == list(range(1, 11))  # the training history only, not the export's progress
    assert json.loads((more.path / ORIGIN).read_text())["continues"] == source.run_id
    assert {p: p.read_bytes() for p in source.path.rglob("*") if p.is_file()} == before
    (linked / "adapter_model.safetensors").unlink()  # the new run rotating its checkpoints...
    assert original.read_bytes() == b"weights"  # ...never removes the finished run's files


def test_an_epoch_counted_run_continues_counted_in_steps(tmp_path):
    """num_epochs ruled the first run; the new one is its checkpoint's step plus N, so max_steps rules."""
    source = _finished(tmp_path, RunConfig.from_dict({"name": "epochs", "train": {"num_epochs": 2}}))
    config = continue_run(source, 7).load_config()
    assert (config.train.max_steps, config.train.num_epochs) == (17, None)


def test_continue_run_refuses_what_it_cannot_do(tmp_path):
    source = _finished(tmp_path)
    with pytest.raises(ValueError, match="at least 1"):
        continue_run(source, 0)
    empty = RunFolder.create(RunConfig(name="empty"), root=tmp_path)
    with pytest.raises(ValueError, match="no complete checkpoint"):
        continue_run(empty, 5)


def test_a_run_without_a_tuned_model_is_sent_to_resume_only_when_it_can(tmp_path):
    from backend.core.errors import JobError
    from backend.export.merge import TrainedRun
    from backend.core.runs.run_continuation import how_to_finish

    cancelled = RunFolder.create(RunConfig(name="cancelled-early"), root=tmp_path)
    assert "left no checkpoint to resume from: train it again with `finetune-studio train " in how_to_finish(cancelled)
    with pytest.raises(JobError) as caught:
        TrainedRun.check(cancelled.path, cancelled.load_config(), "adapter")
    assert "--resume" not in caught.value.hint and str(cancelled.config_path) in caught.value.hint
    stopped = _finished(tmp_path)
    assert how_to_finish(stopped, "export").startswith(f"resume it with `finetune-studio train --resume {stopped.path}`")
    assert how_to_finish(stopped, "export").endswith("(it continues from checkpoint-10), then export")


def test_a_run_folder_stores_relative_model_and_data_paths_absolute(tmp_path, monkeypatch):
    data = tmp_path / "work" / "mine.jsonl"
    data.parent.mkdir()
    data.write_text('{"instruction": "a", "output": "b"}\n')
    monkeypatch.chdir(tmp_path / "work")
    config = RunConfig.from_dict({"name": "relative", "data": {"path": "mine.jsonl"},
                                  "model": {"path": "bundled:tiny"}})
    folder = RunFolder.create(config, root=tmp_path / "runs")
    monkeypatch.chdir(tmp_path)  # chat or eval from another folder still finds the data
    saved = folder.load_config()
    assert saved.data.path == str(data) and saved.model.path == "bundled:tiny"
    assert saved.resolved_data_path().is_file()


def test_a_checkpoint_resumes_only_at_its_own_rank_and_method(tmp_path, capsys):
    from backend.cli.app import main
    from backend.core.runs.run_continuation import resume_mismatch

    source = _finished(tmp_path)
    checkpoint = source.latest_checkpoint()
    (checkpoint / "adapter_config.json").write_text(json.dumps({"r": 8, "use_dora": False, "peft_type": "LORA"}))
    config = source.load_config()
    assert resume_mismatch(checkpoint, config.model_copy(update={"technique": config.technique.model_copy(
        update={"lora_rank": 8})})) == ""
    wider = config.technique.model_copy(update={"lora_rank": 16})
    assert "was trained at rank 8: a checkpoint resumes only at its own rank; set technique.lora_rank: 8" in \
        resume_mismatch(checkpoint, config.model_copy(update={"technique": wider}))
    full = config.technique.model_copy(update={"method": "full", "lora_rank": 8})
    assert "holds a LoRA adapter but technique.method is full" in \
        resume_mismatch(checkpoint, config.model_copy(update={"technique": full}))
    stopped = source.path / "events.jsonl"
    stopped.write_text(stopped.read_text().replace('"steps": 10}', '"steps": 10, "stopped": true}'))
    code = main(["train", "--resume", str(source.path), "--set", "technique.lora_rank=16"])
    err = capsys.readouterr().err
    assert code == 2 and "was trained at rank 8" in err and "Traceback" not in err
