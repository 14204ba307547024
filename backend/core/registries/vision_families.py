"""The vision-language families this studio has proven, one `VisionFamily` each: where the model keeps
its vision tower and projector, its image token, and how many tokens one image becomes.

Torch-free. The token arithmetic is transcribed from transformers 5.25's image processors and
processors (named on each function), so the Model page and the memory estimate can say what an image
costs without loading anything; tests/backend/test_vision_families.py compares every family with the
real processor classes. A family transformers knows but this table does not is refused by
`backend/core/vision_folder.py`, in one line naming the proven ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

Config = dict[str, Any]
TokenRule = Callable[[Config, int, int, "int | None", Config], int]
"""(config.json, width, height, cap, processor settings) -> image tokens in the text sequence."""


@dataclass(frozen=True)
class VisionFamily:
    """One proven family. Parameter-name prefixes are those of the model AutoModelForImageTextToText
    builds; the tower's count leaves out the projector's prefixes that sit inside it (Qwen's merger)."""

    key: str
    label: str
    model_types: tuple[str, ...]
    tower: tuple[str, ...]
    projector: tuple[str, ...]
    image_token: str | None
    """The placeholder string; None: the tokenizer names it (`image_token` in its config)."""
    image_token_id_key: str
    cap_key: str
    """The processor setting that caps an image's resolution (what `cap` means for this family)."""
    rule: TokenRule
    images_per_row: int | None = None
    """How many images one row may hold; None: any number (the processor takes a list)."""
    other: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Further non-text parts, (label, prefixes): Gemma 4's audio tower."""
    towers: tuple[str, ...] = ()
    """The vision_config model_types proven in this family (empty: any): LLaVA's is CLIP, and a `llava`
    folder with another tower (Pixtral's) is another model."""
    notes: tuple[str, ...] = field(default=())
    text_door: bool = False
    """Rows without images may train on the text path (its speed shortcuts, DPO/KTO/GRPO): transformers'
    causal-LM class loads the whole model (Gemma 3, which trained as text before its images did)."""
    prompt_image: str | None = None
    """What a rendered prompt holds where one image goes (the processor expands it into the image's tokens);
    None: the processor's own `image_token`. Qwen's templates wrap the pad token in vision start/end."""
    calibrated_layers: str | None = None
    """Where the language model's decoder layers sit in the model AutoModelForImageTextToText builds: the
    layers a calibrated export (gptq-int4, awq-int4, w8a8) quantizes, its tower and projector kept 16-bit;
    None: those exports are not proven for the family and are refused (backend/export/calibrated/)."""
    gguf_projector: str | None = None
    """llama.cpp's `clip.projector_type` when the GGUF export writes this family's mmproj file (its layout:
    backend/export/mmproj_layouts.py); None: GGUF formats refuse the family's runs."""

    def image_token_id(self, config: Config) -> int | None:
        value = config.get(self.image_token_id_key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def cap(self, config: Config, processor: Config | None = None) -> int | None:
        """The configured resolution cap: the processor's setting, or the default the rule falls back on."""
        return _CAPS[self.key](config, processor or {})

    def tokens_per_image(self, config: Config, width: int, height: int, cap: int | None = None,
                         processor: Config | None = None) -> int:
        """Image tokens one `width` x `height` image puts into the text sequence, at `cap` (None: the
        folder's processor setting, else transformers' default)."""
        if width < 1 or height < 1:
            raise ValueError(f"an image of {width}x{height} pixels has no tokens")
        return self.rule(config, width, height, cap, processor or {})


def _vision(config: Config) -> Config:
    value = config.get("vision_config")
    return value if isinstance(value, dict) else {}


def _size_value(processor: Config, key: str, *names: str) -> int | None:
    """A processor setting stored flat (`max_pixels`) or inside `size` (`longest_edge`)."""
    for name in names:
        if isinstance(processor.get(name), int):
            return processor[name]
    size = processor.get(key)
    if isinstance(size, dict):
        for name in names:
            if isinstance(size.get(name), int):
                return size[name]
    return None


# --- Qwen2-VL family (Qwen2.5-VL, Qwen3-VL, Qwen3.5): image_processing_pil_qwen2_vl.smart_resize -------------

QWEN_MIN_PIXELS, QWEN_MAX_PIXELS = 56 * 56, 28 * 28 * 1280
"""Qwen2VLImageProcessorPil's defaults (size shortest_edge / longest_edge), used when a folder names none."""


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Both sides a multiple of `factor`, the area within [min_pixels, max_pixels], the aspect kept."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def _qwen_cap(config: Config, processor: Config) -> int:
    return _size_value(processor, "size", "max_pixels", "longest_edge") or QWEN_MAX_PIXELS


def _qwen_tokens(config: Config, width: int, height: int, cap: int | None, processor: Config) -> int:
    vision = _vision(config)
    patch = int(vision.get("patch_size") or 14)
    merge = int(vision.get("spatial_merge_size") or 2)
    min_pixels = _size_value(processor, "size", "min_pixels", "shortest_edge") or QWEN_MIN_PIXELS
    h, w = smart_resize(height, width, patch * merge, min_pixels, cap or _qwen_cap(config, processor))
    return (h // patch) * (w // patch) // (merge * merge)


# --- Gemma 3: processing_gemma3 (image_seq_length = mm_tokens_per_image; pan-and-scan off) --------------------

def _gemma3_tokens(config: Config, width: int, height: int, cap: int | None, processor: Config) -> int:
    return int(config.get("mm_tokens_per_image") or processor.get("image_seq_length") or 256)


# --- Gemma 4: image_processing_pil_gemma4.get_aspect_ratio_preserving_size -----------------------------------

GEMMA4_SOFT_TOKENS = (70, 140, 280, 560, 1120)
"""The image budgets Gemma4ImageProcessorPil accepts (`max_soft_tokens`); 280 by default."""


def _gemma4_cap(config: Config, processor: Config) -> int:
    return int(processor.get("max_soft_tokens") or 280)


def _gemma4_tokens(config: Config, width: int, height: int, cap: int | None, processor: Config) -> int:
    vision = _vision(config)
    patch = int(processor.get("patch_size") or vision.get("patch_size") or 16)
    kernel = int(processor.get("pooling_kernel_size") or vision.get("pooling_kernel_size") or 3)
    budget = cap or _gemma4_cap(config, processor)
    if budget not in GEMMA4_SOFT_TOKENS:
        raise ValueError(f"max_soft_tokens must be one of {GEMMA4_SOFT_TOKENS}, got {budget}")
    max_patches = budget * kernel * kernel
    factor = math.sqrt(max_patches * patch * patch / (height * width))
    side = kernel * patch
    th, tw = math.floor(factor * height / side) * side, math.floor(factor * width / side) * side
    if th == 0 and tw == 0:
        raise ValueError(f"a {width}x{height} image resizes to 0x0 at patch {patch}, kernel {kernel}")
    longest = (max_patches // kernel ** 2) * side
    if th == 0:
        th, tw = side, min(math.floor(width / height) * side, longest)
    elif tw == 0:
        tw, th = side, min(math.floor(height / width) * side, longest)
    return (th // patch) * (tw // patch) // (kernel * kernel)


# --- Idefics3 / SmolVLM: image_processing_pil_idefics3 (resize, resize_for_vision_encoder, split_images) ------

IDEFICS3_MAX_SIDE = 4096
"""MAX_IMAGE_SIZE of the Idefics3 image processor: no side above it."""


def _idefics3_tile(config: Config, processor: Config) -> int:
    return _size_value(processor, "max_image_size", "longest_edge") or int(_vision(config).get("image_size") or 364)


def _idefics3_cap(config: Config, processor: Config) -> int:
    return _size_value(processor, "size", "longest_edge") or 4 * _idefics3_tile(config, processor)


def _idefics3_seq_len(config: Config, processor: Config) -> int:
    if isinstance(processor.get("image_seq_len"), int):
        return processor["image_seq_len"]
    vision = _vision(config)
    side = int(vision.get("image_size") or 224) // int(vision.get("patch_size") or 32)
    return side * side // int(config.get("scale_factor") or 2) ** 2


def _idefics3_tokens(config: Config, width: int, height: int, cap: int | None, processor: Config) -> int:
    seq = _idefics3_seq_len(config, processor)
    longest, tile = cap or _idefics3_cap(config, processor), _idefics3_tile(config, processor)
    ratio = width / height  # resize: the longest side to `longest`, the other side even
    if width >= height:
        width, height = longest, int(longest / ratio)
        height += height % 2
    else:
        height, width = longest, int(longest * ratio)
        width += width % 2
    ratio = width / height  # below MAX_IMAGE_SIZE
    if width >= height and width > IDEFICS3_MAX_SIDE:
        width, height = IDEFICS3_MAX_SIDE, int(IDEFICS3_MAX_SIDE / ratio)
    elif height > width and height > IDEFICS3_MAX_SIDE:
        height, width = IDEFICS3_MAX_SIDE, int(IDEFICS3_MAX_SIDE * ratio)
    height, width = max(height, 1), max(width, 1)
    if processor.get("do_image_splitting", True) is False:
        return seq
    ratio = width / height  # resize_for_vision_encoder: both sides to multiples of the tile
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / ratio) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * ratio) / tile) * tile
    if height > tile or width > tile:  # split_images: rows x cols tiles and the whole image shrunk to one tile
        rows, cols = (height - tile) // tile + 1, (width - tile) // tile + 1
        return seq * (rows * cols + 1)
    return seq


# --- LLaVA-1.5 and LLaVA-NeXT: processing_llava, processing_llava_next (anyres) ------------------------------

def _llava_grid(config: Config) -> tuple[int, int]:
    vision = _vision(config)
    return int(vision.get("image_size") or 224), int(vision.get("patch_size") or 32)


def _llava_cap(config: Config, processor: Config) -> int:
    return _llava_grid(config)[0]


def _llava_extra(config: Config) -> int:
    """The CLS feature: dropped by the "default" feature strategy, kept by "full"."""
    return 0 if config.get("vision_feature_select_strategy", "default") == "default" else 1


def _llava_tokens(config: Config, width: int, height: int, cap: int | None, processor: Config) -> int:
    size, patch = _llava_grid(config)
    return (size // patch) ** 2 + _llava_extra(config)


def best_resolution(height: int, width: int, pinpoints: list[list[int]]) -> tuple[int, int]:
    """image_processing_utils.select_best_resolution: most of the image kept, least padding."""
    best, best_effective, best_waste = (0, 0), 0, float("inf")
    for h, w in pinpoints:
        scale = min(w / width, h / height)
        effective = min(int(width * scale) * int(height * scale), width * height)
        waste = w * h - effective
        if effective > best_effective or (effective == best_effective and waste < best_waste):
            best, best_effective, best_waste = (h, w), effective, waste
    return best


def _llava_next_tokens(config: Config, width: int, height: int, cap: int | None, processor: Config) -> int:
    size, patch = _llava_grid(config)
    pinpoints = config.get("image_grid_pinpoints") or processor.get("image_grid_pinpoints") or [[size, size]]
    best_h, best_w = best_resolution(height, width, pinpoints)
    side = size // patch
    current_h, current_w = side * (best_h // size), side * (best_w // size)
    if width / height > current_w / current_h:  # _get_unpadded_features: the padding's rows or columns go
        new_h = int(round(height * (current_w / width), 7))
        current_h -= (current_h - new_h) // 2 * 2
    else:
        new_w = int(round(width * (current_h / height), 7))
        current_w -= (current_w - new_w) // 2 * 2
    return current_h * current_w + current_h + side * side + _llava_extra(config)


# --- Mllama (Llama 3.2 Vision): processing_mllama puts one <|image|> in the text; the tiles reach the text
# through cross-attention layers, not as sequence positions ------------------------------------------------------

def _mllama_cap(config: Config, processor: Config) -> int:
    return int(_vision(config).get("image_size") or 560)


def _mllama_tokens(config: Config, width: int, height: int, cap: int | None, processor: Config) -> int:
    return 1


def _fixed_cap(config: Config, processor: Config) -> int:
    return int(_vision(config).get("image_size") or 896)


_CAPS: dict[str, Callable[[Config, Config], int]] = {
    "qwen2_5_vl": _qwen_cap, "qwen3_vl": _qwen_cap, "qwen3_5": _qwen_cap, "gemma3": _fixed_cap,
    "gemma4": _gemma4_cap, "idefics3": _idefics3_cap, "llava": _llava_cap, "llava_next": _llava_cap,
    "mllama": _mllama_cap,
}

_QWEN_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"
_QWEN_NOTE = "an image's tokens grow with its area up to max_pixels (smart_resize, then 2x2 patches merged)"

_LANGUAGE_LAYERS = "model.language_model.layers"
"""transformers 5.25's VLM layout: the language model beside the tower under `model`."""

VISION_FAMILIES: dict[str, VisionFamily] = {f.key: f for f in (
    VisionFamily("qwen2_5_vl", "Qwen2.5-VL", ("qwen2_5_vl",), ("model.visual.",), ("model.visual.merger.",),
                 "<|image_pad|>", "image_token_id", "max_pixels", _qwen_tokens, notes=(_QWEN_NOTE,), prompt_image=_QWEN_IMAGE,
                 calibrated_layers=_LANGUAGE_LAYERS, gguf_projector="qwen2.5vl_merger"),
    VisionFamily("qwen3_vl", "Qwen3-VL", ("qwen3_vl",), ("model.visual.",),
                 ("model.visual.merger.", "model.visual.deepstack_merger_list."),
                 "<|image_pad|>", "image_token_id", "max_pixels", _qwen_tokens, notes=(_QWEN_NOTE,), prompt_image=_QWEN_IMAGE,
                 calibrated_layers=_LANGUAGE_LAYERS, gguf_projector="qwen3vl_merger"),
    VisionFamily("qwen3_5", "Qwen3.5 (with its vision tower)", ("qwen3_5",), ("model.visual.",),
                 ("model.visual.merger.",), "<|image_pad|>", "image_token_id", "max_pixels", _qwen_tokens,
                 notes=(_QWEN_NOTE,), prompt_image=_QWEN_IMAGE),
    VisionFamily("gemma3", "Gemma 3 (4B and up)", ("gemma3",), ("model.vision_tower.",),
                 ("model.multi_modal_projector.",), "<image_soft_token>", "image_token_index", "image_size",
                 _gemma3_tokens, text_door=True, calibrated_layers=_LANGUAGE_LAYERS, gguf_projector="gemma3",
                 notes=("every image is resized to the tower's square and pooled to "
                        "mm_tokens_per_image tokens (pan-and-scan crops not counted)",)),
    VisionFamily("gemma4", "Gemma 4", ("gemma4",), ("model.vision_tower.",), ("model.embed_vision.",),
                 None, "image_token_id", "max_soft_tokens", _gemma4_tokens,
                 other=(("audio tower", ("model.audio_tower.", "model.embed_audio.")),),
                 notes=("the aspect is kept; max_soft_tokens (70 to 1120) is the budget",)),
    VisionFamily("idefics3", "SmolVLM / Idefics3", ("idefics3", "smolvlm"), ("model.vision_model.",),
                 ("model.connector.",), "<image>", "image_token_id", "longest_edge", _idefics3_tokens,
                 calibrated_layers="model.text_model.layers", gguf_projector="idefics3",
                 notes=("an image larger than one tile is cut into tiles plus a shrunk whole; each is "
                        "image_seq_len tokens",)),
    VisionFamily("llava", "LLaVA-1.5", ("llava",), ("model.vision_tower.",), ("model.multi_modal_projector.",),
                 "<image>", "image_token_index", "image_size", _llava_tokens, towers=("clip_vision_model",),
                 calibrated_layers=_LANGUAGE_LAYERS,
                 notes=("every image is resized to the CLIP tower's square: (image_size / patch)^2 tokens",)),
    VisionFamily("llava_next", "LLaVA-NeXT", ("llava_next",), ("model.vision_tower.",),
                 ("model.multi_modal_projector.", "model.image_newline"), "<image>", "image_token_index",
                 "image_size", _llava_next_tokens, towers=("clip_vision_model",),
                 notes=("anyres: the base square plus the best grid of image_grid_pinpoints, one newline per row",)),
    VisionFamily("mllama", "Llama 3.2 Vision (Mllama)", ("mllama",), ("model.vision_model.",),
                 ("model.multi_modal_projector.",), "<|image|>", "image_token_index", "image_size",
                 _mllama_tokens,
                 notes=("one <|image|> token in the text; up to max_image_tiles tiles of image_size reach it "
                        "through the cross-attention layers",)),
)}
"""Proven families by key."""

BY_MODEL_TYPE: dict[str, VisionFamily] = {t: f for f in VISION_FAMILIES.values() for t in f.model_types}


def takes_image_door(config: Config, tower: str, projector: str, images_per_row: int | None) -> bool:
    """Whether a run of a proven VLM trains through the image door (backend/training/vision) rather than
    the text path: always, but for a `text_door` family whose rows hold no images (images_per_row 0;
    None, unknown, counts as images) and whose tower and projector stay frozen."""
    family = BY_MODEL_TYPE.get(str(config.get("model_type")))
    if family is None or not _vision(config):
        return False
    return not family.text_door or tower != "frozen" or projector != "frozen" or images_per_row != 0


def proven_labels() -> str:
    """The proven families in one phrase, for refusals."""
    return ", ".join(f.label for f in VISION_FAMILIES.values())
