"""The published config.json of real models (tests/fixtures/model_configs), to check estimates at real sizes.

No weights: `meta_model` builds the transformers model on the meta device, so even a 70 B model costs no
memory. Where each file came from, and the parameter count it gives, is in the folder's README.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIGS_DIR = Path(__file__).resolve().parent / "fixtures" / "model_configs"


def names() -> list[str]:
    """Fixture folders, named `<org>--<name>` after the hub repository."""
    return sorted(p.name for p in CONFIGS_DIR.iterdir() if (p / "config.json").is_file())


def load(name: str) -> dict[str, Any]:
    """The config.json of one fixture, as published."""
    return json.loads((CONFIGS_DIR / name / "config.json").read_text(encoding="utf-8"))


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The causal-LM part: a multimodal config keeps its language model under text_config."""
    return cfg["text_config"] if "text_config" in cfg else cfg


def meta_model(name: str, text_only: bool = True):
    """The transformers causal LM of one fixture, built on the meta device (no memory, no weights).
    text_only=False builds what AutoModelForCausalLM loads from the whole file (a multimodal config:
    its vision tower too, as training loads it; a family AutoModelForCausalLM does not take, such as
    Qwen2.5-VL or LLaVA, is built by AutoModelForImageTextToText)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    cfg = dict(text_config(load(name)) if text_only else load(name))
    config = AutoConfig.for_model(**cfg)
    with torch.device("meta"):
        try:
            return AutoModelForCausalLM.from_config(config)
        except ValueError:
            if text_only:
                raise
            return AutoModelForImageTextToText.from_config(config)


def parameter_count(model) -> int:
    """Parameters as transformers holds them; tied weights are one Parameter and so count once."""
    return sum(p.numel() for p in model.parameters())
