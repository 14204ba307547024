"""Fake GPU telemetry for GUI tests: a sampler returning scripted samples, and a fake pynvml module.

`FakeSampler` stands in for NvmlSampler as GpuMonitor's injected sampler. `fake_pynvml()` builds a
module object with the handful of NVML calls NvmlSampler makes, so the real sampler's code runs
against known numbers on a machine without a driver.
"""

from __future__ import annotations

import math
import time
import types
from types import SimpleNamespace

from studio.services.nvml_sampler import DeviceSample, TelemetrySample

GIB = 1 << 30


class FakeSampler:
    """Returns a sample with one 24 GiB GPU whose use grows a little per call (or none: `nvml=False`)."""

    def __init__(self, nvml: bool = True, total: int = 24 * GIB, name: str = "Fake GPU 24G") -> None:
        self.nvml, self.total, self.name = nvml, total, name
        self.calls: list[int | None] = []

    def __call__(self, pid: int | None) -> TelemetrySample:
        self.calls.append(pid)
        n = len(self.calls)
        if not self.nvml:
            return TelemetrySample(time=time.monotonic(), nvml=False, note="No NVIDIA GPU driver (fake)",
                                   process_rss=(100 + n) * (1 << 20) if pid else None,
                                   process_cpu=50.0 if pid else None, ram_total=16 * GIB, ram_used=4 * GIB)
        used = (1500 + 8 * (n % 4)) * (1 << 20) if pid else 420 * (1 << 20)
        device = DeviceSample(index=0, name=self.name, used_bytes=used, total_bytes=self.total,
                              utilization=(88.0 + 6 * math.sin(n / 2)) if pid else 2.0,
                              temperature_c=(62.0 if pid else 41.0), power_w=(290.0 if pid else 65.0),
                              process_bytes=(1180 + 8 * (n % 4)) * (1 << 20) if pid else None)
        return TelemetrySample(time=time.monotonic(), nvml=True, devices=(device,), driver="999.99",
                               ram_total=64 * GIB, ram_used=8 * GIB)


def fake_pynvml(v2: bool = True, processes: list[tuple[int, int]] | None = None, fail_init: bool = False):
    """A module with NVML's calls; `v2=False` makes nvmlMemory_v2 raise as an old driver does."""

    class NVMLError(Exception):
        pass

    module = types.ModuleType("pynvml")
    module.NVMLError = NVMLError
    module.NVML_TEMPERATURE_GPU = 0
    module.nvmlMemory_v2 = 0x02000028
    module.calls = []

    def init():
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    def memory_info(handle, version=None):
        module.calls.append(("memory", version))
        if version is not None and not v2:
            raise NVMLError("Function Not Found")
        used = 3 * GIB if version else 3 * GIB + 512 * (1 << 20)  # v1 counts reserved memory as used
        return SimpleNamespace(total=80 * GIB, used=used, free=80 * GIB - used)

    module.nvmlInit = init
    module.nvmlShutdown = lambda: None
    module.nvmlDeviceGetCount = lambda: 1
    module.nvmlDeviceGetHandleByIndex = lambda i: f"handle{i}"
    module.nvmlDeviceGetName = lambda h: b"NVIDIA Fake H100"
    module.nvmlSystemGetDriverVersion = lambda: "570.00"
    module.nvmlDeviceGetMemoryInfo = memory_info
    module.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=87, memory=40)
    module.nvmlDeviceGetTemperature = lambda h, sensor: 66
    module.nvmlDeviceGetPowerUsage = lambda h: 312_000
    module.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in (processes or [])]
    return module
