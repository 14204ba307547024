"""The image side of one VLM training step: the tower's and projector's states for their tuning, the tower's
activations per image at the resolution cap, the image tokens a row adds, the processor's pixel tensors.

Torch-free. The parameters come from `vision_towers.tower_shape`; an image's patches and tokens from the
family's rule at its cap (`core/registries/vision_families.py`), for the worst image the cap allows
(a square of `max_pixels` for Qwen, the tower's square elsewhere, the most tiles for SmolVLM, Gemma 4's
soft-token budget, all of Mllama's tiles). The activation coefficients are per patch and per tower layer,
measured by bench/estimate_vision.py on the CPU (sdpa attention) and held by tests/backend/test_estimate_vision.py;
Gemma 4 and Mllama add terms in the square of an image's patches (their attention masks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from backend.core.registries.vision_families import VISION_FAMILIES, smart_resize
from backend.estimate.vision_towers import TowerShape, tower_shape

Config = dict[str, Any]

DEFAULT_IMAGES_PER_ROW = 1
"""Images a row is counted with when the data's count is not known (stated in a note)."""


def _text_hidden(config: Config) -> int:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return int(text.get("hidden_size") or 4096)


def _vision(config: Config) -> Config:
    value = config.get("vision_config")
    return value if isinstance(value, dict) else {}


