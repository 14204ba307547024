"""classify_failure: any exception -> one JobFailed a person can act on.

Out-of-memory gets the most care: the phase it struck in, the peak seen, the estimate's prediction
and a fix the studio can apply with one click (as config overrides). A full or read-only disk
removes what it left half-written and says how much space the save needs, which checkpoint was cut
short and which is intact; it is recognised through the libraries that hide its errno (safetensors'
SafetensorError text, torch.save's zip writer).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
import resource
import shutil
from pathlib import Path
from typing import Any

from backend.core.config.run_config import ConfigError, RunConfig
from backend.core.errors import JobError
from backend.core.runs.memory_record import MemoryRecord
from backend.core.protocol import JobFailed
from backend.core.runs.run_folder import RunFolder
from backend.training.phase import is_out_of_memory

log = logging.getLogger(__name__)
DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EDQUOT, errno.EPERM}
RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
"""How Rust libraries (safetensors' SafetensorError, tokenizers) carry an OS error: as text, not an OSError."""


TORCH_WRITER = ("unexpected pos", "PytorchStreamWriter", "iostream error")
"""What torch.save's zip writer says when a write fails, with no errno (a full disk: "[enforce fail at
inline_container.cc:672] . unexpected pos 605248 vs 605136")."""
LOW_FREE = 64 * 2**20
"""Free bytes under which a torch writer failure on the run's disk is taken for a full disk."""


def os_error(exc: BaseException, run_dir: Path | None = None) -> OSError | None:
    """The disk's OSError behind `exc`: itself, the one a Rust library wrapped as text (a full disk while
    safetensors writes a checkpoint: "I/O error: No space left on device (os error 28)"), or a full disk
    behind torch.save's errno-less writer failure when the run's disk is in fact (nearly) full."""
    if isinstance(exc, OSError):
        return exc if exc.errno in DISK_ERRNOS else None
    text = str(exc)
    found = RUST_OS_ERROR.search(text)
    code = int(found.group(1)) if found else None
    if code in DISK_ERRNOS:
        return OSError(code, os.strerror(code))
    if run_dir is not None and isinstance(exc, RuntimeError) and any(mark in text for mark in TORCH_WRITER):
        try:
            full = shutil.disk_usage(run_dir).free < LOW_FREE
        except OSError:
            full = False
        if full:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return None


def _phase() -> str | None:
    try:
        from backend.training.phase import current
    except ImportError:
        return None
    return current()[0]


def peak_bytes() -> int:
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.max_memory_allocated())
    except ImportError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def predicted_bytes(config: RunConfig) -> int | None:
    """The estimate's total for this run: the same figure the studio and memory.json show."""
    try:
        from backend.estimate.run_estimate import estimate_here

        device = "cpu"
        try:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            pass
        return estimate_here(config, device).total_bytes
    except Exception as exc:  # the estimate must never hide the real failure
        log.warning("no estimate for the out-of-memory report: %s", exc)
        return None


