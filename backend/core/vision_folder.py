"""VisionFolder: whether a model folder is a vision-language model, its proven family, or the one line
that refuses it; and its processor's settings, so an image's token count is the folder's own.

Torch-free: config.json and the processor files only (preprocessor_config.json, processor_config.json).
A folder is a VLM when its config.json has a vision tower (`vision_config`), or an image token and a
model_type transformers 5.25 builds with AutoModelForImageTextToText (KNOWN_VLM_TYPES, kept true by a test);
the family comes from backend/core/registries/vision_families.py.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.core.registries.vision_families import BY_MODEL_TYPE, VisionFamily, proven_labels

PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")
"""Where a processor's settings live: the v5 processor file (image processor nested) and the image
processor's own file."""

KNOWN_VLM_TYPES = frozenset({
    "apertus1p5", "aria", "aya_vision", "blip", "blip-2", "chameleon", "cohere2_vision", "cohere_compass",
    "cosmos3_edge", "cosmos3_omni", "deepseek_ocr2", "deepseek_vl", "deepseek_vl_hybrid", "diffusion_gemma",
    "dots3_note", "emu3", "ernie4_5_vl_moe", "evolla", "exaone4_5", "fast_vlm", "florence2", "fuyu", "gemma3",
    "gemma3n", "gemma4", "gemma4_unified", "git", "glm46v", "glm4v", "glm4v_moe", "glm5_next", "glm_ocr",
    "glmga", "got_ocr2", "granite4_vision", "granite_docling", "hunyuan_vl", "hy_v4_vl",
    "hyperclovax_vision_v2", "idefics", "idefics2", "idefics3", "inkling2", "inkling2_loop", "inkling_mm_model",
    "instructblip", "instructblipvideo", "internvl", "janus", "kimi_k25", "kosmos-2", "kosmos-2.5", "lfm2_vl",
    "lfm3_vl", "lighton_ocr", "llama4", "llava", "llava_next", "llava_next_video", "llava_onevision",
    "llava_onevision1_5", "minicpm_ocr", "minicpmv4_6", "minicpmv4_7", "minimax_m3_vl", "mistral3", "mistral4",
    "mistral_large4", "mllama", "molmo2", "muse_glimmer", "muse_spark", "nemotron_h_omni", "ovis2", "ovis2_5",
    "paddleocr_vl", "paligemma", "perception_lm", "pi0", "pi05", "pix2struct", "pp_chart2table",
    "pp_formulanet", "qianfan_ocr", "qwen2_5_omni_thinker", "qwen2_5_vl", "qwen2_vl", "qwen3_5", "qwen3_5_moe",
    "qwen3_omni_moe_thinker", "qwen3_vl", "qwen3_vl_moe", "qwen4_exp", "shieldgemma2", "smolvlm", "step3p7",
    "t5gemma2", "udop", "unlimited_ocr", "video_llama_3", "video_llava", "vipllava", "vision-encoder-decoder",
})
"""The model_types of transformers 5.25's image-text-to-text table (AutoModelForImageTextToText), as
tests/backend/test_vision_folder.py checks. A vision tower in config.json counts too (remote-code VLMs)."""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


def processor_settings(folder: Path) -> tuple[dict[str, Any], str]:
    """The folder's processor settings in one dict (image processor's over the processor's) and the
    files they came from ("" when none)."""
    settings: dict[str, Any] = {}
    found = []
    for name in PROCESSOR_FILES:
        raw = _read_json(folder / name)
        if not raw:
            continue
        found.append(name)
        nested = raw.get("image_processor")
        settings.update({k: v for k, v in raw.items() if k != "image_processor"})
        if isinstance(nested, dict):
            settings.update(nested)
    return settings, ", ".join(found)


def has_vision_tower(config: dict[str, Any]) -> bool:
    return isinstance(config.get("vision_config"), dict)


