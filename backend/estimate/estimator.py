"""estimate(): every part of one training step's memory on one device."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from backend.core.config.run_config import RunConfig
from backend.core.cpu_features import bf16_base
from backend.estimate.activations import activation_bytes
from backend.estimate.architectures import count_params
from backend.estimate.attention import attention_kernel
from backend.estimate.breakdown import Breakdown
# serving.sizing reads the CUDA constants here
from backend.estimate.cuda import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES  # noqa: F401
from backend.estimate.families import load_model_config, read_dims
from backend.estimate.parts import (  # noqa: F401 (dora_transient: backend.estimate's public name)
    Logits, ModelStates, Runtime, StepInputs, distribute, dora_transient, logits_part, model_states, runtime_part,
)
from backend.estimate.setup import Setup, resolve_setup
from backend.estimate.shortcut_memory import offload_activations
from backend.core.registries.shortcuts import PACKED_IMAGE_FAMILIES
from backend.core.registries.vision_families import takes_image_door
from backend.estimate.towers import vision_family
from backend.estimate.vision_rows import VisionRows, vision_rows

if TYPE_CHECKING:
    from backend.estimate.calibration import Calibration


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
    row_tokens: int | None = None,
    images_per_row: int | None = None,
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

    cpu_bf16: this CPU multiplies bf16 natively (backend.core.cpu_features.native_bf16(), which callers
    pass for a CPU run). With device "cpu", precision auto and method lora, the worker then holds
    the adapted linears' frozen weights (and biases) in bf16 (lora_matmul.py): 2 bytes each, not 4.

    calibration (device "cpu" only): the worker process's own resident memory before it loads the
    model (backend.estimate.calibration.Calibration, read from this machine's runs by the caller), added to
    the runtime part as `process_baseline`: a CPU worker's RSS holds it besides the tensors. None:
    no baseline, the tensors alone (what bench/estimate_accuracy.py measures). The estimate itself
    reads no file but config.json, so the same arguments always give the same Breakdown.

    row_tokens (DPO, KTO, GRPO): the data's longest row as the objective's trainer builds it
    (backend.estimate.objective_rows; GRPO: its longest prompt). TRL pads each batch to its longest
    row, so rows count that many tokens, at most seq_len (GRPO's prompts are not cut). None: seq_len.

    images_per_row (a proven vision-language model): the data's most images in one row; its image side
    (backend.estimate.vision_rows) counts that many per row at the resolution cap, their image tokens
    inside seq_len. None: one image a row, said in a note; 0: text only (no image side).
    """
    if run.technique.objective != "sft":  # DPO, KTO, GRPO: SFT's estimate of their training forward, then their passes
        from backend.estimate.objectives import estimate_objective, sft_run

        kw = dict(num_gpus=num_gpus, zero_stage=zero_stage, device=device, bf16_supported=bf16_supported,
                  autocast=autocast, target_tokens=target_tokens, cpu_bf16=cpu_bf16, calibration=calibration,
                  images_per_row=images_per_row)
        base = estimate(model_config, sft_run(run, row_tokens), **kw)  # type: ignore[arg-type]
        return estimate_objective(model_config, run, base, device=device, bf16_supported=bf16_supported,
                                  autocast=autocast, target_tokens=target_tokens, zero_stage=zero_stage,
                                  row_tokens=row_tokens)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if num_gpus < 1:
        raise ValueError("num_gpus must be at least 1")
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError("zero_stage must be 0, 1, 2 or 3")
    raw = load_model_config(model_config)
    arch, dims, warnings = read_dims(raw)
    packed_images = False
    if vision_family(raw) is not None and takes_image_door(raw, run.vision.tower, run.vision.projector,
                                                           images_per_row):
        # The vision door (backend/training/vision) runs without the text rows' shortcuts: logits at every
        # position; its rows pack only where packed_image_rows is proven (else padded batches, as the job does)
        packed_images = (run.technique.packing and run.technique.shortcuts == "auto"
                         and str(raw.get("model_type")) in PACKED_IMAGE_FAMILIES)
        door = {"shortcuts": "off", "packing": packed_images}
        run = run.model_copy(update={"technique": run.technique.model_copy(update=door)})
        target_tokens = None
    deepspeed = device == "cuda" and (zero_stage > 0 or run.technique.offload != "none")
    setup, more = resolve_setup(arch, dims, run, device, bf16_supported, autocast, deepspeed)
    if packed_images and setup.attention == "sdpa" and not run.technique.torch_compile:
        setup = replace(setup, example_len=run.train.seq_len)  # sdpa_packed: one causal SDPA per packed row
    warnings += more
    step = StepInputs(arch, dims, setup, count_params(arch, dims), run, device)

    states = model_states(step, bf16_base(run, device, cpu_bf16), warnings)
    act = offload_activations(activation_bytes(arch, dims, setup), run, dims.model_type, setup,
                              dims.layers)  # activation_offload
    logits = logits_part(step, target_tokens)
    dist = distribute(step, states, num_gpus, zero_stage, warnings)
    runtime = runtime_part(step, states, act["total"], logits.held, num_gpus, calibration)
    vision = vision_rows(raw, run, setup, images_per_row, warnings)
    phases = with_vision(step_phases(step, states, act, logits, runtime), vision, states, runtime,
                         run.train.gradient_accumulation_steps > 1)
    parts = StepParts(states, act, logits, dist, runtime, phases)
    details = _details(step, parts, warnings, target_tokens, calibration)
    if vision.detail:
        details["vision"] = vision.detail
    return Breakdown(
        weights=states.weights,
        adapters=states.adapters,
        gradients=states.gradients,
        optimizer=states.optimizer,
        master_weights=states.master,
        activations=act["total"],
        logits=logits.held,
        runtime=runtime.part,
        cuda_context=runtime.detail["cuda_context"],
        allocator_reserve=runtime.detail["allocator_slack"],
        vision_tower=vision.tower,
        projector=vision.projector,
        vision_activations=vision.activations + vision.language_side,
        pixel_values=vision.pixels,
        details=details,
    )


