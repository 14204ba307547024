"""How close is `backend.estimate` to the bytes a real training step holds?

Builds small random-weight models (a Llama, or the bundled `resources/tiny` when it exists, plus a
GPT-NeoX, a Qwen2 and a Phi-3), runs one real training step for each configuration of a matrix
(LoRA / DoRA / QLoRA / LLM.int8 / full, activation checkpointing on and off, eager / SDPA
attention, two sequence lengths, two batch sizes, fp32 / bf16, with and without the Trainer's
autocast) and measures, part by part, what is actually held:

- weights, adapters, gradients, optimizer: summed from the tensors themselves after one
  `torch.optim.AdamW` step (LoRA and DoRA through peft);
- activations: every tensor autograd saves during the forward pass, seen through
  `torch.autograd.graph.saved_tensors_hooks`, still alive when the forward pass ends, each storage
  counted once (by `untyped_storage().data_ptr()`), parameters and buffers left out, plus tensors
  that custom autograd Functions keep as ctx attributes (bitsandbytes' int8 matmul). With
  activation checkpointing, the keyword inputs the checkpoint keeps in its closure are added, and
  so is what one layer saves when it is recomputed in the backward pass (measured by running the
  last layer once more, uncheckpointed, under the same hooks);
- logits: the logits tensor of the output, the log-probabilities the loss saves (any saved storage
  of B*S*vocab elements) and the two gradients that exist together while the loss' backward runs
  (read with hooks on the LogSoftmax backward node);
- on a GPU, when there is one: the same parts, and `torch.cuda.max_memory_allocated` over a second,
  steady-state step against the estimate's total and its phase-by-phase peak, both less the CUDA
  context, the allocator slack and the cuBLAS workspace (which that counter does not see); these
  rows are reported, not part of the ±10% goal.

Prints predicted against measured for every part and the worst relative error per part; exits 1
when a part misses ±10%.

    python bench/estimate_accuracy.py             # the whole matrix (~15 s on one CPU thread)
    python bench/estimate_accuracy.py --quick     # three configurations
    python bench/estimate_accuracy.py --only amp  # the configurations whose name contains "amp"

The functions here (`measure`, `predict`, `compare`, `MATRIX`) are imported by
tests/backend/test_estimate.py, which checks a slice of the matrix.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
import weakref
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from backend.config import RunConfig  # noqa: E402
from backend.estimate import PARTS, Breakdown, estimate  # noqa: E402

TOLERANCE = 0.10
"""The goal: every part within ±10% of what was measured."""

TINY_DIR = ROOT / "resources" / "tiny"

TINY_LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 4,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
"""A small Llama with grouped-query attention (4 query heads, 2 key/value heads) and a gated MLP."""

TINY_NEOX = {
    "model_type": "gpt_neox",
    "architectures": ["GPTNeoXForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_attention_heads": 4,
    "num_hidden_layers": 3,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "rotary_pct": 0.25,
    "use_parallel_residual": True,
    "tie_word_embeddings": False,
    "hidden_act": "gelu",
}
"""A small GPT-NeoX (Pythia-style): fused QKV with bias, LayerNorm, parallel residual, GELU MLP."""

TINY_QWEN2 = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 640,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}
"""A small Qwen2: biased q/k/v, no grouping (kv heads = heads), tied embeddings."""

TINY_PHI3 = {
    "model_type": "phi3",
    "architectures": ["Phi3ForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 1024,
    "original_max_position_embeddings": 1024,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "pad_token_id": 0,
}
"""A small Phi-3: fused qkv_proj and gate_up_proj."""

ARCH_CONFIGS = {
    "gpt_neox": TINY_NEOX,
    "gpt_neox_seq": {**TINY_NEOX, "use_parallel_residual": False},
    "qwen2": TINY_QWEN2,
    "phi3": TINY_PHI3,
}


def llama_config_dict() -> dict[str, Any]:
    """The bundled tiny model's config.json when the folder exists, else TINY_LLAMA."""
    path = TINY_DIR / "config.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    return dict(TINY_LLAMA)


