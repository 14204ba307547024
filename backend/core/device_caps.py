"""detected_device() and device_caps(): what this machine can run, found without importing torch.

The studio and `finetune-studio estimate` must judge a config for the machine they run on before
any worker exists, and neither may import torch. CUDA is read through NVML (the nvidia-ml-py
package, ctypes over the driver's library): a device means CUDA. The optional packages are located
with importlib.util.find_spec, which does not import them. A worker's WorkerReady capabilities,
probed with torch, are the confirmed version of the same Capabilities.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from backend.core.protocol import Capabilities, DeviceInfo


@dataclass(frozen=True)
class DetectedDevice:
    """The device a run here would train on, and how that was found (one sentence)."""

    kind: str
    """cuda | cpu"""
    why: str
    devices: tuple[DeviceInfo, ...] = ()
    bf16: bool | None = None
    """Every GPU has compute capability 8.0 or above (bf16); None where NVML could not say."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def detected_device(nvml: ModuleType | None = None) -> DetectedDevice:
    """cuda when NVML is importable and finds a GPU, else cpu (with the reason)."""
    try:
        if nvml is None:
            import pynvml as nvml  # nvidia-ml-py: no CUDA runtime, no torch
        nvml.nvmlInit()
    except Exception as exc:  # ImportError, or NVMLError without a driver
        return DetectedDevice("cpu", f"no NVIDIA GPU driver found ({str(exc).strip() or type(exc).__name__})")
    try:
        count = int(nvml.nvmlDeviceGetCount())
        devices, capable = [], []
        for index in range(count):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append(DeviceInfo(index=index, name=_text(nvml.nvmlDeviceGetName(handle)),
                                      total_bytes=int(memory.total)))
            try:
                capable.append(int(nvml.nvmlDeviceGetCudaComputeCapability(handle)[0]) >= 8)
            except Exception:  # an old binding or driver: unknown
                pass
    except Exception as exc:
        return DetectedDevice("cpu", f"NVML could not list the GPUs ({exc})")
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass
    if not devices:
        return DetectedDevice("cpu", "NVML found no NVIDIA GPU")
    bf16 = all(capable) if len(capable) == len(devices) else None
    return DetectedDevice("cuda", f"NVML found {len(devices)} GPU(s): {devices[0].name}", tuple(devices), bf16)


def device_caps(device: str, bf16: bool | None = None, devices: tuple[DeviceInfo, ...] = ()) -> Capabilities:
    """Capabilities for a run on `device` from what is installed here; bf16 unknown (None) counts as
    supported on CUDA, so that only a GPU known to lack it refuses bf16."""
    cuda = device == "cuda"
    return Capabilities(
        cuda=cuda,
        devices=list(devices),
        bf16=cuda and bf16 is not False,
        bitsandbytes=_version("bitsandbytes"),
        flash_attn=cuda and _installed("flash_attn"),
        deepspeed=_installed("deepspeed"),
        liger_kernel=_installed("liger_kernel"),
        cpu_threads=os.cpu_count() or 1,
    )
