"""Mixture-of-experts specifics of a LoRA run, decided before loading and said in the plan line.

transformers 5 holds a MoE layer's experts as fused 3-D parameters (`mlp.experts.gate_up_proj`,
`mlp.experts.down_proj`), not as nn.Linear modules. Two consequences a person must be told of:
- peft 0.21 maps `all-linear` on some MoE families (Mixtral, Qwen3-MoE and others converted from
  transformers 4's layout) to the attention, the router and the fused experts, the experts through
  `target_parameters` (its ParamWrapper, which has no dropout and no DoRA); on others (Qwen2-MoE)
  `all-linear` finds only the attention and the shared expert. Which one applies is read from
  peft's own conversion table.
- bitsandbytes quantizes nn.Linear only, so under qlora/lora8 the fused experts stay in the load
  dtype (bitsandbytes issue #1849), and peft's `prepare_model_for_kbit_training` would upcast them
  to fp32; loading.py casts them back.
The router's load-balancing loss is part of the training loss (the model's own `aux_loss`, as in
pre-training), so that fine-tuning does not collapse the routing.
"""

from __future__ import annotations

from typing import Any

from backend.config import RunConfig
from backend.errors import JobError
from backend.training.model_facts import ModelFacts

ATTENTION_TARGETS = "q_proj,k_proj,v_proj,o_proj"


def all_linear_takes_experts(model_type: str) -> bool | None:
    """Whether peft resolves `all-linear` on this family to its fused experts too; None if unknown."""
    try:
        from peft.utils.transformers_weight_conversion import _MODEL_TO_CONVERSION_PATTERN, _MOE_TARGET_MODULE_MAPPING
    except ImportError:
        return None
    return _MODEL_TO_CONVERSION_PATTERN.get(model_type) in _MOE_TARGET_MODULE_MAPPING


def moe_notes(config: RunConfig, facts: ModelFacts) -> list[str]:
    """The plan's sentences about a MoE's experts; refuses what peft cannot do with them."""
    if not facts.moe:
        return []
    t = config.technique
    notes: list[str] = []
    experts = all_linear_takes_experts(facts.model_type) if t.lora_targets == "all-linear" else False
    if t.method != "full" and experts:
        if t.method == "dora":
            raise JobError("bad_input", f"technique.method: dora cannot adapt {facts.name}'s fused experts, which "
                           "all-linear targets (peft adapts them as parameters, without DoRA)",
                           f"pick lora, or set technique.lora_targets to {ATTENTION_TARGETS}")
        if t.lora_dropout:
            raise JobError("bad_input", f"technique.lora_dropout: peft adapts {facts.name}'s fused experts, which "
                           "all-linear targets, without dropout", f"set lora_dropout 0, or lora_targets {ATTENTION_TARGETS}")
        notes.append(f"all-linear on {facts.name} adapts the attention, the router and the {facts.num_experts} fused "
                     "experts (peft target_parameters: mlp.experts.gate_up_proj at rank 2r, mlp.experts.down_proj)")
    elif t.method != "full" and t.lora_targets == "all-linear":
        notes.append(f"all-linear on {facts.name} adapts the attention and any shared expert, not the "
                     f"{facts.num_experts} routed experts (peft 0.21 does not map this family's fused experts)")
    if t.method in ("qlora", "lora8"):
        notes.append(f"{t.method} quantizes nn.Linear layers only: the fused experts stay unquantized in the load "
                     "dtype (bitsandbytes #1849)")
    if facts.router_aux_loss_coef > 0:
        notes.append(f"router aux loss on (x{facts.router_aux_loss_coef:g})")
    return notes


def keep_experts_dtype(model: Any, prepare: Any) -> Any:
    """Run peft's `prepare_model_for_kbit_training` without its upcast of the unquantized fused experts
    to fp32 (twice their bf16 memory, the bulk of a MoE); norms and embeddings are upcast as peft does."""
    experts = {name: p.dtype for name, p in model.named_parameters() if p.dim() == 3}
    model = prepare(model)
    for name, param in model.named_parameters():
        if name in experts and param.dtype != experts[name]:
            param.data = param.data.to(experts[name])
    return model


def enable_aux_loss(model: Any, facts: ModelFacts) -> None:
    """The router's load-balancing loss in the training loss (the config's own switch)."""
    if facts.moe and facts.router_aux_loss_coef > 0 and hasattr(model.config, "output_router_logits"):
        model.config.output_router_logits = True
