"""Parameters outside the text decoder of a multimodal config (Gemma 3's SigLIP vision tower).

AutoModelForCausalLM builds the whole model (Gemma3ForConditionalGeneration), so its weights are
held even when only text is trained; a text-only step never runs the tower, so it adds no
activations, and its parameters get no gradients (AdamW keeps no state for them).
"""

from __future__ import annotations

from typing import Any

from backend.core.registries.vision_families import BY_MODEL_TYPE
from backend.estimate.vision_towers import READERS

_SIGLIP = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_channels": 3,
           "image_size": 224, "patch_size": 16, "vision_use_head": True}
"""SiglipVisionConfig's defaults (transformers 5.24)."""


def _siglip(vision: dict[str, Any], text_hidden: int) -> tuple[int, list[tuple[int, int, int]]]:
    v = {**_SIGLIP, **{k: val for k, val in vision.items() if val is not None}}
    h, i, n = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"])
    patch, image, channels = int(v["patch_size"]), int(v["image_size"]), int(v["num_channels"])
    linears = [(h, h, 4 * n), (h, i, n), (i, h, n)]  # q, k, v, out_proj; fc1; fc2 (all with biases)
    total = channels * patch * patch * h + h + (image // patch) ** 2 * h  # patch conv + bias, positions
    total += n * (4 * (h * h + h) + 2 * h * i + i + h + 4 * h) + 2 * h  # layers, post_layernorm
    if v["vision_use_head"]:
        # probe, in_proj (3h x h + bias), out_proj, layernorm, MLP
        total += h + 3 * h * h + 3 * h + h * h + h + 2 * h + 2 * h * i + i + h
        linears += [(h, h, 1), (h, i, 1), (i, h, 1)]
    total += h * text_hidden + h  # Gemma 3's projector: mm_input_projection_weight and its RMSNorm
    return total, linears


def tower_params(config: dict[str, Any]) -> tuple[int, int, tuple[tuple[int, int, int], ...], list[str]]:
    """(parameters, of them in nn.Linear weights, the linears as (in, out, count), warnings) of the
    non-text parts of a multimodal config."""
    vision = config.get("vision_config")
    text = config.get("text_config") or config
    if not isinstance(vision, dict):
        return 0, 0, (), []
    if vision_family(config) is not None:  # estimate/vision_memory.py's rows count it
        return 0, 0, (), []
    kind = vision.get("model_type") or ("siglip_vision_model" if config.get("model_type") == "gemma3" else "vision")
    if kind != "siglip_vision_model" or config.get("model_type") != "gemma3":
        return 0, 0, (), [f"{config.get('model_type')}: its {kind} tower is not counted (only Gemma 3's SigLIP "
                          "is); the estimate covers the text decoder"]
    total, linears = _siglip(vision, int(text.get("hidden_size") or 2304))
    linear_weights = sum(a * b * c for a, b, c in linears)
    return total, linear_weights, tuple(linears), [
        f"gemma3: the SigLIP vision tower and projector ({total / 1e6:.0f} M parameters) are held as frozen weights; "
        "a text-only step does not run them"]


def vision_family(config: dict[str, Any]) -> str | None:
    """The proven vision family whose tower and projector the estimate's vision rows count (None: not one)."""
    family = BY_MODEL_TYPE.get(str(config.get("model_type")))
    return family.key if family is not None and family.key in READERS else None
