"""The merged format's door: the merged model as a 16-bit Hugging Face folder, read back by transformers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.export import hf_writer
from backend.export.doors.work import ExportWork, folder_checks

__all__ = ["Writer", "checks", "read_back"]
checks = folder_checks


class Writer:
    """Streams the merged tensors into safetensors shards beside the config and tokenizer."""

    planned_bytes = None  # the registry's disk rule counts them

    def __init__(self, work: ExportWork):
        self.work = work

    def write(self, folder: Path) -> list[str]:
        work = self.work
        hf_writer.write_merged(work.source, work.run, work.tokenizer, folder, work.dtype, work.progress,
                               work.should_stop)
        return []


def read_back(work: ExportWork, folder: Path) -> tuple[Any, str, str, str]:
    """The folder as plain transformers loads it, in its saved dtype."""
    model, loaded_as = hf_writer.load_merged_export(folder, work.dtype, work.device, work.trust_remote_code)
    return model, loaded_as, work.dtype, ""
