"""TechniquePlan: what the chosen techniques become on this machine, decided before anything loads.

A combination that cannot run here is refused with one sentence naming the option, why, and what
to pick instead; where a faithful fallback exists (paged 8-bit Adam without CUDA pages) it is used
and reported. bitsandbytes is probed by quantizing a small tensor, not assumed from its version.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from dataclasses import dataclass, field

import torch

from backend.config import RunConfig
from backend.cpu_features import bf16_base as cpu_bf16_base
from backend.cpu_features import native_bf16
from backend.errors import JobError
from backend.protocol import Capabilities
from backend.training.shortcuts import ShortcutChoice, Situation, choose
from backend.training.model_facts import ModelFacts
from backend.training.moe import moe_notes

log = logging.getLogger(__name__)

OPTIMIZERS = {"adamw": "adamw_torch", "adamw_8bit": "adamw_bnb_8bit", "paged_adamw_8bit": "paged_adamw_8bit"}


@dataclass
class TechniquePlan:
    device: str
    precision: str  # bf16 | fp16 | fp32: the compute dtype of forward and backward
    load_dtype: torch.dtype
    attention: str
    optimizer: str  # a TrainingArguments.optim name
    quantization: str | None  # nf4 | int8 | None
    notes: list[str] = field(default_factory=list)
    # CPU, precision auto, LoRA: the frozen base's weights held in bf16 and its products run in bf16
    # (adapters, activations, loss and optimizer stay fp32); see lora_matmul.py.
    bf16_base: bool = False
    facts: ModelFacts = field(default_factory=ModelFacts.unknown)
    shortcuts: ShortcutChoice = field(default_factory=lambda: ShortcutChoice("off", ""))
    aux_loss: bool = False  # a MoE's router load-balancing loss is added to the training loss

    def summary(self) -> str:
        precision = self.precision + (" (base products bf16)" if self.bf16_base else "")
        parts = [f"device {self.device}", f"precision {precision}", f"attention {self.attention or 'default'}",
                 f"optimizer {self.optimizer}"]
        if self.quantization:
            parts.append(f"base weights {self.quantization}")
        parts.append(self.shortcuts.summary())
        return ", ".join(parts) + ("; " + "; ".join(self.notes) if self.notes else "")


def refuse(field_name: str, why: str, instead: str) -> JobError:
    return JobError("bad_input", f"technique.{field_name}: {why}", instead)


@functools.lru_cache(maxsize=4)
def bnb_can(feature: str, device: str) -> str | None:
    """None when bitsandbytes does `feature` on `device`, else the reason it cannot."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed"
    try:
        import bitsandbytes.functional as F

        x = torch.randn(64, 64, device=device, dtype=torch.float32)
        if feature == "nf4":
            q, state = F.quantize_4bit(x, quant_type="nf4", compress_statistics=True)
            error = (F.dequantize_4bit(q, state) - x).abs().max().item()
            return None if error < 1.0 else f"its NF4 round trip is wrong (max error {error:.2f})"
        if feature == "int8":
            import bitsandbytes as bnb

            layer = bnb.nn.Linear8bitLt(64, 64, has_fp16_weights=False, threshold=6.0)
            layer = layer.to(device)
            layer(x.to(torch.float16 if device == "cuda" else torch.float32))
            return None
        if feature == "adam8":
            import bitsandbytes as bnb

            p = torch.nn.Parameter(torch.randn(4096, device=device))
            opt = bnb.optim.Adam8bit([p], lr=1e-3)
            p.grad = torch.randn_like(p)
            opt.step()
            return None
    except Exception as exc:  # the probe exists to catch whatever this backend lacks
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return f"unknown feature {feature}"


def _precision(config: RunConfig, caps: Capabilities, device: str) -> str:
    asked = config.technique.precision
    if asked == "auto":
        if device == "cuda":
            return "bf16" if caps.bf16 else "fp16"
        return "fp32"
    if asked == "fp16" and device == "cpu":
        raise refuse("precision", "fp16 with loss scaling needs a CUDA GPU", "pick bf16 or fp32 on the CPU")
    if asked == "bf16" and device == "cuda" and not caps.bf16:
        raise refuse("precision", "this GPU has no bf16 support", "pick fp16 (with loss scaling) or fp32")
    return asked


def _attention(config: RunConfig, caps: Capabilities, device: str, precision: str, facts: ModelFacts,
               notes: list[str]) -> str:
    """The attention kernel, asking the model's class what it supports; "" leaves it to transformers
    (a class that cannot be resolved before loading: remote code)."""
    asked = config.technique.attention
    flash_ok = device == "cuda" and caps.flash_attn and precision in ("bf16", "fp16")
    if asked == "flash_attention_2":
        if device != "cuda":
            raise refuse("attention", "flash_attention_2 needs a CUDA GPU", "pick sdpa (or auto) on this machine")
        if not caps.flash_attn:
            raise refuse("attention", "flash_attention_2 needs the flash-attn package, which is not installed",
                         "install the gpu extra, or pick sdpa")
        if precision == "fp32":
            raise refuse("attention", "flash_attention_2 runs only in bf16 or fp16", "set precision bf16, or attention sdpa")
        if facts.known and not facts.supports_flash_attn:
            raise refuse("attention", f"{facts.name} does not support flash_attention_2 (transformers refuses it)",
                         "pick auto, or " + ("sdpa" if facts.supports_sdpa else "eager"))
        return asked
    if asked == "sdpa" and facts.known and not facts.supports_sdpa:
        raise refuse("attention", f"{facts.name} does not support sdpa (transformers refuses it"
                     + (", as its attention logits are soft-capped)" if facts.attention_softcapping else ")"),
                     "pick eager, or auto (which picks eager for it)")
    if asked == "auto":
        if not facts.known:
            notes.append("attention auto -> transformers' default (the model's class is not known before loading)")
            return ""
        if flash_ok and facts.supports_flash_attn:
            notes.append("attention auto -> flash_attention_2 (installed and usable)")
            return "flash_attention_2"
        if not facts.supports_sdpa:
            notes.append(f"attention auto -> eager ({facts.name} does not support SDPA; transformers falls back the same way)")
            return "eager"
        why = ("no CUDA" if device != "cuda" else "flash-attn not installed" if not caps.flash_attn
               else f"{facts.name} does not support it" if not facts.supports_flash_attn else "fp32")
        notes.append(f"attention auto -> sdpa ({why})")
        return "sdpa"
    return asked