def propose_fix(config: RunConfig) -> tuple[dict[str, Any], str]:
    """The cheapest change likely to fit, as overrides and a sentence."""
    train, technique = config.train, config.technique
    if train.micro_batch_size > 1:
        mb, ga = train.micro_batch_size // 2, train.gradient_accumulation_steps * 2
        return ({"train.micro_batch_size": mb, "train.gradient_accumulation_steps": ga},
                f"halve the micro-batch to {mb} and double gradient accumulation to {ga} (same effective batch)")
    if not technique.gradient_checkpointing:
        return {"technique.gradient_checkpointing": True}, "turn gradient checkpointing on (one extra forward pass)"
    if technique.method in ("lora", "dora", "full"):
        return {"technique.method": "qlora"}, "switch to qlora (4-bit base weights)"
    return {"train.seq_len": max(8, train.seq_len // 2)}, f"halve train.seq_len to {max(8, train.seq_len // 2)}"


def _gib(n: int | None) -> str:
    return f"{n / 2**30:.2f} GiB" if n is not None else "unknown"


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def disk_failure(exc: OSError, run_dir: Path | None) -> JobFailed:
    """Remove half-written checkpoints and say which one was cut short, which one is intact, what the save
    needed and what is free, so the resume command in the hint is known to have a checkpoint to start from."""
    needed, cut, latest = None, [], None
    if run_dir is not None:
        folder = RunFolder(run_dir)
        incomplete = [p for p in folder.checkpoints_dir.glob("checkpoint-*") if p.is_dir()
                      and p not in folder.complete_checkpoints()] if folder.checkpoints_dir.is_dir() else []
        partial_sizes = [_folder_bytes(p) for p in incomplete]  # measured before they go
        cut = sorted(p.name for p in folder.remove_incomplete_checkpoints())
        for leftover in run_dir.glob("*.partial"):
            shutil.rmtree(leftover, ignore_errors=True)
        latest = folder.latest_checkpoint()
        needed = _folder_bytes(latest) if latest else (max(partial_sizes) * 2 if any(partial_sizes) else None)
    where = exc.filename or (str(run_dir / "checkpoints" / cut[0]) if run_dir is not None and cut
                             else str(run_dir) if run_dir else "the output folder")
    if cut:
        state = (f"; {', '.join(cut)} {'was' if len(cut) == 1 else 'were'} cut short and removed; "
                 + (f"{latest.name} is intact (the newest complete checkpoint)" if latest
                    else "no complete checkpoint is left"))
    else:
        state = f"; {latest.name} is intact" if latest else ""
    space = f"about {math.ceil(needed / 2**20)} MiB free is needed" if needed else "free some space"
    try:
        free = f" ({shutil.disk_usage(run_dir or Path(where).parent).free / 2**20:.0f} MiB free now)"
    except OSError:
        free = ""
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        message = f"the disk is full while writing {where}: {space}{free}{state}"
    else:
        message = f"cannot write {where} ({exc.strerror}){state}"
    resume = f"`finetune-studio train --resume {run_dir}`" if latest is not None else "the run again"
    return JobFailed(kind="disk_full", message=message, hint=f"free space on that disk, then start {resume}",
                     phase=_phase())


def classify_failure(exc: BaseException, config: RunConfig | None = None, run_dir: Path | None = None) -> JobFailed:
    if isinstance(exc, JobError):
        return JobFailed(kind=exc.kind, message=exc.message, hint=exc.hint, **exc.details)
    if isinstance(exc, ConfigError):
        return JobFailed(kind="bad_input", message=str(exc), hint="fix the field named and start again")
    if isinstance(exc, KeyboardInterrupt):
        return JobFailed(kind="cancelled", message="the worker was interrupted")
    if is_out_of_memory(exc):
        phase = _phase() or "unknown phase"
        peak = peak_bytes()
        recorded = MemoryRecord.read(run_dir) if run_dir is not None else None  # the job's own, made before it ran
        predicted = (recorded.predicted_total_bytes if recorded is not None and recorded.predicted_total_bytes
                     else predicted_bytes(config) if config else None)
        fix, sentence = propose_fix(config) if config else ({}, "lower train.micro_batch_size")
        return JobFailed(
            kind="out_of_memory",
            message=f"out of memory during {phase}: peak {_gib(peak)} seen, {_gib(predicted)} predicted",
            hint=f"proposed fix: {sentence}",
            phase=phase, peak_bytes=peak, predicted_bytes=predicted, fix=fix,
        )
    disk = os_error(exc, run_dir)
    if disk is not None:
        return disk_failure(disk, run_dir)
    if isinstance(exc, ImportError):
        return JobFailed(kind="missing_dependency", message=f"{exc}", hint="reinstall with the README's command")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return JobFailed(
        kind="crashed",
        message=f"{type(exc).__name__}: {first}"[:300],
        hint="the full traceback is in worker.log in the run folder",
        phase=_phase(),
    )