@dataclass(frozen=True)
class VisionFolder:
    """What the folder's vision side is; `refusal` is the one line when the studio cannot train it."""

    is_vlm: bool = False
    model_type: str = ""
    family: VisionFamily | None = None
    refusal: str = ""
    config: dict[str, Any] = field(default_factory=dict)
    processor: dict[str, Any] = field(default_factory=dict)
    processor_files: str = ""

    @classmethod
    def from_config(cls, config: dict[str, Any], folder: Path | None = None) -> "VisionFolder":
        """Recognise a config.json (and, given its folder, the processor files beside it)."""
        model_type = str(config.get("model_type") or "")
        named = model_type in KNOWN_VLM_TYPES and any(k in config for k in ("image_token_id", "image_token_index"))
        if not (has_vision_tower(config) or named):
            return cls(model_type=model_type, config=config)
        processor, files = processor_settings(folder) if folder is not None else ({}, "")
        family = BY_MODEL_TYPE.get(model_type)
        if family is not None and not has_vision_tower(config):
            # Gemma 3 1B and Qwen3.5's text models share a model_type family with no tower: plain text models
            return cls(model_type=model_type, config=config)
        where = f"{folder / 'config.json'}: " if folder is not None else ""
        tower = str((config.get("vision_config") or {}).get("model_type") or "")
        refusal = ""
        if family is None:
            refusal = (f"{where}model_type '{model_type}' is a vision-language model this studio has not proven; "
                       f"proven: {proven_labels()}")
        elif family.towers and tower and tower not in family.towers:
            refusal = (f"{where}model_type '{model_type}' with a '{tower}' vision tower is a vision-language model "
                       f"this studio has not proven ({family.label} is proven with {', '.join(family.towers)}); "
                       f"proven: {proven_labels()}")
            family = None
        return cls(True, model_type, family, refusal, config, processor, files)

    @classmethod
    def read(cls, folder: Path) -> "VisionFolder":
        """Recognise a model folder; a folder without a readable config.json is simply not a VLM."""
        folder = Path(folder)
        return cls.from_config(_read_json(folder / "config.json"), folder)

    @property
    def cap(self) -> int | None:
        """The configured resolution cap (the family's `cap_key`), the folder's or transformers' default."""
        return self.family.cap(self.config, self.processor) if self.family else None

    def tokens_per_image(self, width: int, height: int, cap: int | None = None) -> int | None:
        """Image tokens a `width` x `height` image costs with this folder's processor; None: not proven."""
        if self.family is None:
            return None
        return self.family.tokens_per_image(self.config, width, height, cap, self.processor)

    def largest_tokens(self) -> int | None:
        """The most tokens one image can cost at the configured cap: the rule at the cap's own size, a large
        photo either way round, and LLaVA-NeXT's grid sizes."""
        if self.family is None:
            return None
        cap = self.cap or 0
        side = math.isqrt(cap) if self.family.cap_key == "max_pixels" else cap
        probes = [(side, side), (4096, 2304), (2304, 4096)] if side > 0 else [(4096, 2304), (2304, 4096)]
        grid = self.config.get("image_grid_pinpoints") or self.processor.get("image_grid_pinpoints") or []
        probes += [(w, h) for h, w in grid]
        return max(self.family.tokens_per_image(self.config, w, h, None, self.processor) for w, h in probes)

    def tower_line(self) -> str:
        """The vision tower in a few words: its model_type, layers, width and patch (and image) size."""
        vision = self.config.get("vision_config")
        if not isinstance(vision, dict):
            return ""
        layers = vision.get("depth") or vision.get("num_hidden_layers")
        words = [str(vision["model_type"])] if vision.get("model_type") else []
        words += [f"{layers} layers"] if layers else []
        words += [f"width {vision['hidden_size']}"] if vision.get("hidden_size") else []
        words += [f"patch {vision['patch_size']}"] if vision.get("patch_size") else []
        words += [f"image {vision['image_size']}"] if vision.get("image_size") else []
        return " · ".join(words)

    def projector_line(self) -> str:
        """Where the projector lives in the model (the family's parameter prefixes)."""
        if self.family is None:
            return ""
        return ", ".join(p.rstrip(".") for p in self.family.projector)