@dataclasses.dataclass(frozen=True)
class Case:
    """One configuration of the matrix."""

    arch: str  # "llama" or "gpt_neox"
    method: str  # "lora", "dora" or "full"
    checkpointing: bool
    attention: str  # "eager" or "sdpa"
    seq_len: int
    batch: int
    lora_rank: int = 8
    lora_targets: str = "all-linear"
    precision: str = "fp32"  # what the CPU runs: "auto" resolves to fp32 there
    lora_dropout: float = 0.0
    autocast: bool = False
    """Run as the Trainer does with bf16/fp16 on: the forward under torch.autocast, the base loaded
    in the compute dtype for adapters and in fp32 for full tuning. Off: the model is held in the
    compute dtype and runs without autocast."""
    answer: int = 0
    """0: every token is a target (raw text). N: only each row's last N tokens are, and the step
    runs as the worker's does, logits at the loss positions only; predicted with target_tokens=N."""

    @property
    def name(self) -> str:
        gc = "+gc" if self.checkpointing else ""
        tgt = "" if self.lora_targets == "all-linear" or self.method == "full" else f"[{self.lora_targets}]"
        tgt += f"(r{self.lora_rank}" + (f",p{self.lora_dropout})" if self.lora_dropout else ")") if self.method != "full" else ""
        amp = "+amp" if self.autocast else ""
        answer = f"/answer{self.answer}" if self.answer else ""
        return (f"{self.arch}/{self.method}{tgt}{gc}/{self.attention}/s{self.seq_len}xb{self.batch}/{self.precision}"
                f"{amp}{answer}")

    def model_config(self) -> dict[str, Any]:
        return llama_config_dict() if self.arch == "llama" else dict(ARCH_CONFIGS[self.arch])

    def run_config(self) -> RunConfig:
        return RunConfig.from_dict(
            {
                "technique": {
                    "method": self.method,
                    "lora_rank": self.lora_rank,
                    "lora_alpha": 2.0 * self.lora_rank,
                    "lora_targets": self.lora_targets,
                    "lora_dropout": self.lora_dropout,
                    "gradient_checkpointing": self.checkpointing,
                    "attention": self.attention,
                    "precision": self.precision,
                    "packing": False,  # the matrix measures padded micro-batches of seq_len rows
                },
                "train": {"micro_batch_size": self.batch, "seq_len": self.seq_len},
            }
        )


MATRIX: list[Case] = [
    # Llama: LoRA / full, checkpointing on and off, eager and SDPA, two lengths, two batch sizes.
    Case("llama", "lora", False, "eager", 128, 1),
    Case("llama", "lora", False, "sdpa", 256, 2),
    Case("llama", "lora", True, "eager", 256, 2),
    Case("llama", "lora", True, "sdpa", 128, 1),
    Case("llama", "full", False, "eager", 256, 2),
    Case("llama", "full", False, "sdpa", 128, 1),
    Case("llama", "full", True, "eager", 128, 1),
    Case("llama", "full", True, "sdpa", 256, 2),
    Case("llama", "dora", False, "sdpa", 128, 2),
    Case("llama", "lora", False, "eager", 128, 2, lora_rank=16, lora_targets="q_proj,v_proj"),
    # GPT-NeoX: the other architecture family.
    Case("gpt_neox", "lora", False, "eager", 256, 1),
    Case("gpt_neox", "lora", True, "sdpa", 128, 2),
    Case("gpt_neox", "full", False, "sdpa", 256, 2),
    Case("gpt_neox", "full", True, "eager", 128, 1),
    Case("gpt_neox", "lora", False, "sdpa", 128, 2, precision="bf16"),
    Case("llama", "lora", False, "sdpa", 128, 2, precision="bf16"),
    # Edge cases: bf16 eager (the softmax copy), DoRA in bf16, LoRA dropout, sequential residual,
    # no grouped-query attention with tied embeddings, fused qkv / gate_up projections.
    Case("llama", "lora", False, "eager", 256, 1, precision="bf16"),
    Case("gpt_neox", "dora", True, "eager", 128, 1, precision="bf16"),
    Case("llama", "lora", False, "sdpa", 128, 1, lora_dropout=0.1),
    # Instruction data: logits only at the answers' positions (backend/training/loss_positions.py).
    Case("llama", "lora", False, "sdpa", 256, 2, answer=40),
    Case("qwen2", "lora", True, "eager", 128, 2, answer=100),
    Case("gpt_neox_seq", "lora", False, "eager", 128, 2),
    Case("qwen2", "full", False, "eager", 256, 1),
    Case("qwen2", "lora", True, "sdpa", 128, 2, lora_targets="q_proj,k_proj,v_proj,o_proj"),
    Case("phi3", "lora", False, "sdpa", 256, 1),
    Case("phi3", "full", False, "eager", 128, 2),
    # Quantized bases through bitsandbytes (which runs on the CPU too).
    Case("llama", "qlora", False, "sdpa", 128, 2, precision="bf16"),
    Case("llama", "lora8", True, "eager", 128, 1, precision="bf16"),
    Case("llama", "lora8", False, "sdpa", 128, 2, precision="bf16"),
    Case("gpt_neox", "qlora", True, "sdpa", 256, 1, precision="bf16"),
    # The Trainer's recipe with bf16 on (what the worker runs): forward under torch.autocast;
    # full tuning over fp32 weights; k-bit bases through prepare_model_for_kbit_training.
    Case("llama", "lora", False, "sdpa", 128, 2, precision="bf16", autocast=True),
    Case("llama", "lora", True, "eager", 128, 1, precision="bf16", autocast=True, lora_dropout=0.1),
    Case("llama", "full", False, "sdpa", 128, 2, precision="bf16", autocast=True),
    Case("llama", "full", True, "eager", 256, 1, precision="bf16", autocast=True),
    Case("gpt_neox", "lora", False, "eager", 128, 2, precision="bf16", autocast=True),
    Case("gpt_neox", "full", False, "sdpa", 128, 1, precision="bf16", autocast=True),
    Case("llama", "dora", False, "sdpa", 128, 1, precision="bf16", autocast=True),
    Case("llama", "qlora", False, "sdpa", 128, 2, precision="bf16", autocast=True),
    Case("llama", "qlora", True, "eager", 128, 1, precision="bf16", autocast=True),
    Case("gpt_neox", "qlora", False, "sdpa", 128, 1, precision="bf16", autocast=True),
    Case("llama", "lora8", False, "sdpa", 128, 1, precision="bf16", autocast=True),
]
"""Thirty-nine configurations: well under a minute on one CPU thread."""

