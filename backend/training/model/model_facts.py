"""ModelFacts: what the plan must know about a model before loading it, read from config.json alone.

The attention choice and the speed shortcuts depend on the model's class (does it accept SDPA, or
FlashAttention-2?) and on its family (a shortcut is used only where a test proved it exact there).
The class is resolved as `AutoModelForCausalLM` would resolve it, through transformers' auto mapping
of the config's type, without reading a weight; a folder whose class cannot be resolved (remote
code, an unknown model type) gives `known=False`, and then the plan leaves the attention to
transformers' own default and runs no shortcut.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Config attributes that hold a family's mixture-of-experts size (experts, experts per token).
_EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")
_ACTIVE = ("num_experts_per_tok", "moe_top_k", "top_k")


@dataclass(frozen=True)
class ModelFacts:
    known: bool = False
    model_type: str = ""
    class_name: str = ""
    supports_sdpa: bool = True
    supports_flash_attn: bool = True
    hidden_size: int = 0
    num_layers: int = 0
    num_experts: int = 0  # 0 for a dense model
    experts_per_token: int = 0
    sliding_window: bool = False  # some layers attend within a window
    attention_softcapping: bool = False
    router_aux_loss_coef: float = 0.0

    @property
    def moe(self) -> bool:
        return self.num_experts > 0

    @property
    def name(self) -> str:
        return self.class_name or self.model_type or "this model"

    @classmethod
    def unknown(cls) -> "ModelFacts":
        return cls()

    @classmethod
    def read(cls, path: Path, trust_remote_code: bool = False) -> "ModelFacts":
        """The facts of the model folder at `path`; unknown (never an error) where they cannot be read."""
        if not (Path(path) / "config.json").is_file():
            return cls.unknown()
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        except Exception as exc:  # an unreadable config is check_model_folder's to report, not ours
            log.info("model facts: config of %s not read (%s)", path, exc)
            return cls.unknown()
        return cls.of_config(config)

    @classmethod
    def of_config(cls, config: Any) -> "ModelFacts":
        model_class = causal_lm_class(config)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        experts = next((int(getattr(text, a)) for a in _EXPERTS if getattr(text, a, None)), 0)
        active = next((int(getattr(text, a)) for a in _ACTIVE if getattr(text, a, None)), 0)
        return cls(
            known=model_class is not None,
            model_type=str(getattr(config, "model_type", "") or ""),
            class_name=model_class.__name__ if model_class is not None else "",
            supports_sdpa=bool(getattr(model_class, "_supports_sdpa", True)),
            supports_flash_attn=bool(getattr(model_class, "_supports_flash_attn", False)),
            hidden_size=int(getattr(text, "hidden_size", 0) or getattr(text, "n_embd", 0) or 0),
            num_layers=int(getattr(text, "num_hidden_layers", 0) or getattr(text, "n_layer", 0) or 0),
            num_experts=experts,
            experts_per_token=active if experts else 0,
            sliding_window=bool(getattr(text, "sliding_window", None) or getattr(text, "attention_chunk_size", None)),
            attention_softcapping=bool(getattr(text, "attn_logit_softcapping", None)),
            router_aux_loss_coef=float(getattr(text, "router_aux_loss_coef", 0.0) or 0.0) if experts else 0.0,
        )


def causal_lm_class(config: Any) -> type | None:
    """The class `AutoModelForCausalLM.from_config` would build, or None (remote code, unknown type)."""
    if getattr(config, "auto_map", None) and "AutoModelForCausalLM" in config.auto_map:
        return None  # the model's own code: not importable without running it
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        return MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except (KeyError, ImportError, AttributeError):
        return None
