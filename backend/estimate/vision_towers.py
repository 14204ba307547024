"""A vision-language model's image side from config.json alone: its tower's and projector's parameters
and linears, and the patches one image becomes in the tower.

Torch-free, one `TowerShape` reader per proven family (a registry keyed like
`backend/core/registries/vision_families.py`), transcribed from transformers 5.25's modeling files;
tests/backend/test_estimate_vision.py checks every count against the model transformers builds on the
meta device (`backend/training/model/vision_parts.py`). A config key left out takes the family's config
class default (`DEFAULTS`). Every proven family has its reader; `tower_shape` returns None for any other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

Config = dict[str, Any]
Linears = tuple[tuple[int, int, int], ...]
"""(in, out, count) of each kind of nn.Linear."""


@dataclass(frozen=True)
class TowerShape:
    """The tower and the projector of one model: parameters, linears, and the tower's geometry."""

    tower_params: int
    tower_linears: Linears
    projector_params: int
    projector_linears: Linears
    layers: int
    width: int
    intermediate: int
    heads: int
    gated: bool
    """The tower's MLP has a gate (Qwen2.5-VL's SwiGLU: three matrices, not two)."""
    patch_values: int
    """Pixel values one patch holds (channels x patch^2, x temporal patch for Qwen)."""


DEFAULTS: dict[str, Config] = {
    "qwen2_5_vl": {"depth": 32, "hidden_size": 3584, "intermediate_size": 3420, "num_heads": 16, "in_channels": 3,
                   "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 3584},
    "qwen3_vl": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16, "in_channels": 3,
                 "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 3584,
                 "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]},
    "siglip": {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
               "num_channels": 3, "patch_size": 16, "image_size": 224, "vision_use_head": True},
    "idefics3": {"hidden_size": 1152, "intermediate_size": 3072, "num_attention_heads": 16, "num_hidden_layers": 12,
                 "num_channels": 3, "patch_size": 32, "image_size": 224},
    "clip": {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
             "num_channels": 3, "patch_size": 32, "image_size": 224},
    "gemma4": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16, "num_attention_heads": 12,
               "num_key_value_heads": 12, "head_dim": 64, "patch_size": 16, "position_embedding_size": 10240,
               "pooling_kernel_size": 3},
    "mllama": {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32, "num_global_layers": 8,
               "attention_heads": 16, "num_channels": 3, "image_size": 448, "patch_size": 14, "max_num_tiles": 4,
               "vision_output_dim": 7680, "supported_aspect_ratios": [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2],
                                                                       [3, 1], [4, 1]]},
}
"""The vision config classes' defaults (transformers 5.25), for keys a config.json leaves out."""


def _vision(config: Config, defaults: str) -> Config:
    vision = config.get("vision_config") if isinstance(config.get("vision_config"), dict) else {}
    return {**DEFAULTS[defaults], **{k: v for k, v in vision.items() if v is not None}}


def _text_hidden(config: Config) -> int:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    return int(text.get("hidden_size") or 4096)


def _blocks(h: int, i: int, n: int, gated: bool, norm_bias: bool,
            fused: bool = True) -> tuple[int, list[tuple[int, int, int]]]:
    """n pre-norm transformer blocks of width h (Qwen's fused qkv or q, k, v apart), all linears biased."""
    mlp = [(h, i, 2 if gated else 1), (i, h, 1)]
    linears = ([(h, 3 * h, 1), (h, h, 1)] if fused else [(h, h, 4)]) + mlp
    per = sum(a * b * c + b * c for a, b, c in linears) + 2 * h * (2 if norm_bias else 1)
    return n * per, [(a, b, c * n) for a, b, c in linears]


