"""Model states: the weights as stored, the adapters, the optimizer's state."""

from __future__ import annotations

import math
from typing import Any

from backend.estimate.architectures import Arch, Dims, ParamCounts, all_linears, expert_sizes, layer_tensor_sizes
from backend.estimate.breakdown import GIB
from backend.estimate.quantization import ADAM8_BLOCK, ADAM8_MIN_SIZE, nf4_bytes
from backend.estimate.setup import Setup


def rotary_buffers(arch: Arch, dims: Dims) -> int:
    """inv_freq and original_inv_freq (fp32) per rotary set (Gemma 3 has a local and a global one)."""
    if not dims.rotary_dim:
        return 0
    sets = len(set(dims.layer_types)) if arch.family == "gemma3_text" and dims.layer_types else 1
    return sets * 2 * (dims.rotary_dim // 2) * 4


def weight_storage(arch: Arch, dims: Dims, setup: Setup, counts: ParamCounts, bf16_base: bool) -> tuple[dict[str, Any], list[str]]:
    """Bytes of the weights by storage type. bitsandbytes quantizes nn.Linear modules only: the
    fused experts (3-D parameters) and the routers stay unquantized (bitsandbytes issue #1849); peft's
    prepare_model_for_kbit_training casts the routers to fp32 and would the experts too, but the
    worker keeps those in the load dtype (backend/training/model/moe.py)."""
    w_dtype = "fp32" if setup.weight_bytes == 4 else setup.dtype
    storage: dict[str, Any] = {"fp32": 0, "bf16": 0, "fp16": 0, "int8": 0, "nf4": 0, "nf4_constants": 0, "int8_scales": 0}
    warnings: list[str] = []
    linears = [(lin.inp, lin.out, count) for lin, count in all_linears(arch, dims)] + list(dims.extra_linears)
    if setup.quant:
        unquantized = counts.total - counts.linear_weights - dims.extra_linear_params
        if setup.quant == "nf4":
            for inp, out, count in linears:
                one = nf4_bytes(inp * out, double_quant=True)
                storage["nf4"] += one["data"] * count
                storage["nf4_constants"] += one["constants"] * count
            storage["double_quant"] = True
        else:
            storage["int8"] = counts.linear_weights + dims.extra_linear_params
            storage["int8_scales"] = sum(out * count for _, out, count in linears) * 4
        storage[w_dtype] += (unquantized - counts.experts) * setup.weight_bytes
        storage[setup.dtype] += counts.experts * setup.compute_bytes
        if counts.experts:
            held = counts.experts * setup.compute_bytes + counts.router * setup.weight_bytes
            warnings.append(f"{setup.method}: the fused experts ({counts.experts / 1e9:.2f} B parameters) are not nn.Linear, so "
                            f"bitsandbytes leaves them unquantized: held in {setup.dtype} ({held / GIB:.1f} GiB)")
    else:
        storage[w_dtype] += counts.total * setup.weight_bytes
        if bf16_base:
            held = sum((lin.inp * lin.out + (lin.out if lin.bias else 0)) * count
                       for lin, count in all_linears(arch, dims) if lin.role in setup.targets)
            storage["fp32"] -= held * 4
            storage["bf16"] += held * 2
            storage["bf16_base"] = True
    storage["fp32"] += rotary_buffers(arch, dims)
    return storage, warnings


def storage_bytes(storage: dict[str, Any]) -> int:
    return sum(v for v in storage.values() if isinstance(v, int) and not isinstance(v, bool))


def adapter_tensors(arch: Arch, dims: Dims, setup: Setup) -> list[int]:
    """Element counts of every adapter tensor that trains: LoRA A (r x in) and B (out x r) per
    adapted linear, DoRA's magnitude (out); peft's ParamWrapper on fused experts: A (r*E x in) and
    B (out x r*E), rank doubled for gate_up (two fused projections), and on the router (E x hidden)."""
    sizes: list[int] = []
    dora = setup.method == "dora"
    for lin, count in all_linears(arch, dims):
        if lin.role in setup.targets:
            sizes += ([setup.rank * lin.inp, setup.rank * lin.out] + ([lin.out] if dora else [])) * count
    if "lm_head" in setup.targets:
        sizes += [setup.rank * dims.hidden, setup.rank * dims.vocab] + ([dims.vocab] if dora else [])
    n, E, H, I = dims.moe_layers, dims.experts, dims.hidden, dims.expert_intermediate
    if "router" in setup.targets:
        sizes += [setup.rank * H, E * setup.rank] * n
    if "experts_gate_up" in setup.targets:
        sizes += [2 * setup.rank * E * H, 2 * I * 2 * setup.rank * E] * n
    if "experts_down" in setup.targets:
        sizes += [setup.rank * E * I, H * setup.rank * E] * n
    return sizes


def idle_adapter_params(dims: Dims, setup: Setup) -> int:
    """Adapters peft's all-linear puts on a vision tower's linears: held, never given a gradient."""
    if not setup.adapted or not dims.extra_linears:
        return 0
    return sum(setup.rank * (inp + out) * count for inp, out, count in dims.extra_linears)


def trained_tensor_sizes(arch: Arch, dims: Dims, setup: Setup, counts: ParamCounts) -> list[int]:
    """Element counts of every trained tensor (AdamW's step counters, 8-bit Adam's small-tensor rule)."""
    if not setup.full:
        return adapter_tensors(arch, dims, setup)
    sizes: list[int] = []
    for lin, count in all_linears(arch, dims):
        sizes += ([lin.inp * lin.out] + ([lin.out] if lin.bias else [])) * count
    sizes += layer_tensor_sizes(arch, dims) + [dims.hidden] * (2 if arch.norm == "layer" else 1)
    if dims.moe_layers:
        sizes += expert_sizes(arch, dims) * dims.moe_layers
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
