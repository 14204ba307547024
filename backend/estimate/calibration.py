"""Calibration: the CPU worker's process baseline, from the runs already measured on this machine.

A CPU worker's peak RSS holds the Python, torch and transformers process itself (hundreds of MiB)
besides the tensors the estimate counts, so the CPU estimate's runtime part is that baseline. It
differs with the machine, the Python and the library versions, so it is not a constant: each run
records its worker's RSS at start, before the model loads (memory.json, backend/core/runs/memory_record.py),
and the estimate takes the median of the newest NEWEST of them. Before any run here it uses
DEFAULT_BASELINE_BYTES and says it is not calibrated yet. Torch-free: the studio and the CLI read it.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from backend.core.units import human_bytes
from backend.core.runs.memory_record import MemoryRecord
from backend.core.paths import runs_dir

DEFAULT_BASELINE_BYTES = 540_815_360
"""The worker's RSS before it loads the model, as first recorded on the development machine (docs/
benchmarks.md, "CUDA context and baseline figures"); a machine's own runs replace it."""
NEWEST = 20
"""Records taken into the median, newest first (a library upgrade moves the baseline)."""


class Calibration(BaseModel):
    """The process baseline the CPU estimate adds, and where it came from."""

    model_config = ConfigDict(frozen=True)
    baseline_bytes: int = DEFAULT_BASELINE_BYTES
    runs: int = 0
    """Runs the baseline is the median of; 0: the stated default."""

    @property
    def calibrated(self) -> bool:
        return self.runs > 0

    def note(self) -> str:
        """One sentence for the breakdown: how the process baseline was set."""
        if self.calibrated:
            return (f"process baseline {human_bytes(self.baseline_bytes)}: calibrated from {self.runs} "
                    f"run{'s' if self.runs != 1 else ''} measured here (median worker RSS before the model loads)")
        return (f"process baseline {human_bytes(self.baseline_bytes)}: not calibrated yet (the default, measured on "
                "the project's development machine); each run here measures its own")

    @classmethod
    def read(cls, root: Path | None = None) -> "Calibration":
        """The median baseline of the CPU runs recorded under `root` (the runs folder), or the default."""
        root = runs_dir() if root is None else Path(root)
        records = []
        try:
            children = [p for p in root.iterdir() if p.is_dir()]
        except OSError:
            return cls()
        for child in children:
            record = MemoryRecord.read(child)
            if record is not None and record.device == "cpu" and record.process_baseline_bytes:
                records.append(record)
        if not records:
            return cls()
        newest = sorted(records, key=lambda r: r.time, reverse=True)[:NEWEST]
        median = statistics.median(r.process_baseline_bytes or 0 for r in newest)
        return cls(baseline_bytes=int(median), runs=len(newest))