def _qwen(config: Config, key: str) -> TowerShape:
    v = _vision(config, "qwen2_5_vl" if key == "qwen2_5_vl" else "qwen3_vl")
    h, i, n = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["depth"])
    patch, t, c = int(v["patch_size"]), int(v["temporal_patch_size"]), int(v.get("in_channels") or v.get("in_chans") or 3)
    merged, out = h * int(v["spatial_merge_size"]) ** 2, int(v["out_hidden_size"])
    patch_values = c * t * patch * patch
    gated = key == "qwen2_5_vl"  # Qwen2.5-VL: SwiGLU and RMSNorm without bias; Qwen3-VL: GELU MLP, LayerNorm
    blocks, linears = _blocks(h, i, n, gated, norm_bias=not gated)
    tower = blocks + patch_values * h + (0 if gated else h + int(v["num_position_embeddings"]) * h)
    merger_linears = [(merged, merged, 1), (merged, out, 1)]
    merger = merged * merged + merged + merged * out + out + (h if gated else 2 * h)
    deepstack = len(v.get("deepstack_visual_indexes") or []) if key == "qwen3_vl" else 0
    projector = merger + deepstack * (merger - 2 * h + 2 * merged)  # each has a LayerNorm over the merged width
    projector_linears = tuple((a, b, k * (1 + deepstack)) for a, b, k in merger_linears)
    return TowerShape(tower, tuple(linears), projector, projector_linears, n, h, i,
                      int(v["num_heads"]), gated, patch_values)


def _vit(v: Config, positions: int, *, class_token: bool = False, pre_norm: bool = False,
         head: bool = False) -> tuple[int, list[tuple[int, int, int]], int]:
    """SigLIP / CLIP / Idefics3's ViT: patch conv (biased but CLIP's), positions, blocks, final LayerNorm."""
    h, i, n = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"])
    patch_values = int(v["num_channels"]) * int(v["patch_size"]) ** 2
    blocks, linears = _blocks(h, i, n, gated=False, norm_bias=True, fused=False)
    total = blocks + patch_values * h + (0 if class_token else h) + positions * h + 2 * h
    total += h if class_token else 0
    total += 2 * h if pre_norm else 0
    if head:  # SigLIP's attention-pooling head: probe, MultiheadAttention, LayerNorm, MLP
        total += h + 3 * h * h + 3 * h + h * h + h + 2 * h + 2 * h * i + i + h
        linears += [(h, h, 1), (h, i, 1), (i, h, 1)]
    return total, linears, patch_values


def _gemma3(config: Config, key: str) -> TowerShape:
    v = _vision(config, "siglip")
    h = int(v["hidden_size"])
    grid = int(v["image_size"]) // int(v["patch_size"])
    tower, linears, values = _vit(v, grid * grid, head=bool(v["vision_use_head"]))
    projector = h * _text_hidden(config) + h  # mm_input_projection_weight and its RMSNorm
    return TowerShape(tower, tuple(linears), projector, ((h, _text_hidden(config), 1),), int(v["num_hidden_layers"]),
                      h, int(v["intermediate_size"]), int(v["num_attention_heads"]), False, values)


def _idefics3(config: Config, key: str) -> TowerShape:
    v = _vision(config, "idefics3")
    h = int(v["hidden_size"])
    grid = int(v["image_size"]) // int(v["patch_size"])
    tower, linears, values = _vit(v, grid * grid)
    merged = h * int(config.get("scale_factor") or 2) ** 2
    projector = merged * _text_hidden(config)  # the connector's pixel shuffle then one linear without bias
    return TowerShape(tower, tuple(linears), projector, ((merged, _text_hidden(config), 1),),
                      int(v["num_hidden_layers"]), h, int(v["intermediate_size"]), int(v["num_attention_heads"]),
                      False, values)