QUICK = [MATRIX[0], MATRIX[7], MATRIX[12], next(case for case in MATRIX if case.answer)]
"""Four configurations for the test suite and --quick: LoRA eager, full+checkpointing SDPA, NeoX
full, and LoRA on instruction data (logits at the answers only)."""


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
        )
    else:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=case.attention, dtype=dtype)
        model.to(device)
    if case.method != "full":
        from peft import LoraConfig, get_peft_model

        targets: Any = case.lora_targets
        if targets != "all-linear":
            targets = [t.strip() for t in targets.split(",") if t.strip()]
        lcfg = LoraConfig(
            r=case.lora_rank,
            lora_alpha=2.0 * case.lora_rank,
            lora_dropout=case.lora_dropout,
            target_modules=targets,
            use_dora=case.method == "dora",
            task_type="CAUSAL_LM",
        )
        if case.method in ("qlora", "lora8") and case.autocast:
            # As the worker does: freezes the base and casts the non-quantized weights to fp32.
            from peft import prepare_model_for_kbit_training

            model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
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


def _storage_key(t) -> tuple[int, int]:
    s = t.untyped_storage()
    return (s.data_ptr(), s.nbytes())


def _tensors_in(obj) -> list:
    import torch

    out = []
    if isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            out.extend(_tensors_in(item))
    elif isinstance(obj, dict):
        for item in obj.values():
            out.extend(_tensors_in(item))
    return out


class _SavedTensorMeter:
    """Records every tensor autograd saves (weakly) so that the live ones can be counted later."""

    def __init__(self) -> None:
        self.refs: list[weakref.ref] = []
        self.hooks = None

    def __enter__(self):
        import torch

        def pack(t):
            try:
                self.refs.append(weakref.ref(t))
            except TypeError:  # pragma: no cover - every torch.Tensor supports weak references
                pass
            return t

        self.hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self.hooks.__exit__(*exc)

    def live(self) -> list:
        return [t for t in (r() for r in self.refs) if t is not None]


def _unique_bytes(tensors, exclude: set) -> tuple[int, set]:
    seen: set = set()
    total = 0
    for t in tensors:
        if t.device.type == "meta":
            continue
        key = _storage_key(t)
        if key in exclude or key in seen or key[1] == 0:
            continue
        seen.add(key)
        total += key[1]
    return total, seen


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
        from backend.training.loss_positions import keep_loss_positions

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
        # What the backward pass holds while it recomputes the last layer: its saved tensors.
        args, kwargs = captured[-1]
        layer = layers[-1]
        layer.gradient_checkpointing = False
        with _SavedTensorMeter() as inner, amp():
            again = layer(*args, **kwargs)
        layer.gradient_checkpointing = True
        held = inner.live()
        for t in _tensors_in(again):
            held += _ctx_held_tensors(t.grad_fn)
        recompute, _ = _unique_bytes(held, static_keys | act_keys | logits_keys | logit_saved_keys)
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

    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
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


# --- comparing --------------------------------------------------------------------------------


