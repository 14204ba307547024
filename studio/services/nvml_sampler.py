"""NvmlSampler: one reading of the GPUs (NVML) and of the worker process (psutil).

The default sampler of GpuMonitor. Without an NVIDIA driver (NVMLError on init: CPU machines, CI)
it says so once, in `TelemetrySample.note`, and still reads the worker's RAM and CPU through psutil,
so the studio charts something useful everywhere and never raises.

NVML calls are synchronous but cheap (well under a millisecond each); at 1 Hz they cost the event
loop nothing a person can notice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

import psutil


@dataclass(frozen=True)
class DeviceSample:
    """One GPU at one moment. Values NVML could not read are None."""

    index: int
    name: str
    used_bytes: int
    total_bytes: int
    utilization: float | None = None
    """GPU busy share over the last sample period, percent."""
    temperature_c: float | None = None
    power_w: float | None = None
    process_bytes: int | None = None
    """Memory the worker process holds on this device (None: not running here, or unknown)."""


@dataclass(frozen=True)
class TelemetrySample:
    """One reading: every GPU (when NVML works), the worker process, and system RAM."""

    time: float
    """time.monotonic() of the reading."""
    nvml: bool
    devices: tuple[DeviceSample, ...] = ()
    driver: str = ""
    note: str = ""
    """Why there are no GPU figures, in one line ("" when NVML works)."""
    process_rss: int | None = None
    process_cpu: float | None = None
    """Worker CPU use in percent of one core (can exceed 100 with several threads)."""
    ram_total: int = 0
    ram_used: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


Sampler = Callable[[int | None], TelemetrySample]
"""A sampler takes the worker's pid (None when no worker runs) and returns one TelemetrySample."""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlSampler:
    """Callable sampler over NVML (through `nvml`, the pynvml module: tests pass a fake one)."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        self._nvml: Any = None
        self.note = ""
        self.driver = ""
        self._handles: list[Any] = []
        self._names: list[str] = []
        self._process: psutil.Process | None = None
        self._memory_v2 = True
        try:
            if nvml is None:
                import pynvml as nvml  # nvidia-ml-py: ctypes over libnvidia-ml, no CUDA runtime
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._names = [_text(nvml.nvmlDeviceGetName(h)) for h in self._handles]
            self.driver = _text(nvml.nvmlSystemGetDriverVersion())
            self._nvml = nvml
            if not count:
                self.note = "NVML found no NVIDIA GPU: training runs on the CPU"
        except Exception as exc:  # NVMLError (no driver, no library) or an ImportError
            self._nvml = None
            reason = str(exc).strip() or type(exc).__name__
            self.note = f"No NVIDIA GPU driver (NVML: {reason}): showing the worker's RAM and CPU instead"

    @property
    def available(self) -> bool:
        return self._nvml is not None and bool(self._handles)

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None

    def __call__(self, pid: int | None) -> TelemetrySample:
        rss, cpu = self._process_figures(pid)
        ram = psutil.virtual_memory()
        devices = tuple(self._device(i, h, pid) for i, h in enumerate(self._handles)) if self._nvml else ()
        return TelemetrySample(time=time.monotonic(), nvml=self.available, devices=devices,
                               driver=self.driver, note=self.note, process_rss=rss, process_cpu=cpu,
                               ram_total=int(ram.total), ram_used=int(ram.total - ram.available))

    # --- parts ------------------------------------------------------------------------------
    def _process_figures(self, pid: int | None) -> tuple[int | None, float | None]:
        if pid is None:
            self._process = None
            return None, None
        try:
            if self._process is None or self._process.pid != pid:
                self._process = psutil.Process(pid)
                self._process.cpu_percent(None)  # the first call only sets the baseline
                return int(self._process.memory_info().rss), None
            return int(self._process.memory_info().rss), float(self._process.cpu_percent(None))
        except (psutil.Error, OSError):
            self._process = None
            return None, None

    def _device(self, index: int, handle: Any, pid: int | None) -> DeviceSample:
        nvml = self._nvml
        used, total = self._memory(handle)
        return DeviceSample(
            index=index,
            name=self._names[index],
            used_bytes=used,
            total_bytes=total,
            utilization=self._try(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
            temperature_c=self._try(lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))),
            power_w=self._try(lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0),
            process_bytes=self._process_bytes(handle, pid) if pid is not None else None,
        )

    def _memory(self, handle: Any) -> tuple[int, int]:
        """(used, total): v2 where the driver has it (its `used` excludes driver-reserved memory,
        as nvidia-smi shows), v1 otherwise."""
        nvml = self._nvml
        if self._memory_v2 and hasattr(nvml, "nvmlMemory_v2"):
            try:
                info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
                return int(info.used), int(info.total)
            except Exception:  # an old driver (NVML_ERROR_FUNCTION_NOT_FOUND) or an old binding
                self._memory_v2 = False
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle)
            return int(info.used), int(info.total)
        except Exception:
            return 0, 0

    def _process_bytes(self, handle: Any, pid: int) -> int | None:
        try:
            processes = self._nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except Exception:
            return None
        for process in processes:
            if process.pid == pid:
                used = getattr(process, "usedGpuMemory", None)
                return int(used) if isinstance(used, int) else None  # None: not available (vGPU, WSL)
        return None

    @staticmethod
    def _try(read: Callable[[], float]) -> float | None:
        try:
            return read()
        except Exception:
            return None
