"""TechniquePlan: what the chosen techniques become on this machine, decided before anything loads.

A combination that cannot run here is refused with one sentence naming the option, why, and what
to pick instead; where a faithful fallback exists (paged 8-bit Adam without CUDA pages) it is used
and reported. The rules are backend.estimate.feasibility's, the same the studio shows before Start; here
bitsandbytes is probed by quantizing a small tensor, not assumed from its version.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
from dataclasses import dataclass, field

import torch

from backend.core.config.run_config import RunConfig
from backend.core.cpu_features import bf16_base as cpu_bf16_base
from backend.core.cpu_features import native_bf16
from backend.core.errors import JobError
from backend.estimate.families import load_model_config
from backend.estimate.feasibility import blocker, resolved_precision, verdicts
from backend.core.protocol import Capabilities
from backend.core.registries.shortcuts import ShortcutChoice, Situation, choose
from backend.training.model.model_facts import ModelFacts
from backend.training.model.moe import moe_notes

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


def _attention(config: RunConfig, caps: Capabilities, device: str, precision: str, facts: ModelFacts,
               notes: list[str]) -> str:
    """The attention kernel for `auto`, asking the model's class what it supports; "" leaves it to
    transformers (a class that cannot be resolved before loading: remote code). An explicit choice
    that cannot run was refused by backend.estimate.feasibility already."""
    asked = config.technique.attention
    flash_ok = device == "cuda" and caps.flash_attn and precision in ("bf16", "fp16")
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


def _model_config(config: RunConfig) -> dict | None:
    """config.json as a dict for the feasibility rules; None where it cannot be read (check_model_folder
    reports that)."""
    try:
        return load_model_config(config.resolved_model_path())
    except ValueError:
        return None


def plan_techniques(config: RunConfig, caps: Capabilities, facts: ModelFacts | None = None,
                    world_size: int | None = None, threads: int | None = None,
                    image_rows: bool = False) -> TechniquePlan:
    """Decide everything that depends on the machine and the model's class (read from its config.json,
    no weights); raise JobError for what cannot run here. `image_rows`: the run trains through the vision
    door (`takes_door` in backend/training/vision/door.py), which has shortcuts of its own."""
    t = config.technique
    device = "cuda" if caps.cuda else "cpu"
    if facts is None:
        facts = ModelFacts.read(config.resolved_model_path(), config.model.trust_remote_code)
    notes: list[str] = []
    # The rules the studio shows before Start (backend.estimate.feasibility), with the real bitsandbytes probe.
    found = verdicts(config, _model_config(config), caps, probe=bnb_can, facts=facts)
    first = blocker(found)
    if first is not None:
        raise JobError(first.kind, first.message(), first.fix)
    downgraded = {v.field: v for v in found if v.downgrade_to is not None}
    precision = resolved_precision(config, caps)
    attention = _attention(config, caps, device, precision, facts, notes)
    quantization = {"qlora": "nf4", "lora8": "int8"}.get(t.method)

    optimizer = OPTIMIZERS[t.optimizer]
    if t.optimizer == "adamw" and config.hardware.strategy in ("single", "ddp"):
        # One kernel per step instead of ~10 ops per tensor: 1.75 -> 0.30 ms a step on the preset's
        # 56 adapter tensors (1 CPU thread); the Trainer's own default since torch 2.8. Sharded and
        # DeepSpeed strategies keep the per-tensor AdamW their optimizer wrapping expects.
        optimizer = "adamw_torch_fused"
    if "technique.optimizer" in downgraded:  # paged_adamw_8bit without CUDA pages
        optimizer = OPTIMIZERS[downgraded["technique.optimizer"].downgrade_to or t.optimizer]
        notes.append(downgraded["technique.optimizer"].reason)

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
        native_bf16=device == "cpu" and native_bf16(), checkpointing=t.gradient_checkpointing,
        activation_offload=t.activation_offload, image_rows=image_rows)
    # The shortcuts were proven exact for the supervised loss only; DPO and KTO run TRL's plain computation.
    choice = choose(situation, t.shortcuts if t.objective == "sft" else "off")
    if t.objective != "sft":
        notes.append(objective_note(config))
    bf16_base = choice.has("bf16_base")
    if bf16_base:
        notes.append("precision auto -> fp32, with the frozen base's products in bf16 (this CPU multiplies "
                     "bf16 natively); set precision fp32 to keep them fp32")
    plan = TechniquePlan(device, precision, load_dtype, attention, optimizer, quantization, notes, bf16_base,
                         facts, choice, aux_loss)
    log.info("technique plan: %s", plan.summary())
    return plan


def objective_note(config: RunConfig) -> str:
    """The plan line's word on a TRL objective: how batches are built and what the reference model is."""
    objective, method = config.technique.objective, config.technique.method
    if objective == "grpo" and config.grpo.beta == 0:
        reference = "no reference pass (grpo.beta 0)"
    elif method == "full":
        reference = "reference: a frozen copy of the base, loaded beside the model"
    else:
        reference = "reference: the base with the adapter off (no second copy)"
    batches = {"dpo": "pairs padded per batch", "kto": "labelled answers padded per batch",
               "grpo": "completions generated per batch"}[objective]
    return f"objective {objective}: {batches} (no packing), speed shortcuts off; {reference}"
