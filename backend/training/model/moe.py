"""Mixture-of-experts specifics of a LoRA run, decided before loading and said in the plan line.

transformers 5 holds a MoE layer's experts as fused 3-D parameters (`mlp.experts.gate_up_proj`,
`mlp.experts.down_proj`), not as nn.Linear modules. Two consequences a person must be told of:
- peft 0.21 maps `all-linear` on some MoE families (Mixtral, Qwen3-MoE and others converted from
  transformers 4's layout) to the attention, the router and the fused experts, the experts through
  `target_parameters` (its ParamWrapper, which has no dropout and no DoRA, and which folds W + B@A
  into a fresh copy of every layer's experts on each forward pass: a whole layer of expert weights
  saved per layer); on others (Qwen2-MoE) `all-linear` finds only the attention and the shared
  expert. Which one applies is read from peft's own conversion table. The studio's `all-linear`
  on the first kind is the attention only, so that the default fits and exports merged; naming
  the experts' projections in lora_targets still adapts them, as peft does.
- bitsandbytes quantizes nn.Linear only, so under qlora/lora8 the fused experts stay in the load
  dtype (bitsandbytes issue #1849), and peft's `prepare_model_for_kbit_training` would upcast them
  to fp32; loading.py casts them back.
The router's load-balancing loss is part of the training loss (the model's own `aux_loss`, as in
pre-training), so that fine-tuning does not collapse the routing.
"""

from __future__ import annotations

from typing import Any

from backend.core.config.run_config import RunConfig
from backend.core.errors import JobError
from backend.training.model.model_facts import ModelFacts

ATTENTION_TARGETS = "q_proj,k_proj,v_proj,o_proj"
EXPERT_NAMES = frozenset({"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3", "experts"})
"""lora_targets names that peft maps onto the fused experts of the families it converts."""


def all_linear_takes_experts(model_type: str) -> bool | None:
    """Whether peft resolves `all-linear` on this family to its fused experts too; None if unknown."""
    try:
        from peft.utils.transformers_weight_conversion import _MODEL_TO_CONVERSION_PATTERN, _MOE_TARGET_MODULE_MAPPING
    except ImportError:
        return None
    return _MODEL_TO_CONVERSION_PATTERN.get(model_type) in _MOE_TARGET_MODULE_MAPPING


def peft_targets(lora_targets: str, model_type: str) -> Any:
    """What `technique.lora_targets` gives peft's LoraConfig.target_modules: all-linear (the attention
    only where peft would take the fused experts), or the named modules."""
    if lora_targets.strip() == "all-linear":
        return ATTENTION_TARGETS.split(",") if all_linear_takes_experts(model_type) else "all-linear"
    return [t.strip() for t in lora_targets.split(",") if t.strip()]


def experts_targeted(lora_targets: str, model_type: str) -> bool:
    """Whether peft will put ParamWrapper adapters on this family's fused experts."""
    targets = peft_targets(lora_targets, model_type)
    return bool(all_linear_takes_experts(model_type)) and not isinstance(targets, str) and \
        any(t.rsplit(".", 1)[-1] in EXPERT_NAMES for t in targets)


def moe_notes(config: RunConfig, facts: ModelFacts) -> list[str]:
    """The plan's sentences about a MoE's experts; refuses what peft cannot do with them."""
    if not facts.moe:
        return []
    t = config.technique
    notes: list[str] = []
    experts = experts_targeted(t.lora_targets, facts.model_type)
    if t.method != "full" and experts:
        if t.method == "dora":
            raise JobError("bad_input", f"technique.method: dora cannot adapt {facts.name}'s fused experts, which "
                           "technique.lora_targets names (peft adapts them as parameters, without DoRA)",
                           f"pick lora, or set technique.lora_targets to all-linear or {ATTENTION_TARGETS}")
        if t.lora_dropout:
            raise JobError("bad_input", f"technique.lora_dropout: peft adapts {facts.name}'s fused experts, which "
                           "technique.lora_targets names, without dropout",
                           "set lora_dropout 0, or lora_targets all-linear")
        notes.append(f"lora_targets adapts {facts.name}'s {facts.num_experts} fused experts (peft target_parameters: "
                     "a fresh copy of each layer's experts per step; exports merge it into every expert)")
    elif t.method != "full" and t.lora_targets == "all-linear" and all_linear_takes_experts(facts.model_type):
        notes.append(f"all-linear on {facts.name} adapts the attention ({ATTENTION_TARGETS}), not the "
                     f"{facts.num_experts} fused experts: peft would merge a fresh copy of each layer's experts on "
                     "every step; name gate_proj,up_proj,down_proj in lora_targets to adapt them")
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
