"""Model states: the weights as stored, the adapters, the optimizer's state."""

from __future__ import annotations

import math
from typing import Any

from backend.estimate.architectures import Arch, Dims, ParamCounts, all_linears, expert_sizes, norm_sizes
from backend.estimate.breakdown import GIB
from backend.estimate.quantization import ADAM8_BLOCK, ADAM8_MIN_SIZE, nf4_bytes
from backend.estimate.setup import Setup


def rotary_buffers(arch: Arch, d: Dims) -> int:
    """inv_freq and original_inv_freq (fp32) per rotary set (Gemma 3 has a local and a global one)."""
    if not d.rotary_dim:
        return 0
    sets = len(set(d.layer_types)) if arch.family == "gemma3_text" and d.layer_types else 1
    return sets * 2 * (d.rotary_dim // 2) * 4


def weight_storage(arch: Arch, d: Dims, s: Setup, counts: ParamCounts, bf16_base: bool) -> tuple[dict[str, Any], list[str]]:
    """Bytes of the weights by storage type. bitsandbytes quantizes nn.Linear modules only: the
    fused experts (3-D parameters) and the routers stay unquantized (bitsandbytes issue #1849); peft's
    prepare_model_for_kbit_training casts the routers to fp32 and would the experts too, but the
    worker keeps those in the load dtype (backend/training/model/moe.py)."""
    w_dtype = "fp32" if s.weight_bytes == 4 else s.dtype
    storage: dict[str, Any] = {"fp32": 0, "bf16": 0, "fp16": 0, "int8": 0, "nf4": 0, "nf4_constants": 0, "int8_scales": 0}
    warnings: list[str] = []
    linears = [(lin.inp, lin.out, count) for lin, count in all_linears(arch, d)] + list(d.extra_linears)
    if s.quant:
        unquantized = counts.total - counts.linear_weights - d.extra_linear_params
        if s.quant == "nf4":
            for inp, out, count in linears:
                one = nf4_bytes(inp * out, double_quant=True)
                storage["nf4"] += one["data"] * count
                storage["nf4_constants"] += one["constants"] * count
            storage["double_quant"] = True
        else:
            storage["int8"] = counts.linear_weights + d.extra_linear_params
            storage["int8_scales"] = sum(out * count for _, out, count in linears) * 4
        storage[w_dtype] += (unquantized - counts.experts) * s.weight_bytes
        storage[s.dtype] += counts.experts * s.compute_bytes
        if counts.experts:
            held = counts.experts * s.compute_bytes + counts.router * s.weight_bytes
            warnings.append(f"{s.method}: the fused experts ({counts.experts / 1e9:.2f} B parameters) are not nn.Linear, so "
                            f"bitsandbytes leaves them unquantized: held in {s.dtype} ({held / GIB:.1f} GiB)")
    else:
        storage[w_dtype] += counts.total * s.weight_bytes
        if bf16_base:
            held = sum((lin.inp * lin.out + (lin.out if lin.bias else 0)) * count
                       for lin, count in all_linears(arch, d) if lin.role in s.targets)
            storage["fp32"] -= held * 4
            storage["bf16"] += held * 2
            storage["bf16_base"] = True
    storage["fp32"] += rotary_buffers(arch, d)
    return storage, warnings


def storage_bytes(storage: dict[str, Any]) -> int:
    return sum(v for v in storage.values() if isinstance(v, int) and not isinstance(v, bool))


def adapter_tensors(arch: Arch, d: Dims, s: Setup) -> list[int]:
    """Element counts of every adapter tensor that trains: LoRA A (r x in) and B (out x r) per
    adapted linear, DoRA's magnitude (out); peft's ParamWrapper on fused experts: A (r*E x in) and
    B (out x r*E), rank doubled for gate_up (two fused projections), and on the router (E x hidden)."""
    sizes: list[int] = []
    dora = s.method == "dora"
    for lin, count in all_linears(arch, d):
        if lin.role in s.targets:
            sizes += ([s.rank * lin.inp, s.rank * lin.out] + ([lin.out] if dora else [])) * count
    if "lm_head" in s.targets:
        sizes += [s.rank * d.hidden, s.rank * d.vocab] + ([d.vocab] if dora else [])
    n, E, H, I = d.moe_layers, d.experts, d.hidden, d.expert_intermediate
    if "router" in s.targets:
        sizes += [s.rank * H, E * s.rank] * n
    if "experts_gate_up" in s.targets:
        sizes += [2 * s.rank * E * H, 2 * I * 2 * s.rank * E] * n
    if "experts_down" in s.targets:
        sizes += [s.rank * E * I, H * s.rank * E] * n
    return sizes


def idle_adapter_params(d: Dims, s: Setup) -> int:
    """Adapters peft's all-linear puts on a vision tower's linears: held, never given a gradient."""
    if not s.adapted or not d.extra_linears:
        return 0
    return sum(s.rank * (inp + out) * count for inp, out, count in d.extra_linears)


def trained_tensor_sizes(arch: Arch, d: Dims, s: Setup, counts: ParamCounts) -> list[int]:
    """Element counts of every trained tensor (AdamW's step counters, 8-bit Adam's small-tensor rule)."""
    if not s.full:
        return adapter_tensors(arch, d, s)
    sizes: list[int] = []
    for lin, count in all_linears(arch, d):
        sizes += ([lin.inp * lin.out] + ([lin.out] if lin.bias else [])) * count
    sizes += norm_sizes(arch, d) * d.layers + [d.hidden] * (2 if arch.norm == "layer" else 1)
    if d.moe_layers:
        sizes += expert_sizes(arch, d) * d.moe_layers
    sizes.append(counts.embedding)
    if counts.lm_head:
        sizes.append(counts.lm_head)
    if counts.positions:
        sizes.append(counts.positions)
    return sizes


def optimizer_state(optimizer: str, sizes: list[int]) -> tuple[int, dict[str, Any]]:
    """AdamW: two fp32 moments per parameter and a 4-byte `step` per tensor. 8-bit Adam
    (bitsandbytes): two 8-bit states plus one fp32 absmax per 256-value block and state; tensors
    under 4096 elements keep fp32 states."""
    trained, tensors = sum(sizes), len(sizes)
    if optimizer == "adamw":
        return trained * 8 + tensors * 4, {"kind": "adamw", "bytes_per_param": 8, "step_tensors": tensors * 4}
    small = sum(n for n in sizes if n < ADAM8_MIN_SIZE)
    big = sum(n for n in sizes if n >= ADAM8_MIN_SIZE)
    blocks = sum(math.ceil(n / ADAM8_BLOCK) for n in sizes if n >= ADAM8_MIN_SIZE)
    detail = {"kind": optimizer, "bytes_per_param": 2, "block_constants": blocks * 2 * 4,
              "fp32_small_tensors": small * 8, "paged": optimizer == "paged_adamw_8bit"}
    return big * 2 + blocks * 2 * 4 + small * 8 + 2 * 256 * 4, detail