def with_vision(phases: dict[str, int], vision: VisionRows, states: ModelStates, runtime: Runtime,
                accumulate: bool) -> dict[str, int]:
    """The phases with the image side: its states and pixels held throughout (the pixels until the step),
    its trained activations beside the language model's until the backward, its gradients once the
    backward made them; the tower's forward is a phase of its own (it runs before the language model's
    activations exist): a frozen tower's transient peak, or a trained one's saved tensors, with the pixel
    copies some families make while it runs."""
    if not (vision.tower or vision.projector):
        return phases
    fixed = phases.pop("fixed_runtime")
    phases.pop("peak")
    out = {}
    for name, value in phases.items():
        value += vision.static
        if name != "optimizer_step":
            value += vision.pixels + vision.language_side + (vision.activations if vision.held_activations else 0)
        if name in ("optimizer_step", "backward_end", "recompute") or accumulate:
            value += vision.gradients
        out[name] = value
    static = states.weights + states.adapters + states.optimizer + states.master
    out["vision_forward"] = (static + vision.static + vision.pixels + vision.activations + vision.forward_copies
                             + (states.gradients + vision.gradients if accumulate else 0)
                             + runtime.forward_backward_transient)
    out["peak"] = max(out.values()) + fixed
    out["fixed_runtime"] = fixed
    return out


@dataclass(frozen=True)
class StepParts:
    """Every part's own record, for Breakdown.details."""

    states: ModelStates
    activations: dict[str, Any]
    logits: Logits
    distributed: dict[str, Any]
    runtime: Runtime
    phases: dict[str, int]


