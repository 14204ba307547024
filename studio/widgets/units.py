"""How numbers read to a person: bytes, counts and durations (helpers shared by the views)."""

from __future__ import annotations


def human_bytes(n: int | float | None) -> str:
    """1.50 GiB, 12.0 MiB, 512.0 KiB, 12 B; "—" for None."""
    if n is None:
        return "—"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def human_count(n: int | None) -> str:
    """12,345,678 -> "12.3 M"; 1.5e9 -> "1.50 B"."""
    if n is None:
        return "unknown"
    if n >= 1_000_000_000:
        return f"{n / 1e9:.2f} B"
    if n >= 1_000_000:
        return f"{n / 1e6:.1f} M"
    if n >= 1_000:
        return f"{n / 1e3:.1f} K"
    return str(n)


def clock_text(seconds: float) -> str:
    """12 -> "0:12"; 3725 -> "1:02:05"."""
    seconds = int(max(0, seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
