"""The window's predicted / measured pair for DPO, KTO and GRPO: within 10% on the tiny presets.

Issue 33: the estimate counted every row at train.seq_len (128) while TRL pads each batch to its
longest row (the demo's 42-token pairs), and predicted 1.3-1.6x the worker's peak. A real short run
of each preset through the real worker, then its memory.json (what the Train page shows after a run).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from backend.cli.worker_process import WorkerProcess
from backend.core.config.run_config import RunConfig
from backend.core.runs.memory_record import MemoryRecord
from backend.core.runs.run_folder import RunFolder
from backend.estimate.calibration import Calibration
from backend.estimate.objective_rows import longest_row
from backend.estimate.run_estimate import estimate_run
from tests.conftest import ROOT

PRESETS = ROOT / "resources" / "presets"


@pytest.mark.parametrize("objective, row", [("dpo", 42), ("kto", 42), ("grpo", 38)])
def test_longest_row_is_what_trl_builds_from_the_demo_data(bundled_model, objective, row):
    """DPO: the templated prompt with its longer answer; KTO: the longest prompt + the longest
    completion; GRPO: the longest prompt with the generation prompt (transformers' apply_chat_template
    on the bundled tokenizer gives 42, 42 and 38)."""
    config = RunConfig.load(PRESETS / f"tiny_{objective}.yaml")
    assert longest_row(config) == row
    fitted = estimate_run(config, "cpu", calibration=Calibration()).total_bytes
    worst = estimate_run(config, "cpu", calibration=Calibration(), data_rows=False).total_bytes
    assert fitted is not None and worst is not None and fitted < worst


def test_sft_has_no_objective_row(bundled_model):
    assert longest_row(RunConfig.load(PRESETS / "tiny_lora.yaml")) is None


def test_data_too_large_to_read_whole_counts_seq_len_rows(bundled_model, tmp_path, monkeypatch):
    """As SFT's longest answer: past MAX_MEASURED records a sample could miss the longest row."""
    from backend.estimate import objective_rows

    monkeypatch.setattr(objective_rows, "MAX_MEASURED", 10)
    lines = (PRESETS.parent / "datasets" / "demo_dpo.jsonl").read_text().splitlines()
    config = RunConfig.load(PRESETS / "tiny_dpo.yaml")
    for count, expected in ((10, True), (11, False)):
        data = tmp_path / f"pairs{count}.jsonl"
        data.write_text("\n".join(lines[:count]) + "\n")
        measured = longest_row(config.model_copy(update={"data": config.data.model_copy(update={"path": str(data)})}))
        assert (measured is not None) is expected


MEMORY_RUN = ["train.max_steps=3", "train.save_steps=1000", "data.max_examples=64", "data.validation_split=0"]


def assert_the_windows_pair_agrees(run_dir: Path, config: RunConfig) -> None:
    """memory.json of a finished worker run: its prediction is the Train page's figure, within 10% of the peak."""
    record = MemoryRecord.read(run_dir)
    assert record is not None and record.predicted_total_bytes and record.device == "cpu"
    shown = estimate_run(config, "cpu", calibration=Calibration())  # the Train page's figure, fresh home
    assert record.predicted_total_bytes == shown.total_bytes
    ratio = record.ratio()
    assert ratio is not None and 0.9 <= ratio <= 1.1, record.comparison()


# DPO's case runs in test_preference.py::test_cli_trains_the_dpo_preset_through_the_worker (one worker run)
@pytest.mark.parametrize("objective", ["kto", "grpo"])
def test_the_windows_pair_agrees_within_ten_percent(bundled_model, objective):
    config = RunConfig.load(PRESETS / f"tiny_{objective}.yaml", [*MEMORY_RUN, f"name=mem-{objective}"])
    folder = RunFolder.create(config)
    terminal = WorkerProcess().run(folder, config, on_event=lambda event: None)
    assert terminal["type"] == "JobFinished", terminal
    assert_the_windows_pair_agrees(folder.path, config)