def step_phases(step: StepInputs, states: ModelStates, act: dict[str, Any], logits: Logits,
                runtime: Runtime) -> dict[str, int]:
    """The bytes at each moment that can be the step's peak, the peak itself and the fixed runtime."""
    setup, dims, counts, run = step.setup, step.dims, step.counts, step.run
    grad_bytes = states.grad_bytes
    static = states.weights + states.adapters + states.optimizer + states.master
    # Gradients that do not exist yet while the first layer is recomputed: its own and the input
    # embeddings' (an untied one; a tied one got lm_head's gradient already).
    late_gradients = 0
    if setup.full:
        per_layer = (counts.text - counts.embedding - counts.lm_head - counts.positions) // max(1, dims.layers)
        late_gradients = (per_layer + (0 if dims.tied else counts.embedding) + counts.positions) * grad_bytes
    lm_head_grad = dims.vocab * dims.hidden * grad_bytes if setup.full else 0
    phases = peak_phases(setup, act, static=static, logits=max(logits.held, logits.elements * 4 + lm_head_grad),
                         gradients=states.gradients, accumulate=run.train.gradient_accumulation_steps > 1,
                         layers=dims.layers,
                         head_gradients=lm_head_grad + (dims.hidden * grad_bytes if setup.full else 0),
                         fwd_transient=runtime.forward_backward_transient, bwd_transient=runtime.backward_transient,
                         step_transient=runtime.step_transient,
                         tied_gradient=dims.vocab * dims.hidden * grad_bytes if setup.full and dims.tied else 0,
                         late_gradients=late_gradients)
    phases["peak"] = max(phases.values()) + runtime.fixed
    phases["fixed_runtime"] = runtime.fixed
    return phases


def _details(step: StepInputs, parts: StepParts, warnings: list[str], target_tokens: int | None,
             calibration: Calibration | None) -> dict[str, Any]:
    """Breakdown.details: the model, the resolved setup and every part's own figures."""
    arch, dims, setup, counts, device = step.arch, step.dims, step.setup, step.counts, step.device
    states, act, logits, dist, runtime, phases = (parts.states, parts.activations, parts.logits, parts.distributed,
                                                  parts.runtime, parts.phases)
    return {
        "model": {
            "model_type": dims.model_type,
            "family": arch.family,
            "measured": arch.measured and not any("not in the table" in w for w in warnings),
            "parameters": counts.total,
            "linear_parameters": counts.linear_weights,
            "embedding_parameters": counts.embedding + counts.lm_head + counts.positions,
            "expert_parameters": counts.experts,
            "router_parameters": counts.router,
            "tower_parameters": counts.extra,
            "tied_embeddings": dims.tied,
            "layers": dims.layers,
            "moe_layers": dims.moe_layers,
            "experts": dims.experts,
            "experts_per_token": dims.top_k,
            "hidden_size": dims.hidden,
            "intermediate_size": dims.intermediate,
            "heads": dims.heads,
            "kv_heads": dims.kv_heads,
            "head_dim": dims.head_dim,
            "vocab_size": dims.vocab,
        },
        "setup": {
            "method": setup.method,
            "precision": setup.dtype,
            "attention": setup.attention,
            "attention_kernel": attention_kernel(dims, setup),
            "autocast": setup.autocast,
            "weights_dtype": "fp32" if setup.weight_bytes == 4 else setup.dtype,
            "gradient_checkpointing": setup.checkpointing,
            "micro_batch_size": setup.batch,
            "seq_len": setup.seq,
            "device": device,
            "lora_targets": sorted(setup.targets),
        },
        "weights": states.storage,
        "trainable_parameters": states.trained,
        "adapter_parameters": states.adapter_params,
        "idle_adapter_parameters": states.idle_params,
        "optimizer": states.optimizer_detail,
        "activations": act,
        "logits": {"forward": logits.forward, "backward": logits.backward, "elements": logits.elements,
                   "positions": logits.positions, "target_tokens": target_tokens},
        "distributed": dist,
        "runtime": runtime.detail,
        "calibration": None if calibration is None or device != "cpu" else {
            "baseline_bytes": int(calibration.baseline_bytes), "runs": int(calibration.runs),
            "note": calibration.note()},
        "peak_phases": phases,
        "warnings": warnings,
    }


def peak_phases(setup: Setup, act: dict[str, Any], *, static: int, logits: int, gradients: int, accumulate: bool,
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
    if not setup.checkpointing:
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
