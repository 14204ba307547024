"""Byte counts as people read them, for the estimate, the run's memory record and the export report."""

from __future__ import annotations

GIB = 1 << 30
MIB = 1 << 20


def human_bytes(n: int) -> str:
    """1.50 GiB, 12.0 MiB, 512 KiB, 12 B."""
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    if n >= MIB:
        return f"{n / MIB:.1f} MiB"
    if n >= 1024:
        return f"{n / 1024:.0f} KiB"
    return f"{n} B"
