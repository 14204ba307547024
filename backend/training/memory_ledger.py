"""MemoryLedger: the worker's memory at the start and peak of a fine-tune, written as the run's memory.json.

The estimate is checked after every run, on the machine that ran it: before the model loads the
ledger takes the worker's resident memory (its process baseline: Python, torch, transformers, the
tokenizer and the tokenized data) and the estimate the studio showed for this config (the same
backend.estimate.run_estimate call); when the run ends it adds the measured peak (VmHWM, and on CUDA
torch's peak allocated and reserved) and writes backend.core.runs.memory_record.MemoryRecord. It never
fails a run: a record that cannot be made is a line in worker.log.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
from pathlib import Path

from backend.core.config.run_config import RunConfig
from backend.core.runs.memory_record import MemoryRecord
from backend.core.protocol import Capabilities
from backend.estimate.run_estimate import RunEstimate, estimate_here

log = logging.getLogger(__name__)


def _status_bytes(key: str) -> int | None:
    """A /proc/self/status figure (VmRSS, VmHWM) in bytes; None off Linux."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_now() -> int:
    """The process' resident memory now."""
    value = _status_bytes("VmRSS")
    if value is not None:
        return value
    import psutil

    return int(psutil.Process().memory_info().rss)


def rss_peak() -> int:
    """The process' highest resident memory so far (VmHWM; getrusage where /proc is missing)."""
    value = _status_bytes("VmHWM")
    if value is not None:
        return value
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS reports bytes, Linux KiB


class MemoryLedger:
    """Started before the model loads, written when the run ends (finished, stopped, out of memory)."""

    def __init__(self, config: RunConfig, run_dir: Path) -> None:
        self.config, self.run_dir = config, Path(run_dir)
        self.device = "cpu"
        self.baseline: int | None = None
        self.estimate: RunEstimate | None = None

    @property
    def started(self) -> bool:
        return self.baseline is not None

    def start(self, device: str, caps: Capabilities) -> None:
        """Take the process baseline, then the estimate (reading the data would count in the baseline)."""
        self.device = device
        self.baseline = rss_now()
        try:
            self.estimate = estimate_here(self.config, device, caps)
        except Exception as exc:  # noqa: BLE001 - the record is a check, never a reason to fail
            log.warning("memory record: no estimate (%s)", exc)

    def write(self, outcome: str) -> MemoryRecord | None:
        """Write memory.json (rank 0 only); None where it could not be written."""
        if int(os.environ.get("RANK", "0")) != 0 or not self.started:
            return None
        try:
            record = self._record(outcome)
            record.write(self.run_dir)
        except Exception as exc:  # noqa: BLE001
            log.warning("memory record not written: %s", exc)
            return None
        log.info("memory: %s (%s)", record.comparison(), record.measured_kind)
        return record

    def _record(self, outcome: str) -> MemoryRecord:
        peak_rss = rss_peak()
        allocated = reserved = None
        if self.device == "cuda":
            import torch

            allocated, reserved = int(torch.cuda.max_memory_allocated()), int(torch.cuda.max_memory_reserved())
        breakdown = self.estimate.breakdown if self.estimate is not None else None
        measured, kind = ((reserved, "CUDA max reserved (torch's allocator, without the CUDA context)")
                          if reserved is not None else (peak_rss, "worker peak RSS (VmHWM)"))
        return MemoryRecord(
            device="cuda" if self.device == "cuda" else "cpu",
            outcome=outcome,  # type: ignore[arg-type]
            predicted_total_bytes=int(breakdown.total_bytes) if breakdown is not None else None,
            predicted_parts=breakdown.breakdown() if breakdown is not None else {},
            calibration=self.estimate.calibration.note() if self.estimate is not None and self.device == "cpu" else "",
            measured_peak_bytes=measured,
            measured_kind=kind,
            peak_rss_bytes=peak_rss,
            cuda_max_allocated_bytes=allocated,
            cuda_max_reserved_bytes=reserved,
            process_baseline_bytes=self.baseline,
        )
