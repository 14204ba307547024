"""ExportWork: what the export job hands a format's writer and verifier, and the Hugging Face folders'
own checks.

The job (backend/jobs/export.py) builds one ExportWork once the run is checked, and asks the format's
doors (backend/core/registries/export_formats.py's Doors) to write and read back through it, so a door
sees one object instead of the job's stages.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from backend.core.registries.export_formats import ExportFormat
from backend.export.merge import TrainedRun
from backend.export.merged_source import MergedSource


@dataclass
class ExportWork:
    """One export as its doors see it."""

    fmt: ExportFormat
    run: TrainedRun
    tokenizer: Any  # the run's tokenizer (saved beside its adapter)
    source: MergedSource | None  # the merged tensors, one at a time (None: the adapter is written as trained)
    dtype: str  # the export's 16-bit dtype (bf16 or fp16)
    device: str  # where the check (and a calibration) runs
    calibration_samples: int  # rows of training data a calibrated format fits to
    progress: Callable[[int, int], None]  # (tensor, tensors) while writing
    should_stop: Callable[[], bool]  # a Stop was asked: the writer raises InterruptedError
    note: Callable[[str], None] | None = None  # a line of progress in words ("gptq: layer 7/30, 41 s left")

    @property
    def trust_remote_code(self) -> bool:
        return self.run.config.model.trust_remote_code


class FormatWriter(Protocol):
    """A writer door's `Writer(work)`: the bytes it plans to write (None: the format's disk rule counts them),
    known before the trained model is loaded, and the write itself, which returns the report's notes."""

    planned_bytes: int | None

    def write(self, folder: Path) -> list[str]: ...


def folder_checks(work: ExportWork, folder: Path, measured: list[dict]) -> list[dict]:
    """The measured checks and the tokenizer saved in a Hugging Face folder, compared with the run's."""
    from transformers import AutoTokenizer

    from backend.export import verify

    saved = AutoTokenizer.from_pretrained(folder, trust_remote_code=work.trust_remote_code)
    return [*measured, verify.tokenizer_check(work.tokenizer, saved)]
