"""estimate(): every part of one training step's memory on one device."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from backend.config.run_config import RunConfig
from backend.api.cpu_features import bf16_base
from backend.estimate.activations import activation_bytes
from backend.estimate.architectures import Arch, Dims, all_linears, count_params
from backend.estimate.attention import attention_kernel
from backend.estimate.breakdown import Breakdown
from backend.estimate.cuda import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, allocator_reserve
from backend.estimate.families import load_model_config, read_dims
from backend.estimate.setup import Setup, resolve_setup
from backend.estimate.shortcut_memory import held_logit_elements, offload_activations
from backend.estimate.states import (
    idle_adapter_params, optimizer_state, rotary_buffers, storage_bytes, trained_tensor_sizes, weight_storage,
)

if TYPE_CHECKING:
    from backend.api.calibration import Calibration

def estimate(
    model_config: dict[str, Any] | str | Path,
    run: RunConfig,
    *,
    num_gpus: int = 1,
    zero_stage: int = 0,
    device: Literal["cuda", "cpu"] = "cpu",
    bf16_supported: bool = True,
    autocast: bool | None = None,
    target_tokens: int | None = None,
    cpu_bf16: bool = False,
    calibration: Calibration | None = None,
) -> Breakdown:
    """Estimate the memory of one training step of `run` on one device.

    model_config: config.json as a dict, a model folder (only config.json is read, nothing is
    downloaded), the file itself, or a `bundled:` path. num_gpus / zero_stage: data-parallel GPUs
    and the DeepSpeed ZeRO stage (0-3); technique.offload raises the stage to 2 or 3 and moves
    state to CPU memory. device: "cpu" resolves precision auto to fp32; "cuda" resolves it to bf16
    (fp16 when bf16_supported is False).

    autocast (bf16/fp16 only): True is the Hugging Face Trainer's recipe, which the worker runs:
    adapters over a base loaded in bf16/fp16, full tuning over fp32 weights (4 B weights + 4 B
    gradients + 8 B Adam, no separate master copy, plus bf16 copies of the weights saved by
    autocast), k-bit bases with their other weights cast to fp32 by peft's
    prepare_model_for_kbit_training, all run under torch.autocast. False: the model is held in
    bf16/fp16 and runs as it is, full tuning keeping an fp32 master copy in the optimizer (the ZeRO
    paper's 2 + 2 + 4 + 8 bytes; what DeepSpeed does). None (default): True, except with DeepSpeed
    (zero_stage > 0 or technique.offload).

    target_tokens: the most loss tokens one example of the data holds (answers and their end
    tokens; every token of raw text). The worker projects logits only at loss positions, so a
    micro-batch holds at most micro_batch x min(seq_len, target_tokens) of them. None: every
    position, the worst case, for data not measured.

    cpu_bf16: this CPU multiplies bf16 natively (backend.api.cpu_features.native_bf16(), which callers
    pass for a CPU run). With device "cpu", precision auto and method lora, the worker then holds
    the adapted linears' frozen weights (and biases) in bf16 (lora_matmul.py): 2 bytes each, not 4.

    calibration (device "cpu" only): the worker process's own resident memory before it loads the
    model (backend.api.calibration.Calibration, read from this machine's runs by the caller), added to
    the runtime part as `process_baseline`: a CPU worker's RSS holds it besides the tensors. None:
    no baseline, the tensors alone (what bench/estimate_accuracy.py measures). The estimate itself
    reads no file but config.json, so the same arguments always give the same Breakdown.
    """
    if run.technique.objective != "sft":  # DPO, KTO, GRPO: SFT's estimate of their training forward, then their passes
        from backend.estimate.objectives import estimate_objective, sft_run

        kw = dict(num_gpus=num_gpus, zero_stage=zero_stage, device=device, bf16_supported=bf16_supported,
                  autocast=autocast, target_tokens=target_tokens, cpu_bf16=cpu_bf16, calibration=calibration)
        base = estimate(model_config, sft_run(run), **kw)  # type: ignore[arg-type]
        return estimate_objective(model_config, run, base, device=device, bf16_supported=bf16_supported,
                                  autocast=autocast, target_tokens=target_tokens, zero_stage=zero_stage)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if num_gpus < 1:
        raise ValueError("num_gpus must be at least 1")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError("zero_stage must be 0, 1, 2 or 3")
    raw = load_model_config(model_config)
    arch, d, warnings = read_dims(raw)
    deepspeed = device == "cuda" and (zero_stage > 0 or run.technique.offload != "none")
    s, more = resolve_setup(arch, d, run, device, bf16_supported, autocast, deepspeed)
    warnings += more
    t = run.technique
    counts = count_params(arch, d)

    # -- weights, by storage type
    e = s.compute_bytes
    w_dtype = "fp32" if s.weight_bytes == 4 else s.dtype
    buffers = rotary_buffers(arch, d)
    storage, more = weight_storage(arch, d, s, counts, bf16_base(run, device, cpu_bf16))
    warnings += more
    weights = storage_bytes(storage)

    # -- adapters (fp32); a vision tower's adapters are held but never trained
    sizes = trained_tensor_sizes(arch, d, s, counts)
    adapter_params = sum(sizes) if s.adapted else 0
    idle = idle_adapter_params(d, s)
    adapters = (adapter_params + idle) * s.adapter_bytes

    # -- model states: gradients, optimizer, master weights
    if s.full:
        # Gradients take the weights' dtype; an fp32 master copy exists only when the weights
        # themselves are bf16/fp16 (without autocast).
        trained, grad_e = counts.text, s.weight_bytes
        master = counts.text * 4 if s.weight_bytes != 4 else 0
    else:
        trained, grad_e = adapter_params, s.adapter_bytes
        master = 0
    gradients = trained * grad_e
    optimizer, opt_detail = optimizer_state(t.optimizer, sizes)

    # -- activations and logits
    act = offload_activations(activation_bytes(arch, d, s), run, d.model_type, s, d.layers)  # activation_offload
    activations = act["total"]
    positions = s.tokens
    if target_tokens is not None:
        positions = min(s.tokens, run.train.micro_batch_size * min(run.train.seq_len, max(1, int(target_tokens))))
    tv = held_logit_elements(run, d.model_type, d.vocab, positions * d.vocab, device)  # chunked_loss: one chunk's
    logit_e = e if s.autocast else s.weight_bytes
    logits_fwd = tv * (logit_e + 4 + (4 if logit_e != 4 else 0))
    logits_bwd = tv * (4 + 4 + 4)
    if d.final_softcap:
        # logits = tanh(logits / cap) * cap: tanh saves its output, one more logits-sized tensor
        logits_fwd += tv * logit_e
        logits_bwd += tv * logit_e
    logits = max(logits_fwd, logits_bwd)
    if t.liger_kernel:
        # Liger's fused linear cross-entropy never materialises the logits: it walks the tokens in
        # chunks and keeps one chunk's fp32 logits and their gradient (Liger's chunk is about
        # vocab/hidden rows, at least 1). Not measured here (it needs CUDA); derived from the kernel.
        chunk = max(1, min(s.tokens, -(-d.vocab // d.hidden)))
        logits_fwd = logits_bwd = logits = chunk * d.vocab * (4 + 4)

    # -- distribution: ZeRO stages, DDP buckets, offload
    dist: dict[str, Any] = {"num_gpus": num_gpus, "zero_stage": zero_stage, "offload": t.offload}
    offloaded = 0
    if device == "cuda":
        stage = zero_stage
        if t.offload == "zero2_optimizer":
            stage = max(stage, 2)
        elif t.offload == "zero3_optimizer_params":
            stage = 3
        dist["effective_stage"] = stage
        n = num_gpus
        if stage == 0 and n > 1:
            dist["ddp_bucket_bytes"] = gradients  # DDP's flat buckets hold a second copy of the gradients
            gradients *= 2
        if stage >= 1:
            optimizer = math.ceil(optimizer / n)
            master = math.ceil(master / n)
        if stage >= 2:
            gradients = math.ceil(gradients / n)
        if stage >= 3:
            per_layer_weights = (weights - buffers) // max(1, d.layers)
            gathered = 2 * per_layer_weights  # the layer being computed and the prefetched one
            dist["zero3_gathered_bytes"] = gathered
            if t.offload == "zero3_optimizer_params":
                offloaded += weights + adapters
                weights = gathered
            else:
                weights = math.ceil(weights / n) + gathered
            adapters = math.ceil(adapters / n)
        if t.offload != "none":
            offloaded += optimizer + master
            optimizer = 0
            master = 0
        dist["cpu_offloaded_bytes"] = offloaded
    elif num_gpus > 1 or zero_stage or t.offload != "none":
        warnings.append("num_gpus, zero_stage and offload apply to CUDA only; ignored for device cpu")

    # -- runtime: fixed costs plus the larger of the transients of the two phases of a step
    runtime_detail = {
        "cuda_context": 0,
        "cublas_workspace": 0,
        "allocator_slack": 0,
        "dequant_buffer": 0,
        "dora_weight_norm": 0,
        "optimizer_step_buffer": 0,
        "process_baseline": 0,
    }
    if device == "cpu" and calibration is not None:
        runtime_detail["process_baseline"] = int(calibration.baseline_bytes)
    if device == "cuda":
        runtime_detail["cuda_context"] = CUDA_CONTEXT_BYTES
        runtime_detail["cublas_workspace"] = CUBLAS_WORKSPACE_BYTES
        runtime_detail["allocator_slack"] = allocator_reserve(activations + logits + gradients)
    # Transients on either device: bitsandbytes dequantizes a k-bit weight for each matmul, DoRA
    # rebuilds its weight norm in every forward pass.
    if s.quant:
        runtime_detail["dequant_buffer"] = counts.largest_linear * e
    if s.method == "dora":
        runtime_detail["dora_weight_norm"] = dora_transient(arch, d, s)
    if t.optimizer == "adamw" and run.hardware.strategy == "fsdp" and device == "cuda":
        # FSDP keeps the per-tensor AdamW, whose foreach kernels (the CUDA default) build sqrt(v)
        # for all parameters at once. The worker's single-device and DDP runs use the fused AdamW
        # and DeepSpeed its fused Adam, which update in place (no step buffer; measured on the CPU).
        runtime_detail["optimizer_step_buffer"] = math.ceil(trained * 4 / max(1, num_gpus))
    fixed = (runtime_detail["cuda_context"] + runtime_detail["cublas_workspace"] + runtime_detail["allocator_slack"]
             + runtime_detail["process_baseline"])
    fwd_bwd_transient = runtime_detail["dequant_buffer"] + runtime_detail["dora_weight_norm"]
    bwd_transient = runtime_detail["dequant_buffer"]  # DoRA's norm is rebuilt in forward passes only
    step_transient = runtime_detail["optimizer_step_buffer"]
    # The context and the allocator's reserve are parts of their own (what the card holds beyond torch's tensors).
    runtime = fixed - runtime_detail["cuda_context"] - runtime_detail["allocator_slack"] + max(fwd_bwd_transient,
                                                                                               step_transient)

    static = weights + adapters + optimizer + master
    # Gradients that do not exist yet while the first layer is recomputed: its own and the input
    # embeddings' (an untied one; a tied one got lm_head's gradient already).
    late_gradients = 0
    if s.full:
        per_layer = (counts.text - counts.embedding - counts.lm_head - counts.positions) // max(1, d.layers)
        late_gradients = (per_layer + (0 if d.tied else counts.embedding) + counts.positions) * grad_e
    lm_head_grad = d.vocab * d.hidden * grad_e if s.full else 0
    phases = peak_phases(s, act, static=static, logits=max(logits, tv * 4 + lm_head_grad), gradients=gradients,
                         accumulate=run.train.gradient_accumulation_steps > 1, layers=d.layers,
                         head_gradients=lm_head_grad + (d.hidden * grad_e if s.full else 0),
                         fwd_transient=fwd_bwd_transient, bwd_transient=bwd_transient, step_transient=step_transient,
                         tied_gradient=d.vocab * d.hidden * grad_e if s.full and d.tied else 0,
                         late_gradients=late_gradients)
    phases["peak"] = max(phases.values()) + fixed
    phases["fixed_runtime"] = fixed

    details: dict[str, Any] = {
        "model": {
            "model_type": d.model_type,
            "family": arch.family,
            "measured": arch.measured and not any("not in the table" in w for w in warnings),
            "parameters": counts.total,
            "linear_parameters": counts.linear_weights,
            "embedding_parameters": counts.embedding + counts.lm_head + counts.positions,
            "expert_parameters": counts.experts,
            "router_parameters": counts.router,
            "tower_parameters": counts.extra,
            "tied_embeddings": d.tied,
            "layers": d.layers,
            "moe_layers": d.moe_layers,
            "experts": d.experts,
            "experts_per_token": d.top_k,
            "hidden_size": d.hidden,
            "intermediate_size": d.intermediate,
            "heads": d.heads,
            "kv_heads": d.kv_heads,
            "head_dim": d.head_dim,
            "vocab_size": d.vocab,
        },
        "setup": {
            "method": s.method,
            "precision": s.dtype,
            "attention": s.attention,
            "attention_kernel": attention_kernel(d, s),
            "autocast": s.autocast,
            "weights_dtype": w_dtype,
            "gradient_checkpointing": s.checkpointing,
            "micro_batch_size": s.batch,
            "seq_len": s.seq,
            "device": device,
            "lora_targets": sorted(s.targets),
        },
        "weights": storage,
        "trainable_parameters": trained,
        "adapter_parameters": adapter_params,
        "idle_adapter_parameters": idle,
        "optimizer": opt_detail,
        "activations": act,
        "logits": {"forward": logits_fwd, "backward": logits_bwd, "elements": tv, "positions": positions,
                   "target_tokens": target_tokens},
        "distributed": dist,
        "runtime": runtime_detail,
        "calibration": None if calibration is None or device != "cpu" else {
            "baseline_bytes": int(calibration.baseline_bytes), "runs": int(calibration.runs),
            "note": calibration.note()},
        "peak_phases": phases,
        "warnings": warnings,
    }
    return Breakdown(
        weights=weights,
        adapters=adapters,
        gradients=gradients,
        optimizer=optimizer,
        master_weights=master,
        activations=activations,
        logits=logits,
        runtime=runtime,
        cuda_context=runtime_detail["cuda_context"],
        allocator_reserve=runtime_detail["allocator_slack"],
        details=details,
    )


def peak_phases(s: Setup, act: dict[str, Any], *, static: int, logits: int, gradients: int, accumulate: bool,
                layers: int, head_gradients: int, fwd_transient: int, bwd_transient: int, step_transient: int,
                tied_gradient: int = 0, late_gradients: int = 0) -> dict[str, int]:
    """Bytes held at each moment of a steady-state step that can be its peak (the static states
    are held throughout; gradients survive between micro-batches when accumulating):

    - forward_end: all saved activations while the last layer's forward transients exist (DoRA's
      weight norm, bitsandbytes' dequantized weight), before the loss buffers do;
    - backward_start: all saved activations plus the loss buffers (or, once lm_head's backward runs
      in full tuning, the logits' gradient and lm_head's weight gradient), with the backward
      pass's transients (the dequantized weight);
    - with activation checkpointing, the loss buffers are freed before the first layer is
      recomputed, so the loss phase holds the checkpointed inputs and the model-level tensors, and
      the recompute phase one layer's saved tensors instead of the loss buffers (with the gradients
      made so far: at the last layer all inputs and the head's gradients, at the first one input
      and nearly all gradients; the sum is linear in between, so the ends bound it);
    - backward_end (full tuning of a tied embedding): the embedding's backward makes a second
      vocab x hidden gradient for the weight lm_head already gave one, and autograd adds the two
      out of place: two more of them beside all the other gradients (measured on the CPU);
    - optimizer_step: the gradients plus the optimizer's temporary.
    """
    accumulated = gradients if accumulate else 0
    end = {"backward_end": static + gradients + 2 * tied_gradient} if tied_gradient else {}
    if not s.checkpointing:
        return {
            "forward_end": static + act["total"] + accumulated + fwd_transient,
            "backward_start": static + act["total"] + logits + accumulated + bwd_transient,
            **end,
            "optimizer_step": static + gradients + step_transient,
        }
    kept, extra, model = act["checkpointed_inputs"], act["checkpoint_extra_inputs"], act["model_level"]
    persistent = act["model_level_persistent"]
    one_input = kept // max(1, layers)
    grown = max(kept + (accumulated or head_gradients), one_input + (accumulated or gradients - late_gradients))
    return {
        "loss_backward": static + kept + extra + model + logits + accumulated + bwd_transient,
        "recompute": static + extra + persistent + act["recompute_one_layer"] + grown + fwd_transient,
        **end,
        "optimizer_step": static + gradients + step_transient,
    }


def dora_transient(arch: Arch, d: Dims, s: Setup) -> int:
    """PEFT's DoRA recomputes the weight norm ||W + s*B@A|| in every forward pass (and in the
    recompute with checkpointing): B@A is built by pushing an identity (in x in, adapter dtype)
    through the adapter, and W + s*B@A is materialized (out x in): a transient of about
    in^2*4 + out*in*(4 + 2e) bytes for the largest adapted linear."""
    worst = 0
    for lin, _ in all_linears(arch, d):
        if lin.role in s.targets:
            ae, e = s.adapter_bytes, s.compute_bytes
            size = lin.inp * lin.inp * ae + lin.out * lin.inp * (ae + (e if e != ae else 0) + 2 * e)
            worst = max(worst, size)
    return worst
