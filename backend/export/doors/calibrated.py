"""The calibrated formats' door (gptq-int4, awq-int4, w8a8): fitted on the run's data and written by
compressed-tensors (backend/export/calibrated/), read back by transformers through compressed-tensors.
Their refusal door is backend/export/calibrated/support.py, torch-free."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.export.calibrated.writer import load_calibrated_export, write_calibrated
from backend.export.doors.work import ExportWork, folder_checks

__all__ = ["Writer", "checks", "read_back"]
checks = folder_checks


class Writer:
    """A merged 16-bit scratch copy, calibrated in memory, packed one layer at a time."""

    planned_bytes = None  # the registry's disk rule counts them, the scratch copy included

    def __init__(self, work: ExportWork):
        self.work = work

    def write(self, folder: Path) -> list[str]:
        work = self.work
        return write_calibrated(work.fmt.name, work.source, work.run, work.tokenizer, folder, work.dtype,
                                work.calibration_samples, work.device, work.progress, work.should_stop,
                                work.note)


def read_back(work: ExportWork, folder: Path) -> tuple[Any, str, str, str]:
    """The folder as transformers loads it through compressed-tensors, unpacked to the export's dtype."""
    model, loaded_as, check_dtype = load_calibrated_export(folder, work.dtype, work.device, work.trust_remote_code)
    return model, loaded_as, check_dtype, ""
