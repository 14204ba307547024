"""Model FLOPs utilisation: how much of the machine's measured peak the training step uses.

FLOPs per computed token follow the usual convention: 6 per matmul weight for the forward and
backward passes (2 forward, 2 for the input's gradient, 2 for the weight's: Kaplan et al. 2020), plus
the attention term 12 * layers * heads * head_dim * context (PaLM, Chowdhery et al. 2022, appendix B).
A frozen weight (the base under LoRA) gets no weight gradient, so it counts 4, not 6: counting 6N
for a LoRA run credited work nobody does, and put the bundled preset at 105% "MFU" on one CPU core
once its step had been made lean. Adapters count 6 per weight like any trained weight.

The peak is not a datasheet number: it is measured once per machine, device, dtype and thread count
with a large matmul, and cached under the studio home, so MFU on a laptop CPU is as honest as on a GPU.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import torch

from backend.paths import studio_home

log = logging.getLogger(__name__)


def matmul_params(model: Any) -> tuple[int, int]:
    """(trained, frozen) weights that take part in matmuls: every linear layer's, adapters included."""
    trained = frozen = 0
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not (hasattr(module, "in_features") and hasattr(module, "out_features")) or hasattr(module, "base_layer"):
            continue  # not a linear layer, or peft's wrapper (its base layer and adapters are counted themselves)
        count = int(module.in_features) * int(module.out_features)
        if weight is not None and weight.requires_grad:
            trained += count
        else:
            frozen += count
    return trained, frozen


def flops_per_token(model: Any, context: float) -> float:
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", 0) or 0
    heads = getattr(config, "num_attention_heads", 0) or 0
    hidden = getattr(config, "hidden_size", 0) or 0
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if heads else 0)
    trained, frozen = matmul_params(model)
    return 6.0 * trained + 4.0 * frozen + 12.0 * layers * heads * head_dim * context


def _measure(device: str, dtype: torch.dtype) -> float:
    """Best of several timed matmuls: a busy moment can only make one trial slower, never faster."""
    size = 8192 if device == "cuda" else 1536
    # Its own generator: the global random state is the run's (dropout, data order), and a peak
    # measured mid-run (a new thread count) must not move it.
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=generator)
    a @ b
    best = 0.0
    for _ in range(8 if device == "cuda" else 6):
        if device == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        a @ b
        if device == "cuda":
            torch.cuda.synchronize()
        best = max(best, 2.0 * size**3 / (time.perf_counter() - began))
    if device == "cuda":
        # The three 8192^2 matrices (~400 MB in bf16) are the measurement's, not the run's: give
        # them back, and start the peak that the telemetry reports from here.
        del a, b
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return best


def forget_peak(device: str, dtype: torch.dtype) -> None:
    """Drop a cached peak that a run has beaten (it was measured on a busy machine)."""
    path = studio_home() / "peak_flops.json"
    try:
        cache = json.loads(path.read_text())
        cache.pop(_key(device, dtype), None)
        path.write_text(json.dumps(cache, indent=1))
    except (OSError, json.JSONDecodeError):
        pass


def _key(device: str, dtype: torch.dtype) -> str:
    name = torch.cuda.get_device_name() if device == "cuda" else f"cpu-{torch.get_num_threads()}threads"
    return f"{name}|{dtype}|torch {torch.__version__}"


def peak_flops(device: str, dtype: torch.dtype) -> float:
    """Measured peak matmul FLOP/s for this device and dtype, cached per machine."""
    key = _key(device, dtype)
    path = studio_home() / "peak_flops.json"
    try:
        cache = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        cache = {}
    if key not in cache:
        cache[key] = _measure(device, dtype)
        log.info("measured peak %.1f GFLOP/s for %s", cache[key] / 1e9, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(cache, indent=1))
        except OSError:
            pass  # a read-only home only costs a re-measurement next time
    return float(cache[key])