def _llava(config: Config, key: str) -> TowerShape:
    v = _vision(config, "clip")
    h = int(v["hidden_size"])
    grid = int(v["image_size"]) // int(v["patch_size"])
    tower, linears, values = _vit(v, grid * grid + 1, class_token=True, pre_norm=True)
    layer = config.get("vision_feature_layer", -2)
    inp = h * (len(layer) if isinstance(layer, list) else 1)
    text = _text_hidden(config)
    bias = config.get("multimodal_projector_bias", True) is not False
    projector = inp * text + text * text + (2 * text if bias else 0) + (text if key == "llava_next" else 0)
    return TowerShape(tower, tuple(linears), projector, ((inp, text, 1), (text, text, 1)), int(v["num_hidden_layers"]),
                      h, int(v["intermediate_size"]), int(v["num_attention_heads"]), False, values)


def _gemma4(config: Config, key: str) -> TowerShape:
    """Gemma 4's encoder: a patch projection without bias, a 2-D position table, pre/post-norm blocks with
    q/k norms and a gated MLP (no biases anywhere), a parameter-free pooler; the projector (`embed_vision`) one
    linear after a norm without scale. Clipped linears and standardization add buffers, not parameters."""
    v = _vision(config, "gemma4")
    h, i, n = int(v["hidden_size"]), int(v["intermediate_size"]), int(v["num_hidden_layers"])
    heads, kv, hd = int(v["num_attention_heads"]), int(v["num_key_value_heads"]), int(v["head_dim"])
    values = 3 * int(v["patch_size"]) ** 2
    linears = [(h, heads * hd, n), (h, kv * hd, 2 * n), (heads * hd, h, n), (h, i, 2 * n), (i, h, n)]
    blocks = sum(a * b * c for a, b, c in linears) + n * (2 * hd + 4 * h)
    tower = values * h + 2 * int(v["position_embedding_size"]) * h + blocks
    text = _text_hidden(config)
    return TowerShape(tower, tuple(linears), h * text, ((h, text, 1),), n, h, i, heads, True, values)


def _mllama(config: Config, key: str) -> TowerShape:
    """Llama 3.2 Vision's encoder: a patch conv without bias, a class token, gated position and tile embeddings
    (one table row per aspect ratio, every tile's patches), pre/post LayerNorms, a local transformer and a gated
    global one (q/k/v/o without bias, a biased GELU MLP); the projector one biased linear from the stacked
    intermediate and final states (`vision_output_dim`) to the text width."""
    v = _vision(config, "mllama")
    h, i = int(v["hidden_size"]), int(v["intermediate_size"])
    n, g = int(v["num_hidden_layers"]), int(v["num_global_layers"])
    patch, tiles = int(v["patch_size"]), int(v["max_num_tiles"])
    patches = (int(v["image_size"]) // patch) ** 2 + 1
    ratios = len(v["supported_aspect_ratios"]) + 1
    values = int(v["num_channels"]) * patch * patch
    linears = [(h, h, 4 * (n + g)), (h, i, n + g), (i, h, n + g)]
    blocks = sum(a * b * c for a, b, c in linears) + (n + g) * (i + h + 4 * h) + 2 * g
    embeddings = values * h + h + (1 + patches * h + ratios * tiles * patches * h) + 2 * (ratios * tiles * h + 1)
    tower = embeddings + 4 * h + blocks
    out, text = int(v["vision_output_dim"]), _text_hidden(config)
    return TowerShape(tower, tuple(linears), out * text + text, ((out, text, 1),), n + g, h, i,
                      int(v["attention_heads"]), False, values)


READERS: dict[str, Callable[[Config, str], TowerShape]] = {
    "qwen2_5_vl": _qwen, "qwen3_vl": _qwen, "qwen3_5": _qwen, "gemma3": _gemma3, "idefics3": _idefics3,
    "llava": _llava, "llava_next": _llava, "gemma4": _gemma4, "mllama": _mllama,
}
"""Family key -> its reader: every proven family."""


def tower_shape(config: Config, family_key: str) -> TowerShape | None:
    """The family's tower and projector from `config` (None: this family's tower is not transcribed)."""
    reader = READERS.get(family_key)
    return reader(config, family_key) if reader else None
