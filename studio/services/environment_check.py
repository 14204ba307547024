"""EnvironmentCheck: CUDA, driver, bitsandbytes, flash-attn, DeepSpeed: found or not, and what falls back.

Before any worker has run, the studio knows only what it can see without importing the heavy stack:
NVML (the driver and the GPUs) and `importlib.util.find_spec`, which locates a package without
importing it. Once a worker said WorkerReady, its probed capabilities replace the guesses.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EnvItem:
    name: str
    found: bool
    detail: str
    """What was found ("driver 570.86, 1 GPU"), or what falls back when it was not."""

    def short(self) -> str:
        return f"{self.name}: {'yes' if self.found else 'no'}"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


class EnvironmentCheck:
    """The list of items the status bar shows; `source` says whether the worker confirmed them."""

    def __init__(self, items: list[EnvItem], source: str) -> None:
        self.items = items
        self.source = source

    @classmethod
    def before_worker(cls, sample: Any = None) -> "EnvironmentCheck":
        """From a GpuMonitor sample (NVML) and find_spec; nothing heavy is imported."""
        devices = getattr(sample, "devices", ()) or ()
        if devices:
            names = ", ".join(sorted({d.name for d in devices}))
            cuda = EnvItem("CUDA", True, f"driver {sample.driver}, {len(devices)} GPU(s): {names}")
        else:
            note = getattr(sample, "note", "") or "no NVIDIA driver found"
            cuda = EnvItem("CUDA", False, f"{note}; training falls back to the CPU (slow, fp32)")
        has_gpu = bool(devices)
        return cls([cuda, *cls._packages(has_gpu, _installed("bitsandbytes"), "",
                                         _installed("flash_attn"))], "not yet confirmed by a worker")

    @classmethod
    def from_capabilities(cls, caps: Any) -> "EnvironmentCheck":
        """From WorkerReady.capabilities (what the worker actually probed)."""
        if caps.cuda and caps.devices:
            names = ", ".join(sorted({d.name for d in caps.devices}))
            bf16 = "bf16" if caps.bf16 else "no bf16: fp16 instead"
            cuda = EnvItem("CUDA", True, f"torch {caps.torch_version}, {len(caps.devices)} GPU(s): {names}; {bf16}")
        else:
            cuda = EnvItem("CUDA", False, f"torch {caps.torch_version or '?'} sees no GPU; training runs on "
                                          f"{caps.cpu_threads} CPU thread(s), fp32")
        items = cls._packages(bool(caps.cuda), bool(caps.bitsandbytes), caps.bitsandbytes or "",
                              bool(caps.flash_attn))
        return cls([cuda, *items], "reported by the worker")

    @staticmethod
    def _packages(gpu: bool, bnb: bool, bnb_version: str, flash: bool) -> list[EnvItem]:
        version = f" {bnb_version}" if bnb_version else ""
        if bnb and gpu:
            bnb_item = EnvItem("bitsandbytes", True, f"installed{version} (CUDA backend): qlora, lora8, 8-bit Adam")
        elif bnb:
            bnb_item = EnvItem("bitsandbytes", True, f"installed{version}, but without a GPU qlora and lora8 "
                                                     "are refused; 8-bit Adam may run on its CPU backend")
        else:
            bnb_item = EnvItem("bitsandbytes", False, "missing: qlora, lora8 and 8-bit optimizers are refused; "
                                                      "use lora with adamw")
        flash_item = EnvItem("flash-attn", flash, "installed: attention auto uses flash_attention_2" if flash
                             else "missing: attention auto falls back to sdpa")
        deepspeed = _installed("deepspeed")
        ds_item = EnvItem("DeepSpeed", deepspeed, "installed: offload available" if deepspeed
                          else "missing: technique.offload is refused (no CPU offload)")
        return [bnb_item, flash_item, ds_item]

    def summary(self) -> str:
        """One short line for the status bar."""
        return " · ".join(item.short() for item in self.items)

    def details(self) -> str:
        """Several lines for a tooltip: each item and its fallback."""
        lines = [f"{item.name}: {item.detail}" for item in self.items]
        return "\n".join(lines + [f"({self.source})"])
