"""Which models a calibrated export takes, decided from config.json before anything loads: the calibrated
formats' refusal door (backend/core/registries/export_formats.py). Torch-free."""

from __future__ import annotations

import importlib.util
from typing import Any

from backend.core.registries.export_formats import CALIBRATED, CALIBRATED_VISION
from backend.core.registries.vision_families import BY_MODEL_TYPE

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
"""model_types whose decoder layers are plain nn.Linear layers behind named norms (layers.py); tested on
llama, qwen2 and gemma3_text."""
REASONS = {
    "gpt2": "GPT-2 keeps its weights in Conv1D layers (transposed), which compressed-tensors does not quantize "
            "and vLLM would load transposed",
}


def refusal(fmt: str, config: dict[str, Any]) -> str:
    """Why `fmt` cannot be written for a model with this config.json ("" when it can)."""
    if fmt not in CALIBRATED:
        return ""
    if importlib.util.find_spec("compressed_tensors") is None:
        return "the compressed-tensors package is not installed"
    model_type = config.get("model_type", "?")
    family = BY_MODEL_TYPE.get(model_type) if isinstance(config.get("vision_config"), dict) else None
    if family is not None:  # a VLM: its language model's layers are calibrated on image rows (vision_capture.py)
        if not family.calibrated_layers:
            return (f"model_type {model_type}: calibrated exports of a {family.label} vision-language model are not "
                    f"proven (proven: {', '.join(CALIBRATED_VISION)})")
        config = config.get("text_config") or {}  # experts are the language model's
    if model_type in REASONS:
        return f"model_type {model_type}: {REASONS[model_type]}"
    if any(config.get(k) for k in ("num_experts", "num_local_experts", "n_routed_experts")):
        return f"model_type {model_type} routes to experts whose weights are not nn.Linear layers"
    if model_type not in ARCHITECTURES and family is None:
        return f"model_type {model_type} is not one of {', '.join(ARCHITECTURES)}"
    return ""


def refuse(fmt: str, run: Any) -> None:
    """JobError in one line when `fmt` cannot be written for this run's model (nothing is loaded)."""
    from backend.core.errors import JobError
    from backend.export.checkpoint_files import read_config

    problem = refusal(fmt, read_config(run.weights_dir if run.full else run.base_path))
    if problem:
        raise JobError("bad_input", f"{fmt}: {problem}", "export merged, gguf-q8_0 or gguf-q4_0 instead")