def plan_techniques(config: RunConfig, caps: Capabilities, facts: ModelFacts | None = None,
                    world_size: int | None = None, threads: int | None = None) -> TechniquePlan:
    """Decide everything that depends on the machine and the model's class (read from its config.json,
    no weights); raise JobError for what cannot run here."""
    t = config.technique
    device = "cuda" if caps.cuda else "cpu"
    if facts is None:
        facts = ModelFacts.read(config.resolved_model_path(), config.model.trust_remote_code)
    notes: list[str] = []
    precision = _precision(config, caps, device)
    attention = _attention(config, caps, device, precision, facts, notes)

    quantization = None
    if t.method == "qlora":
        reason = bnb_can("nf4", device)
        if reason:
            raise refuse("method", f"qlora needs bitsandbytes 4-bit on {device}, and here {reason}",
                         "pick lora (16-bit base) instead")
        quantization = "nf4"
    elif t.method == "lora8":
        reason = bnb_can("int8", device)
        if reason:
            raise refuse("method", f"lora8 needs bitsandbytes LLM.int8 on {device}, and here {reason}",
                         "pick qlora or lora instead")
        quantization = "int8"

    optimizer = OPTIMIZERS[t.optimizer]
    if t.optimizer == "adamw" and config.hardware.strategy in ("single", "ddp"):
        # One kernel per step instead of ~10 ops per tensor: 1.75 -> 0.30 ms a step on the preset's
        # 56 adapter tensors (1 CPU thread); the Trainer's own default since torch 2.8. Sharded and
        # DeepSpeed strategies keep the per-tensor AdamW their optimizer wrapping expects.
        optimizer = "adamw_torch_fused"
    if t.optimizer != "adamw":
        reason = bnb_can("adam8", device)
        if reason:
            raise refuse("optimizer", f"{t.optimizer} needs bitsandbytes' 8-bit Adam, and here {reason}",
                         "pick adamw")
        if t.optimizer == "paged_adamw_8bit" and device != "cuda":
            optimizer = OPTIMIZERS["adamw_8bit"]
            notes.append("paged_adamw_8bit -> adamw_8bit (paging needs CUDA unified memory; same maths)")

    if t.offload != "none":
        if device != "cuda":
            raise refuse("offload", "DeepSpeed offload needs a CUDA GPU", "set offload: none on this machine")
        if importlib.util.find_spec("deepspeed") is None:
            raise JobError("missing_dependency", "technique.offload: DeepSpeed is not installed",
                           "pip install -e '.[gpu]', or set offload: none")

    if t.liger_kernel:
        if device != "cuda":
            raise refuse("liger_kernel", "Liger's fused kernels are Triton kernels and need a CUDA GPU",
                         "turn liger_kernel off on this machine")
        if importlib.util.find_spec("liger_kernel") is None:
            raise JobError("missing_dependency", "technique.liger_kernel: the liger-kernel package is not installed",
                           "pip install liger-kernel, or turn liger_kernel off")

    if t.torch_compile and device != "cuda":
        # Measured here: 140 s to compile the bundled model on the CPU, then ~2 tokens/s as every
        # new packed-batch length recompiles. Not an option worth offering on the CPU.
        raise refuse("torch_compile", "torch.compile on the CPU compiles for minutes and recompiles for each new "
                     "batch shape, so it runs slower than without", "turn torch_compile off on this machine")

    if t.method == "full" and precision == "fp16":
        raise refuse("precision", "full fine-tuning with fp16 weights cannot take optimizer steps in fp16",
                     "pick bf16 or fp32 for method full")

    # Weights are loaded in the compute dtype for adapters (the base is frozen), but full tuning
    # keeps fp32 master weights so that small updates are not rounded away (the 16 bytes/param).
    if t.method == "full":
        load_dtype = torch.float32
    else:
        load_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    notes += moe_notes(config, facts)  # refuses what peft cannot do with fused experts, before loading
    aux_loss = facts.moe and facts.router_aux_loss_coef > 0
    situation = Situation(
        device=device, precision=precision, method=t.method, attention=attention, packing=t.packing,
        torch_compile=t.torch_compile, liger_kernel=t.liger_kernel, strategy=config.hardware.strategy,
        world_size=int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size,
        cpu_threads=config.train.cpu_threads, threads=torch.get_num_threads() if threads is None else threads,
        bf16_base=cpu_bf16_base(config, device, device == "cpu" and native_bf16()), facts=facts, aux_loss=aux_loss,
        native_bf16=device == "cpu" and native_bf16())
    choice = choose(situation, t.shortcuts)
    bf16_base = choice.has("bf16_base")
    if bf16_base:
        notes.append("precision auto -> fp32, with the frozen base's products in bf16 (this CPU multiplies "
                     "bf16 natively); set precision fp32 to keep them fp32")
    plan = TechniquePlan(device, precision, load_dtype, attention, optimizer, quantization, notes, bf16_base,
                         facts, choice, aux_loss)
    log.info("technique plan: %s", plan.summary())
    return plan
