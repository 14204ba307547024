"""Parameters of each part of a vision-language model: vision tower, projector, language model (and
Gemma 4's audio tower), counted on the meta device from config.json alone: no weights, no memory.

The parts are the prefixes `backend/core/registries/vision_families.py` names, so the count follows
the model transformers builds, not a formula of ours. Run as a module (`python -m
backend.training.model.vision_parts FOLDER`) it prints them as one JSON object: the facade
(`backend/api/vision.py`) runs it in a subprocess, so the studio never imports torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from backend.core.registries.vision_families import BY_MODEL_TYPE, VisionFamily

TOWER, PROJECTOR, LANGUAGE = "vision tower", "projector", "language model"


def meta_model(config: dict[str, Any]):
    """The model AutoModelForImageTextToText builds from `config`, on the meta device."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    raw = {k: v for k, v in config.items() if k not in ("transformers_version", "_name_or_path", "auto_map")}
    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(AutoConfig.for_model(**raw))


def part_of(name: str, family: VisionFamily) -> str:
    """Which part a parameter belongs to; the projector's prefixes win over the tower's (Qwen's merger)."""
    if name.startswith(family.projector):
        return PROJECTOR
    if name.startswith(family.tower):
        return TOWER
    for label, prefixes in family.other:
        if name.startswith(prefixes):
            return label
    return LANGUAGE


def count_parts(config: dict[str, Any]) -> dict[str, int]:
    """Parameters per part, tied weights once (named_parameters yields a shared tensor once)."""
    family = BY_MODEL_TYPE.get(str(config.get("model_type")))
    if family is None:
        raise ValueError(f"model_type {config.get('model_type')!r} is not a proven vision-language family")
    counts = {TOWER: 0, PROJECTOR: 0, LANGUAGE: 0}
    for name, parameter in meta_model(config).named_parameters():
        part = part_of(name, family)
        counts[part] = counts.get(part, 0) + parameter.numel()
    return counts


def main(argv: list[str]) -> int:
    """Print {"parts": {...}} for the folder in argv[0], or {"error": "..."} (exit 1)."""
    try:
        folder = Path(argv[0])
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        print(json.dumps({"parts": count_parts(config)}))
        return 0
    except Exception as exc:  # one line back to the caller, never a traceback on its stdout
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
