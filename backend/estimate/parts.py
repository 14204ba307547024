"""The parts of one step's memory, one function each, for estimator.estimate to compose.

Each takes the resolved Setup and Dims and returns a small named record, so the estimate reads as
its parts in order (states, logits, distribution, runtime) rather than one long function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from backend.core.config.run_config import RunConfig
from backend.estimate.architectures import Arch, Dims, ParamCounts, all_linears
from backend.estimate.cuda import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, allocator_reserve
from backend.estimate.setup import Setup
from backend.estimate.shortcut_memory import held_logit_elements
from backend.estimate.states import (
    idle_adapter_params, optimizer_state, rotary_buffers, storage_bytes, trained_tensor_sizes, weight_storage,
)

if TYPE_CHECKING:
    from backend.estimate.calibration import Calibration


@dataclass(frozen=True)
class StepInputs:
    """What every part reads: the model's structure and counts, the resolved run, the device."""

    arch: Arch
    dims: Dims
    setup: Setup
    counts: ParamCounts
    run: RunConfig
    device: str


@dataclass
class ModelStates:
    """Weights, adapters, gradients, optimizer state and master weights, per device once distributed."""

    storage: dict[str, Any]  # weights by storage type
    buffers: int  # rotary buffers, part of the weights
    weights: int
    adapter_params: int
    idle_params: int  # a vision tower's adapters: held, never trained
    adapters: int
    trained: int  # parameters that get gradients
    grad_bytes: int  # bytes per gradient element
    gradients: int
    optimizer: int
    optimizer_detail: dict[str, Any]
    master: int


@dataclass(frozen=True)
class Logits:
    """The loss buffers: held logits (forward) and their gradient (backward), and the larger one."""

    forward: int
    backward: int
    held: int
    elements: int
    positions: int


@dataclass
class Runtime:
    """Fixed costs and the transients of a step's phases."""

    detail: dict[str, int] = field(default_factory=dict)
    fixed: int = 0
    forward_backward_transient: int = 0
    backward_transient: int = 0
    step_transient: int = 0
    part: int = 0  # the runtime part shown (context and allocator reserve are parts of their own)


def model_states(step: StepInputs, cpu_bf16_base: bool, warnings: list[str]) -> ModelStates:
    """Weights by storage type, adapters (fp32), then gradients, optimizer and master weights."""
    arch, dims, setup, counts, run = step.arch, step.dims, step.setup, step.counts, step.run
    buffers = rotary_buffers(arch, dims)
    storage, more = weight_storage(arch, dims, setup, counts, cpu_bf16_base)
    warnings += more
    weights = storage_bytes(storage)

    sizes = trained_tensor_sizes(arch, dims, setup, counts)
    adapter_params = sum(sizes) if setup.adapted else 0
    idle = idle_adapter_params(dims, setup)
    adapters = (adapter_params + idle) * setup.adapter_bytes

    if setup.full:
        # Gradients take the weights' dtype; an fp32 master copy exists only when the weights
        # themselves are bf16/fp16 (without autocast).
        trained, grad_bytes = counts.text, setup.weight_bytes
        master = counts.text * 4 if setup.weight_bytes != 4 else 0
    else:
        trained, grad_bytes = adapter_params, setup.adapter_bytes
        master = 0
    optimizer, optimizer_detail = optimizer_state(run.technique.optimizer, sizes)
    return ModelStates(storage, buffers, weights, adapter_params, idle, adapters, trained, grad_bytes,
                       trained * grad_bytes, optimizer, optimizer_detail, master)


