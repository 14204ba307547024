"""start_verdicts(): everything that keeps a run from starting, judged once for the window, `train` and `estimate`.

feasibility.before_start says which files are missing and what this machine cannot run; this module adds
what would otherwise only show once a run folder and a worker exist: an estimate over the chosen
device's memory (the one verdict a person may override, "Start anyway" / `--start-anyway`) and a runs
folder that cannot take a new run. Run folder names carry a time stamp and a random suffix
(RunFolder.create), so a name taken by another run is not foreseeable; create picks another suffix.
Torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from backend.core.config.run_config import RunConfig
from backend.core.paths import runs_dir
from backend.core.protocol import Capabilities
from backend.core.units import human_bytes
from backend.estimate.feasibility import Probe, Verdict, before_start

MEMORY_FIELD = "memory"
"""The field a memory verdict names: the run as a whole, on the chosen device."""
MOST_PARTS = 3
"""At most this many parts are named as the ones that would have to go."""


def memory_verdict(breakdown: Any, limit_bytes: int | None, where: str, override: str) -> Verdict | None:
    """The estimate over `limit_bytes` (the device `where` names) as a verdict naming the largest parts,
    those whose sum covers the excess; None when it fits or either is unknown. `override` is how the
    caller lets a person start anyway ("Start anyway", "--start-anyway")."""
    if breakdown is None or not limit_bytes or int(breakdown.total_bytes) <= limit_bytes:
        return None
    total = int(breakdown.total_bytes)
    excess = total - limit_bytes
    named: list[str] = []
    covered = 0
    for part, size in sorted(breakdown.breakdown().items(), key=lambda item: -item[1])[:MOST_PARTS]:
        named.append(f"{part.replace('_', ' ')} {human_bytes(size)}")
        covered += size
        if covered >= excess:
            break
    return Verdict(field=MEMORY_FIELD, allowed=False, overridable=True,
                   reason=f"the estimate is {human_bytes(total)}, over the {human_bytes(limit_bytes)} of {where} by "
                          f"{human_bytes(excess)}; the largest parts: {', '.join(named)}",
                   fix=f"cut those (technique.method, technique.optimizer, train.micro_batch_size, train.seq_len), "
                       f"or {override} if you know better")


def runs_folder_verdicts(root: Path | None = None) -> list[Verdict]:
    """The runs folder as a place for a new run folder: not a file, not inside one, writable."""
    root = root or runs_dir()
    fix = "move it away, or set FINETUNE_STUDIO_HOME to a folder you can write"
    blocker = next((p for p in (root, *root.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        where = "is a file" if blocker == root else f"is inside a file ({blocker})"
        return [Verdict(field="runs folder", allowed=False, fix=fix,
                        reason=f"{root} {where}, so no run folder can be made there")]
    existing = next((p for p in (root, *root.parents) if p.exists()), None)
    if existing is not None and not os.access(existing, os.W_OK | os.X_OK):
        return [Verdict(field="runs folder", allowed=False, fix="check its permissions, or set "
                        "FINETUNE_STUDIO_HOME to a folder you can write",
                        reason=f"{existing} cannot be written (permission denied), so no run folder can be made")]
    return []


def machine_limit(machine: Any) -> tuple[int | None, str]:
    """(bytes, what) of the memory a run here trains in, as the window's monitor reports it: the
    smallest GPU NVML found, else the system RAM for a CPU run."""
    if machine.kind == "cuda" and machine.devices:
        gpu = min(machine.devices, key=lambda d: d.total_bytes)
        return gpu.total_bytes, f"GPU {gpu.index} ({gpu.name})"
    if machine.kind == "cuda":
        return None, ""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's RAM"
    except (ValueError, OSError):
        return None, ""


def start_verdicts(config: RunConfig, caps: Capabilities, estimate: Any, limit: tuple[int | None, str], *,
                   override: str, model_config: dict[str, Any] | None = None, probe: Probe | None = None,
                   data_problem: str = "") -> list[Verdict]:
    """Every verdict before a run starts: before_start's, the runs folder, and the estimate (a
    run_estimate.RunEstimate, or None) against `limit` (bytes, what)."""
    found = before_start(config, caps, model_config, probe=probe, data_problem=data_problem)
    found += runs_folder_verdicts()
    memory = memory_verdict(getattr(estimate, "breakdown", None), limit[0], limit[1], override)
    return found + ([memory] if memory is not None else [])


def overridden(found: list[Verdict]) -> bool:
    """Whether every verdict that blocks may be overridden (then "Start anyway" is offered)."""
    blocking = [v for v in found if v.blocks]
    return bool(blocking) and all(v.overridable for v in blocking)