def predict(case: Case, device: str = "cpu") -> Breakdown:
    """The estimator's answer for `case` (from the config dict alone, no torch)."""
    return estimate(case.model_config(), case.run_config(), device=device, autocast=case.autocast,
                    target_tokens=case.answer or None)


def rel_error(predicted: int, measured: int) -> float:
    if measured == 0:
        return 0.0 if predicted == 0 else float("inf")
    return (predicted - measured) / measured


STEP_ROWS = ("step_peak_sum", "step_peak_phases")
"""On CUDA only: the allocator's peak for a whole step against the estimate's total (the sum of the
parts) and against its phase-by-phase peak, both less the CUDA context and the allocator slack,
which torch.cuda.max_memory_allocated does not count. Reported, not part of the ±10% goal."""


def compare(case: Case, device: str = "cpu") -> dict[str, tuple[int, int, float]]:
    """{part: (predicted, measured, relative error)} for every part of `case` (and, on CUDA, the
    whole step's peak)."""
    measured = measure(case, device)
    pred = predict(case, device)
    breakdown = pred.breakdown()
    rows = {}
    for part in PARTS:
        if part == "runtime" and device == "cuda":
            continue  # an allowance; the context is shown in the step rows' note instead
        rows[part] = (breakdown[part], measured[part], rel_error(breakdown[part], measured[part]))
    if "cuda_peak_allocated" in measured:
        rt = pred.details["runtime"]
        # Not in the measured peak: the context (outside the allocator), the slack (reserved, not
        # allocated) and the cuBLAS workspace (allocated once, before this case's baseline).
        unseen = rt["cuda_context"] + rt["allocator_slack"] + rt["cublas_workspace"]
        peak = measured["cuda_peak_allocated"]
        for name, value in (("step_peak_sum", pred.total_bytes), ("step_peak_phases", pred.details["peak_phases"]["peak"])):
            rows[name] = (value - unseen, peak, rel_error(value - unseen, peak))
        rows["cuda_context"] = (rt["cuda_context"], measured["cuda_context"], rel_error(rt["cuda_context"], measured["cuda_context"]))
        rows["cuda_preexisting"] = (rt["cublas_workspace"], measured["cuda_preexisting"], rel_error(rt["cublas_workspace"], measured["cuda_preexisting"]))
    return rows


def _fmt(n: int) -> str:
    if n >= 1 << 20:
        return f"{n / (1 << 20):7.2f}M"
    return f"{n / 1024:7.1f}K"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="four configurations only")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--only", default="", help="run only cases whose name contains this text")
    parser.add_argument("--show-ctx", action="store_true", help="print tensors held as autograd ctx attributes")
    args = parser.parse_args(argv)
    global SHOW_CTX
    SHOW_CTX = args.show_ctx

    import logging
    import warnings

    import torch

    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover
        pass
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = [c for c in (QUICK if args.quick else MATRIX) if args.only in c.name]
    if device == "cuda":
        # One-time allocations (cuBLAS workspaces, kernels' scratch) before the first baseline.
        x = torch.randn(256, 256, device="cuda", requires_grad=True)
        (x @ x).sum().backward()
        torch.cuda.synchronize()
        del x
    worst: dict[str, tuple[float, str]] = {}
    start = time.perf_counter()
    failed_cases = []
    for case in cases:
        try:
            rows = compare(case, device)
        except Exception as exc:  # keep going: one broken configuration should not hide the rest
            print(f"\n{case.name}\n  FAILED: {type(exc).__name__}: {exc}")
            failed_cases.append(case.name)
            continue
        print(f"\n{case.name}")
        print(f"  {'part':<18}{'predicted':>10}{'measured':>10}{'error':>9}")
        for part, (pred, meas, err) in rows.items():
            if pred == 0 and meas == 0:
                continue
            goal = part in PARTS
            flag = "" if abs(err) <= TOLERANCE or not goal else "  <-- outside ±10%"
            print(f"  {part:<18}{_fmt(pred):>10}{_fmt(meas):>10}{err:>+9.2%}{flag}")
            if part not in worst or abs(err) > abs(worst[part][0]):
                worst[part] = (err, case.name)
    print(f"\nworst relative error per part over {len(cases)} configurations on {device} ({time.perf_counter() - start:.0f} s):")
    failed = bool(failed_cases)
    for part, (err, name) in worst.items():
        goal = part in PARTS
        ok = abs(err) <= TOLERANCE
        failed |= goal and not ok
        verdict = ("ok  " if ok else "MISS") if goal else "info"
        print(f"  {part:<18}{err:>+9.2%}  {verdict}  ({name})")
    for name in failed_cases:
        print(f"  FAILED to run: {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