def logits_part(step: StepInputs, target_tokens: int | None) -> Logits:
    """The logits the loss holds: only at loss positions when the data's longest answer is known."""
    run, dims, setup, device = step.run, step.dims, step.setup, step.device
    positions = setup.tokens
    if target_tokens is not None:
        positions = min(setup.tokens, run.train.micro_batch_size * min(run.train.seq_len, max(1, int(target_tokens))))
    # chunked_loss holds one chunk's
    elements = held_logit_elements(run, dims.model_type, dims.vocab, positions * dims.vocab, device)
    logit_bytes = setup.compute_bytes if setup.autocast else setup.weight_bytes
    forward = elements * (logit_bytes + 4 + (4 if logit_bytes != 4 else 0))
    backward = elements * (4 + 4 + 4)
    if dims.final_softcap:
        # logits = tanh(logits / cap) * cap: tanh saves its output, one more logits-sized tensor
        forward += elements * logit_bytes
        backward += elements * logit_bytes
    held = max(forward, backward)
    if run.technique.liger_kernel:
        # Liger's fused linear cross-entropy never materialises the logits: it walks the tokens in
        # chunks and keeps one chunk's fp32 logits and their gradient (Liger's chunk is about
        # vocab/hidden rows, at least 1). Not measured here (it needs CUDA); derived from the kernel.
        chunk = max(1, min(setup.tokens, -(-dims.vocab // dims.hidden)))
        forward = backward = held = chunk * dims.vocab * (4 + 4)
    return Logits(forward, backward, held, elements, positions)


def distribute(step: StepInputs, states: ModelStates, num_gpus: int, zero_stage: int,
               warnings: list[str]) -> dict[str, Any]:
    """ZeRO stages, DDP buckets and offload, applied to `states` in place; returns what was done."""
    dims, run, device = step.dims, step.run, step.device
    technique = run.technique
    dist: dict[str, Any] = {"num_gpus": num_gpus, "zero_stage": zero_stage, "offload": technique.offload}
    offloaded = 0
    if device == "cuda":
        stage = zero_stage
        if technique.offload == "zero2_optimizer":
            stage = max(stage, 2)
        elif technique.offload == "zero3_optimizer_params":
            stage = 3
        dist["effective_stage"] = stage
        n = num_gpus
        if stage == 0 and n > 1:
            dist["ddp_bucket_bytes"] = states.gradients  # DDP's flat buckets hold a second copy of the gradients
            states.gradients *= 2
        if stage >= 1:
            states.optimizer = math.ceil(states.optimizer / n)
            states.master = math.ceil(states.master / n)
        if stage >= 2:
            states.gradients = math.ceil(states.gradients / n)
        if stage >= 3:
            per_layer_weights = (states.weights - states.buffers) // max(1, dims.layers)
            gathered = 2 * per_layer_weights  # the layer being computed and the prefetched one
            dist["zero3_gathered_bytes"] = gathered
            if technique.offload == "zero3_optimizer_params":
                offloaded += states.weights + states.adapters
                states.weights = gathered
            else:
                states.weights = math.ceil(states.weights / n) + gathered
            states.adapters = math.ceil(states.adapters / n)
        if technique.offload != "none":
            offloaded += states.optimizer + states.master
            states.optimizer = 0
            states.master = 0
        dist["cpu_offloaded_bytes"] = offloaded
    elif num_gpus > 1 or zero_stage or technique.offload != "none":
        warnings.append("num_gpus, zero_stage and offload apply to CUDA only; ignored for device cpu")
    return dist


def runtime_part(step: StepInputs, states: ModelStates, activations: int, logits: int, num_gpus: int,
                 calibration: Calibration | None) -> Runtime:
    """Fixed costs plus the larger of the transients of the two phases of a step."""
    arch, dims, setup, counts, run, device = step.arch, step.dims, step.setup, step.counts, step.run, step.device
    detail = {
        "cuda_context": 0,
        "cublas_workspace": 0,
        "allocator_slack": 0,
        "dequant_buffer": 0,
        "dora_weight_norm": 0,
        "optimizer_step_buffer": 0,
        "process_baseline": 0,
    }
    if device == "cpu" and calibration is not None:
        detail["process_baseline"] = int(calibration.baseline_bytes)
    if device == "cuda":
        detail["cuda_context"] = CUDA_CONTEXT_BYTES
        detail["cublas_workspace"] = CUBLAS_WORKSPACE_BYTES
        detail["allocator_slack"] = allocator_reserve(activations + logits + states.gradients)
    # Transients on either device: bitsandbytes dequantizes a k-bit weight for each matmul, DoRA
    # rebuilds its weight norm in every forward pass.
    if setup.quant:
        detail["dequant_buffer"] = counts.largest_linear * setup.compute_bytes
    if setup.method == "dora":
        detail["dora_weight_norm"] = dora_transient(arch, dims, setup)
    if run.technique.optimizer == "adamw" and run.hardware.strategy == "fsdp" and device == "cuda":
        # FSDP keeps the per-tensor AdamW, whose foreach kernels (the CUDA default) build sqrt(v)
        # for all parameters at once. The worker's single-device and DDP runs use the fused AdamW
        # and DeepSpeed its fused Adam, which update in place (no step buffer; measured on the CPU).
        detail["optimizer_step_buffer"] = math.ceil(states.trained * 4 / max(1, num_gpus))
    fixed = (detail["cuda_context"] + detail["cublas_workspace"] + detail["allocator_slack"]
             + detail["process_baseline"])
    forward_backward = detail["dequant_buffer"] + detail["dora_weight_norm"]
    backward = detail["dequant_buffer"]  # DoRA's norm is rebuilt in forward passes only
    step = detail["optimizer_step_buffer"]
    # The context and the allocator's reserve are parts of their own (what the card holds beyond torch's tensors).
    part = fixed - detail["cuda_context"] - detail["allocator_slack"] + max(forward_backward, step)
    return Runtime(detail, fixed, forward_backward, backward, step, part)


def dora_transient(arch: Arch, dims: Dims, setup: Setup) -> int:
    """PEFT's DoRA recomputes the weight norm ||W + s*B@A|| in every forward pass (and in the
    recompute with checkpointing): B@A is built by pushing an identity (in x in, adapter dtype)
    through the adapter, and W + s*B@A is materialized (out x in): a transient of about
    in^2*4 + out*in*(4 + 2e) bytes for the largest adapted linear."""
    worst = 0
    for lin, _ in all_linears(arch, dims):
        if lin.role in setup.targets:
            ae, e = setup.adapter_bytes, setup.compute_bytes
            size = lin.inp * lin.inp * ae + lin.out * lin.inp * (ae + (e if e != ae else 0) + 2 * e)
            worst = max(worst, size)
    return worst
