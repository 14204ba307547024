"""MemoryRecord: a run's predicted memory beside what it measured, kept in the run folder as memory.json.

An estimate is only worth its last check: every fine-tune that finishes, stops with a save, or
runs out of memory writes what was predicted for it (the total and the parts, on which device,
calibrated how) next to what it measured (the worker's peak RSS, VmHWM; on CUDA also torch's peak
allocated and reserved) and the worker's resident memory at start, before any weight is loaded
(the process baseline the CPU estimate is calibrated from, backend/estimate/calibration.py). Torch-free:
the studio's Runs and Train pages and the estimate read it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from backend.core.units import human_bytes

FILE_NAME = "memory.json"


class MemoryRecord(BaseModel):
    """What one run predicted and measured, in bytes."""

    model_config = ConfigDict(extra="ignore")
    device: Literal["cpu", "cuda"]
    outcome: Literal["finished", "stopped", "out_of_memory"]
    predicted_total_bytes: int | None = None
    """The estimate's total (its step peak plus the fixed runtime) for this run, or None without one."""
    predicted_parts: dict[str, int] = Field(default_factory=dict)
    calibration: str = ""
    """How the estimate's process baseline was set ("calibrated from 3 runs measured here", ...)."""
    measured_peak_bytes: int
    """What the prediction is compared with: the worker's peak RSS on the CPU, torch's peak reserved on CUDA."""
    measured_kind: str
    peak_rss_bytes: int | None = None
    cuda_max_allocated_bytes: int | None = None
    cuda_max_reserved_bytes: int | None = None
    process_baseline_bytes: int | None = None
    """The worker's RSS after its libraries were imported, before the model was loaded."""
    time: float = Field(default_factory=time.time)

    def ratio(self) -> float | None:
        """Measured over predicted (1.0: exact)."""
        if not self.predicted_total_bytes:
            return None
        return self.measured_peak_bytes / self.predicted_total_bytes

    def comparison(self) -> str:
        """"predicted 620.0 MiB, measured 598.0 MiB (96%)", or the measurement alone."""
        measured = human_bytes(self.measured_peak_bytes)
        ratio = self.ratio()
        if ratio is None:
            return f"measured {measured} (no prediction)"
        return f"predicted {human_bytes(self.predicted_total_bytes or 0)}, measured {measured} ({ratio:.0%})"

    def write(self, run_dir: Path) -> Path:
        """Write memory.json atomically (a reader sees the old file or the new one, never half)."""
        target = Path(run_dir) / FILE_NAME
        tmp = target.with_name(FILE_NAME + ".tmp")
        with tmp.open("w", encoding="utf-8") as handle:
            handle.write(self.model_dump_json(indent=1))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        return target

    @classmethod
    def read(cls, run_dir: str | Path) -> "MemoryRecord | None":
        """The run's record, or None where there is none or it cannot be read."""
        try:
            return cls.model_validate(json.loads((Path(run_dir) / FILE_NAME).read_text(encoding="utf-8")))
        except (OSError, ValueError, ValidationError):
            return None
