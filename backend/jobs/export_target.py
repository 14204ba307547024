"""One export's request and target: its options parsed from StartJob.params, its folders, and the disk it needs.

Kept apart from the job (backend/jobs/export.py) so the job reads as the stages it runs.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from backend.core.errors import JobError, bad_input
from backend.core.registries.export_formats import (EXPORT_FORMATS, EXPORT_OPTIONS, FORMATS, ExportFormat,
                                                    calibration_samples, overwrite_refusal)
from backend.core.registries.export_formats import DTYPES as DTYPE_NAMES
from backend.runtime.processes import alive
from backend.core.runs.run_folder import fsync_tree
from backend.export.merge import TrainedRun
from backend.export.merged_source import MergedSource


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


class Export:
    """The options of one export, parsed from StartJob.params, and its folders."""

    def __init__(self, run_dir: Path, params: dict[str, Any]):
        unknown = set(params) - set(EXPORT_OPTIONS)
        if unknown:
            raise bad_input(f"unknown export option(s) {sorted(unknown)}; known: {', '.join(EXPORT_OPTIONS)}")
        name = params.get("format")
        if name not in EXPORT_FORMATS:
            raise bad_input(f"export format {name!r} is not one of {', '.join(FORMATS)}")
        self.fmt: ExportFormat = EXPORT_FORMATS[name]
        self.dtype = params.get("dtype") or None  # None: the base's own 16-bit dtype, decided once it is read
        if self.dtype is not None and self.dtype not in DTYPE_NAMES:
            raise bad_input(f"export dtype {self.dtype!r} is not one of {', '.join(DTYPE_NAMES)}")
        self.overwrite = bool(params.get("overwrite", False))
        self.calibration_samples = calibration_samples(params.get("calibration_samples"))  # calibrated formats
        self.out = Path(params.get("out") or run_dir / "exports" / self.fmt.name).expanduser().absolute()
        self.tmp = self.out.with_name(f".{self.out.name}.partial-{os.getpid()}")

    def check_target(self, run: TrainedRun) -> None:
        """Refuse an existing export (without overwrite) and any folder that holds the run's own files."""
        out = self.out.resolve()
        protected = [run.folder.path, run.weights_dir, run.base_path, run.folder.checkpoints_dir]
        for path in protected:
            path = path.resolve()
            if out == path or out in path.parents or (path != run.folder.path.resolve() and path in out.parents):
                raise bad_input(f"{self.out} would overwrite the run's own files ({path}); pick another --out")
        refusal = overwrite_refusal(self.out)
        if refusal:
            raise bad_input(refusal.replace("pick another folder", "pick another --out").replace(
                "pick a new or empty folder", "pass --out with a new or empty folder"))
        if self.out.exists() and any(self.out.iterdir()) and not self.overwrite:
            raise bad_input(f"{self.out} already holds an export; pass --overwrite to replace it, "
                            "or --out to write somewhere else")
        for stale in self.out.parent.glob(f".{self.out.name}.partial-*"):
            pid = stale.name.rsplit("-", 1)[-1]
            if not (pid.isdigit() and alive(int(pid))):
                shutil.rmtree(stale, ignore_errors=True)  # left by an export that was killed

    def free_bytes(self) -> int:
        probe = self.out.parent
        while not probe.exists():
            probe = probe.parent
        return shutil.disk_usage(probe).free

    def disk_full(self, needed: int) -> JobError:
        return JobError(
            "disk_full",
            f"the disk holding {self.out.parent} is full: this {self.fmt.name} export needs about {human_bytes(needed)} free "
            f"and {human_bytes(self.free_bytes())} is free now; nothing was left behind",
            "free some space there, or pass --out on a disk with more room",
        )

    def place(self) -> None:
        """Rename the finished temporary folder into place (replacing the old export when overwriting)."""
        fsync_tree(self.tmp)
        old = None
        if self.out.exists():
            old = self.out.with_name(f".{self.out.name}.old-{os.getpid()}")
            os.replace(self.out, old)
        os.replace(self.tmp, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def estimate_bytes(fmt: ExportFormat, source: MergedSource | None, planned: int | None) -> int:
    """Disk the export needs while it is written: what its writer planned (the adapter's files, a GGUF's
    tensors), else the format's rule per weight of the merged model (the bnb and calibrated formats also
    hold a 16-bit scratch copy meanwhile)."""
    rule = fmt.disk
    if rule is None:
        size = planned
    else:
        params = source.parameter_count()
        linear = source.linear_parameter_count()
        size = (params * 2 if rule.scratch else 0) + int(linear * rule.linear_bytes) + (params - linear) * 2
    return int(size * 1.05) + 1024 * 1024  # tokenizer, metadata, report
