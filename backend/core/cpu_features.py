"""Whether this CPU multiplies bf16 natively, read from the kernel's CPU flags (torch-free).

The worker's plan and the studio's estimate both need the answer, and the estimate runs in the
studio process, which never imports torch; so it comes from /proc/cpuinfo, not from torch. With
AVX512-BF16 or AMX-BF16, oneDNN's bf16 matrix products run about twice as fast as fp32 sgemm
(docs/benchmarks.md, "Figures moved from docstrings"); without them bf16 is emulated and slower than fp32, so "no" is the safe answer anywhere
the flags cannot be read (macOS, Windows, containers that hide /proc).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from backend.core.config.run_config import RunConfig

_NATIVE = ("avx512_bf16", "amx_bf16")

# Set in the worker's environment before torch loads (launch.worker_env, and worker/__main__ for a
# worker started by hand); a value the user already set wins.
# OMP_WAIT_POLICY=PASSIVE: idle OpenMP threads sleep instead of spinning. Spinning starved the GUI
# on a 2-core desktop; a short spin made a 2-thread step 46 ms on a quiet machine and 502 ms with
# one core busy elsewhere (passive: 88 and 72 ms).
# The two cache capacities: oneDNN compiles a kernel for every new matrix shape, and packed rows
# change length every step, so its bf16 products (the CPU's bf16 base) kept a compiled kernel for
# each length: torch's ideep cache and oneDNN's own (1,024 entries each by default) grew a process
# by 778 MB over 1,200 lengths of the preset's products, 128 MB over the preset's 60 steps. With 16
# each: 40 MB, and the step is as fast (54.9 vs 55.2-55.6 ms; compiling is cheap next to a product).
RUNTIME_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "LRU_CACHE_CAPACITY": "16",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "16",
}


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


def bf16_base(run: RunConfig, device: str, native: bool) -> bool:
    """Whether a run holds its frozen base in bf16 on the CPU (lora_matmul.py): the worker's plan and
    the estimate ask the same question. Only plain LoRA at precision auto (fp32 asked means fp32),
    on one process or DDP (the sharded strategies flatten parameters of one dtype), shortcuts not off
    (it is one of the speed shortcuts: backend/core/registries/shortcuts.py)."""
    return (device == "cpu" and native and run.technique.precision == "auto" and run.technique.method == "lora"
            and run.hardware.strategy in ("single", "ddp") and run.technique.shortcuts != "off")