def patches_per_image(config: Config, family: str, cap: int | None, square: bool = False,
                      processor: Config | None = None) -> tuple[int, int]:
    """(patches the tower sees, the grid's side) for the largest image `cap` allows (None: the family's
    default cap). Qwen: cap / (patch x merge)^2 merged tokens, the most any aspect reaches (`square`: a
    square image's, which bench/estimate_vision.py feeds); the fixed-size towers: their
    square (CLIP's class token included); SmolVLM: the tile's square times the tiles of a cap x cap image."""
    vlm = VISION_FAMILIES[family]
    cap = cap or vlm.cap(config, processor)
    v = _vision(config)
    if family.startswith("qwen"):
        patch = int(v.get("patch_size") or (14 if family == "qwen2_5_vl" else 16))
        factor = patch * int(v.get("spatial_merge_size") or 2)
        side = math.isqrt(cap)
        h, w = smart_resize(side, side, factor, factor * factor, cap)
        if square:
            return (h // patch) * (w // patch), h // patch
        # the most any aspect reaches: smart_resize keeps h x w within cap, both multiples of factor
        return (cap // (factor * factor)) * (factor // patch) ** 2, h // patch
    if family == "mllama":  # every tile of max_num_tiles (padding tiles too), its patches and class token padded to 8
        tiles = int(v.get("max_num_tiles") or 4)
        grid = int(v.get("image_size") or 560) // int(v.get("patch_size") or 14)
        return tiles * ((grid * grid + 1 + 7) // 8 * 8), grid
    if family == "gemma4":  # the processor pads every image to the budget's patches, the pooler's kernel squared
        kernel = int(v.get("pooling_kernel_size") or 3)
        return cap * kernel * kernel, kernel
    image, patch = int(v.get("image_size") or 224), int(v.get("patch_size") or 16)
    grid = image // patch
    if family in ("llava", "llava_next"):
        crops = 1
        if family == "llava_next":  # the base square plus the best grid of pinpoints, each a tower pass
            pinpoints = config.get("image_grid_pinpoints") or [[image * 2, image * 2]]
            crops = 1 + max((a // image) * (b // image) for a, b in pinpoints)
        return crops * (grid * grid + 1), grid
    if family == "idefics3":
        tokens = vlm.tokens_per_image(config, cap, cap, cap, processor)
        per_tile = grid * grid // int(config.get("scale_factor") or 2) ** 2  # image_seq_len: pixel shuffle
        return (tokens // max(1, per_tile)) * grid * grid, grid
    return grid * grid, grid


@dataclass(frozen=True)
class ImageSide:
    """Per-image figures of one family at one cap, and the shape they come from."""

    shape: TowerShape
    patches: int
    tokens: int
    pixel_values: int


def image_side(config: Config, family: str, cap: int | None, square: bool = False,
               processor: Config | None = None) -> ImageSide | None:
    """The image side of `config` at `cap` (None: a family whose tower is not transcribed); `processor`: the
    folder's processor settings (core/vision_folder.processor_settings), whose cap wins over the default."""
    shape = tower_shape(config, family)
    if shape is None:
        return None
    vlm = VISION_FAMILIES[family]
    cap = cap or vlm.cap(config, processor)
    patches, grid = patches_per_image(config, family, cap, square, processor)
    if family.startswith("qwen"):
        merge = int(_vision(config).get("spatial_merge_size") or 2)
        tokens = patches // (merge * merge)
    elif family == "gemma4":
        tokens = cap  # the budget: at most that many soft tokens, whatever the aspect
    else:
        tokens = vlm.tokens_per_image(config, cap, cap, cap, processor)
    crops = patches // (grid * grid + 1) if family in ("llava", "llava_next") else 0  # CLIP's class tokens
    values = (patches - crops) * shape.patch_values
    if family == "mllama":  # the processor's tiles: max_num_tiles squares of image_size
        values = int(_vision(config).get("max_num_tiles") or 4) * grid * grid * shape.patch_values
    return ImageSide(shape, patches, tokens, values)


@dataclass(frozen=True)
class Coefficients:
    """Elements per patch, measured (bench/estimate_vision.py, fp32, sdpa) at three widths and two depths:
    per tower layer when the tower trains (a*width + b*intermediate + c), the rest of the trained image side
    (d*width + e per patch), and the frozen forward's transient peak (f*width + g*intermediate + k)."""

    layer: tuple[float, float, float]
    rest: tuple[float, float]
    frozen: tuple[float, float, float]
    skip_last_layer: bool = False
    """LLaVA reads the features of the layer before the last (vision_feature_layer -2)."""


COEFFICIENTS: dict[str, Coefficients] = {
    # SigLIP (Gemma 3, SmolVLM): ln1, q/k/v in, sdpa's q, k, v, out, out_proj in, ln2, fc1 in: 8h; gelu in, fc2 in: 2i
    "siglip": Coefficients((8, 2, 6), (2.19, 8), (4, 2, 0)),
    # CLIP (LLaVA): as SigLIP, quick_gelu saves its sigmoid too: 3i
    "clip": Coefficients((8, 3, 6), (11, 202 / 64), (4, 3, 0), skip_last_layer=True),
    # Qwen2.5-VL: rotary q and k, window reordering; SwiGLU saves gate, up, act and product: 4i
    "qwen2_5_vl": Coefficients((13, 4, 4), (6, 34), (6, 2.5, 4.5)),
    # Qwen3-VL / Qwen3.5: rotary q and k, GELU MLP; the deepstack mergers
    "qwen3_vl": Coefficients((11, 2, 6), (5, 30), (11, 0.5, 32)),
    # Gemma 4: four norms, q/k/v norms, 2-D rotary q and k, gated MLP (4i); the rest: the patch values the input
    # projection saves (counted apart, per patch) plus 11, and the pooler. Its L x L terms: gemma4_squares
    "gemma4": Coefficients((19, 4, 30), (1.2, 11), (8, 0, 2.5)),
    # Mllama: q/k/v/o without bias, GELU MLP, the global layers' gates; the rest: the stacked intermediate states
    # and the projector's output (text width, counted apart); its L x L aspect-ratio mask apart (image_side_bytes)
    "mllama": Coefficients((8.5, 2, 6), (6, 3.5), (2, 0, 0)),
}
_KIND = {"gemma3": "siglip", "gemma4": "gemma4", "mllama": "mllama", "idefics3": "siglip", "llava": "clip", "llava_next": "clip", "qwen2_5_vl": "qwen2_5_vl",
         "qwen3_vl": "qwen3_vl", "qwen3_5": "qwen3_vl"}


def gemma4_squares(side: ImageSide, layers: int, checkpointing: bool, compute_bytes: int,
                   images: int) -> tuple[float, int]:
    """Gemma 4's terms in the square of an image's L patches (padding included; measured by
    bench/estimate_vision.py, held to 1%): its padding mask reaches SDPA converted to the compute dtype in every
    layer, saved per layer when the tower trains (elements: layers x L^2, one layer's with checkpointing), and the
    pooler's L x L/k^2 weights; the frozen forward holds the boolean mask and one converted copy (bytes)."""
    squares = side.patches * side.patches
    kernel = max(1, round(math.sqrt(side.patches / max(1, side.tokens))))
    trained = ((1 if checkpointing else layers) * squares + squares / kernel ** 2) * images
    return trained, squares * (1 + compute_bytes) * images


def image_side_bytes(config: Config, family: str, cap: int | None, *, compute_bytes: int, images: int,
                     checkpointing: bool = False, square: bool = False,
                     processor: Config | None = None) -> dict[str, int]:
    """Per step with `images` images: parameters, pixel bytes (fp32, plus a compute-dtype copy when that is
    not fp32), the frozen forward's transient peak, the trained tower's saved activations (with
    checkpointing: each layer's input and one layer recomputed, not measured)."""
    side = image_side(config, family, cap, square, processor)
    if side is None:
        return {}
    shape, patches = side.shape, side.patches * images
    k = COEFFICIENTS[_KIND[family]]
    h, i = shape.width, shape.intermediate
    if family == "llava" and isinstance(config.get("text_config"), dict):
        rest_b = k.rest[1] * int(config["text_config"].get("hidden_size") or 4096)
    else:
        rest_b = k.rest[1]
    if family == "gemma4":
        rest_b += shape.patch_values
    if family == "mllama":
        rest_b += _text_hidden(config)
    per_layer = k.layer[0] * h + k.layer[1] * i + k.layer[2]
    layers = shape.layers - (1 if k.skip_last_layer else 0)
    rest = k.rest[0] * h + rest_b
    trained = patches * (layers * h + per_layer + rest) if checkpointing else patches * (layers * per_layer + rest)
    frozen = patches * (k.frozen[0] * h + k.frozen[1] * i + k.frozen[2]) * compute_bytes
    pixels = side.pixel_values * images
    if family == "gemma4":
        squared, mask_phase = gemma4_squares(side, layers, checkpointing, compute_bytes, images)
        trained += squared
        frozen = max(frozen + mask_phase, 2 * pixels * compute_bytes)  # or the patch embedder's pixel copies
    mask = copies = floor = 0
    if family == "mllama":
        # the aspect-ratio mask: L x L in the compute dtype, built by a matmul then scaled (two alive at once, beside
        # the embedded patches: the frozen forward's peak and the least a trained forward reaches), then held
        # through the tower's forward and saved once for its backward when it trains
        square = side.patches * side.patches * compute_bytes * images
        frozen += 2 * square
        floor = int(frozen)
        trained += square / compute_bytes
    if family == "idefics3":
        # Idefics3's processor pads every tile with a pixel_attention_mask of int64, one per pixel, in the batch
        # through the step; get_image_features copies the real tiles out (`pixel_values[real].contiguous()` in
        # the compute dtype, `pixel_attention_mask[real].contiguous()`), both alive while its tower runs
        mask = pixels // int(_vision(config).get("num_channels") or 3) * 8
        copies = pixels * compute_bytes + mask
    if family == "gemma4":  # image_position_ids: two int64 a patch, padding included
        mask = side.patches * images * 2 * 8
    return {"forward_copies": copies, "forward_floor": floor, "tower_params": shape.tower_params, "projector_params": shape.projector_params,
            "pixel_bytes": pixels * 4 + (pixels * compute_bytes if compute_bytes != 4 else 0), "pixel_extra": mask,
            "frozen_forward_peak": int(frozen), "trained_activations": int(trained * compute_bytes),
            "image_tokens": side.tokens * images, "patches": patches}
