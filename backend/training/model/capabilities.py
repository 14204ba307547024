"""What this machine can do, probed rather than assumed.

bitsandbytes and flash-attn are looked up by metadata, not imported: importing bitsandbytes costs a
second and prints kernel chatter, and the studio only needs to know whether they are there.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os

import torch

from backend.core.protocol import Capabilities, DeviceInfo


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def default_threads() -> int:
    """All cores but one: the desktop (and the studio's event loop) keeps a core."""
    return max(1, (os.cpu_count() or 2) - 1)


def probe_capabilities() -> Capabilities:
    cuda = torch.cuda.is_available()
    devices = []
    if cuda:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(DeviceInfo(index=index, name=props.name, total_bytes=int(props.total_memory)))
    flash = cuda and importlib.util.find_spec("flash_attn") is not None
    return Capabilities(
        torch_version=torch.__version__,
        cuda=cuda,
        devices=devices,
        bf16=bool(cuda and torch.cuda.is_bf16_supported()),
        bitsandbytes=_version("bitsandbytes"),
        flash_attn=flash,
        deepspeed=importlib.util.find_spec("deepspeed") is not None,
        liger_kernel=importlib.util.find_spec("liger_kernel") is not None,
        cpu_threads=torch.get_num_threads(),
    )
