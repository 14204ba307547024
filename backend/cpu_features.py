"""Whether this CPU multiplies bf16 natively, read from the kernel's CPU flags (torch-free).

The worker's plan and the studio's estimate both need the answer, and the estimate runs in the
studio process, which never imports torch; so it comes from /proc/cpuinfo, not from torch. With
AVX512-BF16 or AMX-BF16, oneDNN's bf16 matrix products run about twice as fast as fp32 sgemm (on
this project's bench CPU: (295 x 256) @ (256 x 768), 1 thread, 1.31 ms fp32, 0.66 ms bf16 including
the casts); without them bf16 is emulated and slower than fp32, so "no" is the safe answer anywhere
the flags cannot be read (macOS, Windows, containers that hide /proc).
"""

from __future__ import annotations

import functools
from pathlib import Path

_NATIVE = ("avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=1)
def native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return any(flag in flags for flag in _NATIVE)
    return False
