"""The bitsandbytes formats' door: this machine's bitsandbytes probed before anything loads, the merged
model quantized by transformers' own loader, read back quantized."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backend.core.errors import JobError
from backend.core.registries.export_formats import export_format
from backend.export import hf_writer
from backend.export.doors.work import ExportWork, folder_checks

__all__ = ["Writer", "checks", "read_back", "refuse"]
checks = folder_checks


def refuse(name: str, run: Any) -> None:
    """Refuse a bitsandbytes that cannot save `bits`-bit models which reload correctly (hf_writer's probe)."""
    bits = export_format(name).bits
    problem = hf_writer.bnb_serialization_problem(bits, hf_writer.bnb_device())
    if problem:
        raise JobError("missing_dependency", f"{name}: this machine's bitsandbytes cannot save {bits}-bit "
                       f"models that reload correctly ({problem})", "export merged or a gguf format instead")


class Writer:
    """Merged 16-bit into a scratch folder, quantized while transformers loads it, saved quantized."""

    planned_bytes = None  # the registry's disk rule counts them, the scratch copy included

    def __init__(self, work: ExportWork):
        self.work = work

    def write(self, folder: Path) -> list[str]:
        work = self.work
        hf_writer.write_bnb(work.source, work.run, work.tokenizer, folder, work.fmt.bits, work.dtype, work.progress,
                            work.should_stop)
        return []


def read_back(work: ExportWork, folder: Path) -> tuple[Any, str, str, str]:
    """The folder as transformers loads it: the linear layers quantized, the rest in the export's dtype."""
    model, loaded_as = hf_writer.load_bnb_export(folder, work.fmt.bits, work.dtype, work.device,
                                                 work.trust_remote_code)
    return model, loaded_as, work.dtype, ""
