"""The CPU process baseline: read from the memory.json files of the runs measured here, added to the
estimate's runtime part, said where it came from; and memory.json itself."""

from __future__ import annotations

import json

from backend.estimate.calibration import DEFAULT_BASELINE_BYTES, NEWEST, Calibration
from backend.core.config.run_config import RunConfig
from backend.estimate import MIB, estimate
from backend.core.runs.memory_record import FILE_NAME, MemoryRecord
from tests.conftest import PRESET


def record(root, name: str, baseline: int | None, device: str = "cpu", time: float = 1.0, **extra) -> None:
    folder = root / name
    folder.mkdir(parents=True)
    MemoryRecord(device=device, outcome="finished", predicted_total_bytes=600 * MIB, measured_peak_bytes=590 * MIB,
                 measured_kind="worker peak RSS (VmHWM)", process_baseline_bytes=baseline, time=time,
                 **extra).write(folder)


def test_no_runs_yet_is_the_stated_default(tmp_path):
    for root in (tmp_path / "missing", tmp_path):
        calibration = Calibration.read(root)
        assert calibration.baseline_bytes == DEFAULT_BASELINE_BYTES and calibration.runs == 0
        assert "not calibrated yet" in calibration.note()


def test_the_median_of_the_cpu_runs_measured_here(tmp_path):
    for index, baseline in enumerate((500, 520, 900)):
        record(tmp_path, f"run{index}", baseline * MIB, time=index)
    record(tmp_path, "gpu", 5000 * MIB, device="cuda")  # host RSS of a GPU run: not the CPU baseline
    record(tmp_path, "none", None)  # measured nothing at start
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / FILE_NAME).write_text("{not json", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    calibration = Calibration.read(tmp_path)
    assert calibration.runs == 3 and calibration.baseline_bytes == 520 * MIB
    assert calibration.note().startswith("process baseline 520.0 MiB: calibrated from 3 runs measured here")


def test_only_the_newest_runs_count(tmp_path):
    for index in range(NEWEST):
        record(tmp_path, f"new{index}", 600 * MIB, time=1000 + index)
    for index in range(5):
        record(tmp_path, f"old{index}", 100 * MIB, time=index)  # before a library upgrade
    calibration = Calibration.read(tmp_path)
    assert calibration.runs == NEWEST and calibration.baseline_bytes == 600 * MIB


def test_the_estimate_adds_the_baseline_on_the_cpu_only_and_stays_pure():
    config = RunConfig.load(PRESET)
    bare = estimate("bundled:tiny", config, device="cpu")
    calibrated = Calibration(baseline_bytes=500 * MIB, runs=4)
    cpu = estimate("bundled:tiny", config, device="cpu", calibration=calibrated)
    assert bare.runtime == 0 and cpu.runtime == 500 * MIB
    assert cpu.details["runtime"]["process_baseline"] == 500 * MIB
    assert cpu.total_bytes == bare.total_bytes + 500 * MIB
    assert "calibrated from 4 runs measured here" in cpu.details["calibration"]["note"]
    assert cpu.to_json() == estimate("bundled:tiny", config, device="cpu", calibration=calibrated).to_json()
    gpu = estimate("bundled:tiny", config, device="cuda", calibration=calibrated)
    assert gpu.to_json() == estimate("bundled:tiny", config, device="cuda").to_json()  # GPU memory, not host RSS


def test_memory_json_round_trips_and_compares(tmp_path):
    record(tmp_path, "run", 480 * MIB)
    read = MemoryRecord.read(tmp_path / "run")
    assert read is not None and read.process_baseline_bytes == 480 * MIB
    assert read.comparison() == "predicted 600.0 MiB, measured 590.0 MiB (98%)"
    assert not (tmp_path / "run" / (FILE_NAME + ".tmp")).exists()
    assert json.loads((tmp_path / "run" / FILE_NAME).read_text())["device"] == "cpu"
    assert MemoryRecord.read(tmp_path / "nowhere") is None
