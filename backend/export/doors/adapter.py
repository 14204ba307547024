"""The adapter format's door: the run's PEFT folder copied as trained, read back by peft on the base."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.export import hf_writer
from backend.export.doors.work import ExportWork, folder_checks
from backend.export.merge import DTYPES, load_trained

__all__ = ["Writer", "checks", "read_back"]
checks = folder_checks


class Writer:
    """Copies the adapter's files; plans its bytes as those files' size."""

    def __init__(self, work: ExportWork):
        self.work = work
        self.planned_bytes = sum(p.stat().st_size for p in work.run.weights_dir.iterdir() if p.is_file())

    def write(self, folder: Path) -> list[str]:
        hf_writer.write_adapter(self.work.run, folder)
        return []


def read_back(work: ExportWork, folder: Path) -> tuple[Any, str, str, str]:
    """The base as trained with the written adapter on top, through peft."""
    model = load_trained(work.run, DTYPES[work.dtype], work.device, adapter_dir=folder)
    return model, f"peft PeftModel.from_pretrained on the base as trained, {work.dtype} on {work.device}", work.dtype, ""
