"""Which phase of a step the worker is in, so that a failure can say where it happened.

An out-of-memory is only actionable with its phase: at load the weights do not fit, in forward or
backward the activations do, at the optimizer step its state does. The tracker is also where an
out-of-memory can be injected on the CPU (FINETUNE_STUDIO_INJECT_OOM=phase[:step]) to test recovery.
"""

from __future__ import annotations

import os

_state = {"phase": "load", "step": 0}


def set_phase(phase: str, step: int | None = None) -> None:
    _state["phase"] = phase
    if step is not None:
        _state["step"] = step
    _maybe_inject()


def current() -> tuple[str, int]:
    return _state["phase"], _state["step"]


def _maybe_inject() -> None:
    spec = os.environ.get("FINETUNE_STUDIO_INJECT_OOM")
    if not spec:
        return
    phase, _, step = spec.partition(":")
    if phase == _state["phase"] and (not step or int(step) == _state["step"]):
        import torch

        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 2.00 GiB (injected by FINETUNE_STUDIO_INJECT_OOM={spec})"
        )


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocator's out-of-memory, whatever raised it (torch's OutOfMemoryError, the CPU allocator, Python)."""
    if type(exc).__name__ == "OutOfMemoryError" or isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("DefaultCPUAllocator: can't allocate memory" in text
                                              or "out of memory" in text.lower())
