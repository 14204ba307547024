"""Exact resume: SIGKILL after a checkpoint, resume, and every later loss matches the run that was
never interrupted (model, optimizer, scheduler, RNG and data order all restored)."""

from __future__ import annotations

from backend.core.config.run_config import RunConfig
from backend.core.runs.run_folder import RunFolder
from backend.cli.worker_process import WorkerProcess
from tests.conftest import PRESET

OVERRIDES = ["train.max_steps=12", "train.save_steps=4", "data.max_examples=120", "train.seq_len=128",
             "train.micro_batch_size=4", "technique.lora_dropout=0.1", "train.warmup_steps=2",
             "data.validation_split=0"]


def losses_of_last_attempt(folder: RunFolder) -> dict[int, float]:
    losses: dict[int, float] = {}
    for event in folder.iter_events():
        if event["type"] == "JobStarted":
            losses = {}
        elif event["type"] == "MetricsLogged":
            losses[event["step"]] = event["loss"]
    return losses


def all_losses(folder: RunFolder) -> dict[int, float]:
    """Every logged loss, first attempt first (a resumed step overwrites nothing it did not redo)."""
    losses: dict[int, float] = {}
    for event in folder.iter_events():
        if event["type"] == "MetricsLogged":
            losses.setdefault(event["step"], event["loss"])
    return losses


def test_kill_after_checkpoint_then_resume_matches_uninterrupted(bundled_model):
    config = RunConfig.load(PRESET, [*OVERRIDES, "name=straight"])
    straight = RunFolder.create(config)
    assert WorkerProcess().run(straight, config)["type"] == "JobFinished"
    expected = losses_of_last_attempt(straight)
    assert sorted(expected) == list(range(1, 13))

    config = RunConfig.load(PRESET, [*OVERRIDES, "name=killed"])
    killed = RunFolder.create(config)
    worker = WorkerProcess()

    def on_event(event: dict) -> None:
        if event["type"] == "CheckpointSaved" and event["step"] == 8:
            worker.kill()

    first = worker.run(killed, config, on_event=on_event)
    assert first["type"] == "JobFailed" and first["kind"] == "crashed", first
    assert killed.latest_checkpoint().name == "checkpoint-8"

    resumed = WorkerProcess().run(killed, config, resume=True)
    assert resumed["type"] == "JobFinished" and resumed["steps"] == 12, resumed
    started = [e for e in killed.iter_events() if e["type"] == "JobStarted"]
    assert started[-1]["resumed_from"].endswith("checkpoint-8")

    before = all_losses(killed)
    after = losses_of_last_attempt(killed)
    assert sorted(after) == list(range(9, 13))
    for step in range(1, 9):
        assert abs(before[step] - expected[step]) < 1e-5, (step, before[step], expected[step])
    for step in range(9, 13):
        assert abs(after[step] - expected[step]) < 1e-5, (step, after[step], expected[step])
