"""Loading a model and tokenizer safely, and putting LoRA adapters on it.

Safety first: no remote code and no pickle weights unless the user ticked them for this model, and
every refusal is one sentence naming the folder and the switch that allows it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import bad_input
from backend.runtime.hub_kernels import LOAD_KWARGS
from backend.training.model.model_check import check_model_folder  # noqa: F401 (re-exported: the jobs import it here)
from backend.training.model.moe import enable_aux_loss, keep_experts_dtype, peft_targets
from backend.training.model.techniques import TechniquePlan
from backend.training.shortcuts.installer import attention_implementation

log = logging.getLogger(__name__)


def load_tokenizer(path: Path, config: RunConfig) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=config.model.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path: Path, config: RunConfig, plan: TechniquePlan) -> Any:
    """Load the base in the plan's dtype, quantized for qlora (NF4, double quant) or lora8 (int8)."""
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    kwargs: dict[str, Any] = {}
    if plan.quantization == "nf4":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=plan.load_dtype if plan.precision != "fp32" else torch.float32,
        )
    elif plan.quantization == "int8":
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    device = rank_device(plan.device)
    if plan.quantization:
        kwargs["device_map"] = {"": device}
    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=plan.load_dtype,
        trust_remote_code=config.model.trust_remote_code,
        use_safetensors=not config.model.allow_pickle,
        attn_implementation=attention_implementation(plan),
        **LOAD_KWARGS,
        **kwargs,
    )
    model.config.use_cache = False
    enable_aux_loss(model, plan.facts)
    return model if plan.quantization else model.to(device)


def rank_device(device: str) -> str:
    """This process's GPU under `accelerate launch` (LOCAL_RANK), else the plan's device: every rank
    loading onto cuda:0 would put all copies on one card, and the Trainer never moves a quantized model."""
    local = os.environ.get("LOCAL_RANK")
    return f"cuda:{int(local)}" if device == "cuda" and local and local.isdigit() else device


def check_lora_rank(model: Any, config: RunConfig) -> None:
    """A rank above an adapted layer's smaller side adds parameters without adding capacity: refuse it.
    A MoE's routers and scalar gates are left out (a router has one output per expert, a shared-expert
    gate one): all-linear adapts them on such models, whatever the rank."""
    from peft.tuners.lora import LoraLayer

    sides = [min(m.in_features, m.out_features) for m in model.modules()
             if isinstance(m, LoraLayer) and type(m).__name__ != "ParamWrapper"
             and isinstance(m.in_features, int) and isinstance(m.out_features, int)]
    smallest = min((side for side in sides if side > 1), default=None)
    if smallest is not None and config.technique.lora_rank > smallest:
        raise bad_input(
            f"technique.lora_rank {config.technique.lora_rank} is larger than the smallest adapted layer "
            f"({smallest}); pick {smallest} or less"
        )


def add_adapters(model: Any, config: RunConfig, plan: TechniquePlan) -> Any:
    """LoRA or DoRA adapters on a frozen base; for method full, every weight stays trainable."""
    technique = config.technique
    if technique.method == "full":
        model.requires_grad_(True)
        return model
    from peft import get_peft_model

    from backend.core.runs.start_adapter import start_adapter_folder
    from backend.training.model.start_adapter import load_start_adapter

    model, lora = adapter_config(model, config, plan)
    start = start_adapter_folder(config)
    if start is not None:  # model.adapter: keep training an earlier run's adapter
        return check_adapters(load_start_adapter(model, start), config)
    try:
        model = get_peft_model(model, lora)
    except ValueError as exc:
        first = str(exc).splitlines()[0]
        raise bad_input(f"technique.lora_targets: {first}", "use all-linear or names like q_proj,v_proj") from None
    return check_adapters(model, config)


def adapter_config(model: Any, config: RunConfig, plan: TechniquePlan) -> tuple[Any, Any]:
    """-> (the base, prepared for adapters, and the peft LoraConfig to wrap it with; None for method full).
    The TRL trainers wrap it themselves: their reference is then the base with the adapters off."""
    from peft import LoraConfig, prepare_model_for_kbit_training

    technique = config.technique
    if technique.method == "full":  # no adapter: every weight trains, and TRL loads a frozen reference copy
        return model.requires_grad_(True), None
    if plan.quantization:
        # Casts norms to fp32 and freezes the quantized base; checkpointing is set by the Trainer.
        # A MoE's unquantized fused experts keep their dtype (moe.py).
        model = keep_experts_dtype(model, lambda m: prepare_model_for_kbit_training(m, use_gradient_checkpointing=False))
    targets = peft_targets(technique.lora_targets, model.config.model_type)
    lora = LoraConfig(
        r=technique.lora_rank,
        lora_alpha=technique.lora_alpha,
        lora_dropout=technique.lora_dropout,
        target_modules=targets,
        use_dora=technique.method == "dora",
        # GPT-2's Conv1D holds its weights (in, out): peft must know, and would only warn and switch
        fan_in_fan_out=any(type(m).__name__ == "Conv1D" for m in model.modules()),
        task_type="CAUSAL_LM",
    )
    return model, lora


def check_adapters(model: Any, config: RunConfig) -> Any:
    """Refuse a rank the adapted layers cannot use, and log what trains."""
    technique = config.technique
    check_lora_rank(model, config)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    log.info("%s r=%d: %d trainable of %d parameters (%.2f%%)", technique.method, technique.lora_rank,
             trainable, total, 100 * trainable / max(total, 1))
    return model
