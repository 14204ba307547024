"""Building and measuring the configurations of bench/estimate_cases.py: one real training step each,
part by part (see bench/estimate_accuracy.py for what is measured and how)."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import hub_kernels  # noqa: E402
from estimate_cases import Case  # noqa: E402
from estimate_tensors import _SavedTensorMeter, _storage_key, _tensors_in, _unique_bytes, cpu_step_peak  # noqa: E402,F401

# --- building ---------------------------------------------------------------------------------


_SAVED_BASES: dict[tuple, str] = {}


def _base_folder(case: Case, config, dtype) -> str:
    """A temporary folder holding the random-weight model (bitsandbytes quantizes while loading)."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    key = (case.arch, case.attention, str(dtype))
    if key not in _SAVED_BASES:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=case.attention, dtype=dtype)
        folder = tempfile.mkdtemp(prefix="estimate-bench-")
        model.save_pretrained(folder)
        _SAVED_BASES[key] = folder
    return _SAVED_BASES[key]


def build_model(case: Case, device: str = "cpu"):
    """A random-weight causal LM for `case`, ready to train (adapters attached, checkpointing on).

    qlora: NF4 with double quantization and bf16 compute; lora8: LLM.int8. Both load through
    bitsandbytes (which runs on the CPU too) and keep the other weights in the case's dtype, or,
    with autocast (the worker's recipe), go through peft's prepare_model_for_kbit_training, which
    casts them to fp32.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = case.model_config()
    model_type = raw["model_type"]
    kwargs = {k: v for k, v in raw.items() if k not in ("model_type", "architectures", "transformers_version")}
    config = AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = case.attention
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[case.precision]
    if case.autocast and case.method == "full":
        dtype = torch.float32  # fp32 weights, bf16/fp16 compute through autocast (the Trainer's AMP)
    if case.method in ("qlora", "lora8"):
        from transformers import BitsAndBytesConfig

        if case.method == "qlora":
            quant = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=dtype,
            )
        else:
            quant = BitsAndBytesConfig(load_in_8bit=True)
        model = AutoModelForCausalLM.from_pretrained(
            _base_folder(case, config, dtype),
            quantization_config=quant,
            dtype=dtype,
            device_map=device,
            attn_implementation=case.attention,
            **hub_kernels.load_kwargs(),
        )
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=case.attention, dtype=dtype)
        model.to(device)
    if case.method != "full":
        from peft import LoraConfig, get_peft_model

        from backend.training.model.moe import peft_targets

        targets: Any = peft_targets(case.lora_targets, config.model_type)  # as the worker asks peft
        lcfg = LoraConfig(
            r=case.lora_rank,
            lora_alpha=2.0 * case.lora_rank,
            lora_dropout=case.lora_dropout,
            target_modules=targets,
            use_dora=case.method == "dora",
            task_type="CAUSAL_LM",
        )
        if case.method in ("qlora", "lora8") and case.autocast:
            # As the worker does: freezes the base and casts the non-quantized weights to fp32, except
            # a MoE's fused experts, which keep their load dtype (backend/training/model/moe.py).
            from peft import prepare_model_for_kbit_training

            from backend.training.model.moe import keep_experts_dtype

            model = keep_experts_dtype(model, lambda m: prepare_model_for_kbit_training(m, use_gradient_checkpointing=False))
        model = get_peft_model(model, lcfg)
    if case.checkpointing:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        base.activation_checkpointing_enable({"use_reentrant": False})
    model.train()
    return model


def _quant_state_tensors(model) -> list:
    """Quantization constants that are not parameters: NF4 absmax/code/offset (two levels), int8 SCB."""
    import torch

    out = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        state = getattr(weight, "quant_state", None)
        while state is not None:
            out += [t for t in (state.absmax, state.code, getattr(state, "offset", None)) if isinstance(t, torch.Tensor)]
            state = state.state2 if getattr(state, "nested", False) else None
        scb = getattr(weight, "SCB", None)
        if isinstance(scb, torch.Tensor):
            out.append(scb)
    return out


SHOW_CTX = False
"""--show-ctx: print which custom autograd nodes hold which tensors as ctx attributes."""


def _ctx_held_tensors(root) -> list:
    """Tensors that custom autograd Functions keep as ctx attributes rather than through
    save_for_backward (bitsandbytes' int8 matmul keeps its input in ctx.tensors or ctx.A): the
    saved-tensor hooks cannot see them, so they are read off the graph's nodes (any attribute
    holding a tensor, or a tuple or list of them)."""
    import torch

    out, seen, stack = [], set(), [root]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        attrs = getattr(node, "__dict__", None) or {}
        for name, value in attrs.items():
            items = value if isinstance(value, (list, tuple)) else [value]
            held = [t for t in items if isinstance(t, torch.Tensor)]
            out += held
            key = f"{type(node).__name__}.{name}"
            if SHOW_CTX and held:
                nig = getattr(node, "needs_input_grad", None)
                print(f"    ctx-held {key}: {[(tuple(t.shape), str(t.dtype)) for t in held]} needs_input_grad={nig}")
        stack.extend(child for child, _ in node.next_functions)
    return out


def _decoder_layers(model) -> list:
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def measure(case: Case, device: str = "cpu") -> dict[str, Any]:
    """Run one real training step of `case` and return the bytes held, part by part.

    On CUDA a second step follows, whose torch.cuda.max_memory_allocated (less what was allocated
    before the model was built) is returned as `cuda_peak_allocated`, with the CUDA context seen by
    the driver (`cuda_context`) and the allocator's reserve (`cuda_reserved_slack`).
    """
    import gc

    import torch

    if device == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        base_allocated = torch.cuda.memory_allocated()
    model = build_model(case, device)
    vocab = case.model_config()["vocab_size"]
    tokens = case.batch * case.seq_len
    if case.answer:
        tokens = case.batch * min(case.answer, case.seq_len - 1)  # positions whose logits are computed

    params = list(model.parameters())  # shared (tied) parameters appear once
    named = list(model.named_parameters())
    adapter_params = [p for n, p in named if "lora_" in n]
    adapter_ids = {id(p) for p in adapter_params}
    base_params = [p for p in params if id(p) not in adapter_ids]
    trainable = [p for p in params if p.requires_grad]
    buffers = list(model.buffers())
    quant_tensors = _quant_state_tensors(model)

    def nbytes(ts) -> int:
        return sum(t.numel() * t.element_size() for t in ts)

    static_keys = {_storage_key(t) for t in params + buffers + quant_tensors}
    weights, _ = _unique_bytes(base_params + buffers + quant_tensors, {_storage_key(p) for p in adapter_params})

    # Inputs the checkpoint keeps: positional ones are saved (the hooks see them), keyword ones
    # live in the closure of the recompute function (collected here from a pre-hook).
    captured: list[tuple[tuple, dict]] = []
    handles = []
    layers = _decoder_layers(model)
    if case.checkpointing:
        for layer in layers:
            handles.append(
                layer.register_forward_pre_hook(
                    lambda mod, args, kwargs: captured.append((args, kwargs)), with_kwargs=True
                )
            )

    gen = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, vocab, (case.batch, case.seq_len), generator=gen).to(device)
    labels = input_ids.clone()

    def amp():
        if not case.autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device, dtype=torch.bfloat16 if case.precision == "bf16" else torch.float16)

    inputs = {"input_ids": input_ids, "labels": labels}
    if case.answer:
        from backend.training.shortcuts.loss_positions import keep_loss_positions

        labels[:, : case.seq_len - case.answer] = -100
        inputs = keep_loss_positions(inputs)
    with _SavedTensorMeter() as meter, amp():
        out = model(**inputs, use_cache=False)
    for h in handles:
        h.remove()

    def is_vocab_sized(t) -> bool:
        # the log-probabilities cross-entropy saves (not, say, a bf16 copy of lm_head's weight)
        return t.numel() == tokens * vocab and t.shape[-1] == vocab and t.is_contiguous()

    logits = out.logits
    ctx_held = _ctx_held_tensors(out.loss.grad_fn)
    live = meter.live() + ctx_held
    if SHOW_CTX:
        hooked = {_storage_key(t) for t in meter.live()}
        for t in ctx_held:
            k = _storage_key(t)
            print(f"    held {tuple(t.shape)} {t.dtype} storage={k} hooked={k in hooked} static={k in static_keys}")
    vocab_sized = [t for t in live if is_vocab_sized(t)]
    other = [t for t in live if not is_vocab_sized(t)]
    logits_keys = {_storage_key(logits)}
    logit_saved, logit_saved_keys = _unique_bytes(vocab_sized, static_keys | logits_keys)
    activations, act_keys = _unique_bytes(other, static_keys | logits_keys | logit_saved_keys)
    kw_bytes = 0
    if case.checkpointing:
        kw_tensors = [t for _args, kwargs in captured for t in _tensors_in(kwargs)]
        kw_bytes, kw_keys = _unique_bytes(kw_tensors, static_keys | act_keys | logits_keys | logit_saved_keys)
        act_keys |= kw_keys
    recompute = 0
    if case.checkpointing and layers:
        # What the backward pass holds while it recomputes a layer: its saved tensors (the largest
        # layer's: a model's layers may differ, e.g. sliding-window and full attention, or MoE).
        for layer, (args, kwargs) in zip(layers, captured[-len(layers):]):
            layer.gradient_checkpointing = False
            with _SavedTensorMeter() as inner, amp():
                again = layer(*args, **kwargs)
            layer.gradient_checkpointing = True
            held = inner.live()
            for t in _tensors_in(again):
                held += _ctx_held_tensors(t.grad_fn)
            one, _ = _unique_bytes(held, static_keys | act_keys | logits_keys | logit_saved_keys)
            recompute = max(recompute, one)
            del again, inner, held
    captured.clear()

    # The loss' backward: the gradient of the log-probabilities and the gradient of the logits
    # exist together with the saved log-probabilities. Like the Trainer, keep only the loss: the
    # logits tensor itself is freed before the backward pass.
    grads_seen: dict[str, int] = {}
    loss = out.loss
    node = _find_node(loss.grad_fn, "LogSoftmaxBackward")
    if node is not None:
        node.register_prehook(lambda go: grads_seen.__setitem__("grad_logprobs", _nb(go)) or None)
        node.register_hook(lambda gi, go: grads_seen.__setitem__("grad_logits", _nb(gi)) or None)
    logits_bytes = logits.numel() * logits.element_size()
    del out, logits, live, vocab_sized, other, meter

    loss.backward()
    del loss
    logits_forward = logits_bytes + logit_saved
    logits_backward = logit_saved + grads_seen.get("grad_logprobs", 0) + grads_seen.get("grad_logits", 0)

    # The worker's optimizer (backend/training/model/techniques.py): the fused AdamW, which updates in place.
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
    optimizer.step()
    opt_bytes = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                opt_bytes += value.numel() * value.element_size()

    result: dict[str, Any] = {
        "weights": weights,
        "adapters": nbytes(adapter_params),
        "gradients": sum(p.grad.numel() * p.grad.element_size() for p in trainable if p.grad is not None),
        "optimizer": opt_bytes,
        "master_weights": 0,
        "activations": activations + kw_bytes + recompute,
        "logits": max(logits_forward, logits_backward),
        "runtime": 0,
        "detail": {
            "saved_at_end_of_forward": activations,
            "checkpoint_keyword_inputs": kw_bytes,
            "recompute_one_layer": recompute,
            "logits_tensor": logits_bytes,
            "logits_saved": logit_saved,
            **grads_seen,
            "logits_forward": logits_forward,
            "logits_backward": logits_backward,
        },
    }
    if device == "cpu":
        result["cpu_step_peak"] = cpu_step_peak(model, optimizer, inputs, amp, params + buffers + quant_tensors)
    if device == "cuda":
        # A second, steady-state step (optimizer state exists, gradients set to None as the
        # Trainer does), measured by the allocator.
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        with amp():
            loss = model(input_ids=input_ids, labels=labels, use_cache=False).loss
        loss.backward()
        del loss
        optimizer.step()
        torch.cuda.synchronize()
        result["cuda_peak_allocated"] = torch.cuda.max_memory_allocated() - base_allocated
        free, total = torch.cuda.mem_get_info()
        result["cuda_context"] = (total - free) - torch.cuda.memory_reserved()
        result["cuda_reserved_slack"] = torch.cuda.max_memory_reserved() - torch.cuda.max_memory_allocated()
        result["cuda_preexisting"] = base_allocated
    del optimizer, model, params, named, adapter_params, base_params, trainable, buffers, quant_tensors
    return result


def _nb(ts) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def _find_node(node, prefix: str):
    seen = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        if type(n).__name__.startswith(prefix) or n.name().startswith(prefix):
            return n
        stack.extend(child for child, _ in n.next_functions)
    return None
