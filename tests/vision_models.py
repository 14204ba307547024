"""Tiny random-weight vision-language models of every proven family, beside tests/families.py's text ones.

Each is built from its family's real config shape: the published config.json where tests/fixtures holds
one (Qwen2.5-VL-7B, Qwen3-VL-4B, LLaVA-1.5-7b, Gemma 3 4B, SmolVLM-256M), else the family's config class, with the
widths, layers and vision depth shrunk but the family's own keys kept: M-RoPE sections and head_dim,
window and full-attention blocks, deepstack layers, soft-capping and sliding windows, patch, merge and
image sizes (so an image costs as many tokens as on the real model), cross-attention layers, tiles.
The tokenizer is the bundled one (resources/tiny) with the family's image tokens added (and MERGES), and the folder
holds the family's processor with its PIL image processor (no torchvision), saved by `save_pretrained`.
Nothing is downloaded. Tests import this module; it imports torch and transformers only when building.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from tests import model_configs

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "resources" / "tiny"

TEXT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096)
"""The language model's shrunk widths; a family whose real head_dim fixes a RoPE split keeps it."""

QWEN_TOKENS = {"vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>",
               "vision_token_id": "<|vision_pad|>", "image_token_id": "<|image_pad|>",
               "video_token_id": "<|video_pad|>"}
GEMMA3_TOKENS = {"boi_token_index": "<start_of_image>", "eoi_token_index": "<end_of_image>",
                 "image_token_index": "<image_soft_token>"}
GEMMA4_TOKENS = {"boi_token_id": "<|image>", "eoi_token_id": "<image|>", "image_token_id": "<|image|>",
                 "video_token_id": "<|video|>", "boa_token_id": "<|audio>", "eoa_token_index": "<audio|>",
                 "audio_token_id": "<|audio|>"}
IDEFICS3_TOKENS = {"image_token_id": "<image>"}
IDEFICS3_EXTRA = ["<fake_token_around_image>", "<global-img>", "<end_of_utterance>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
MERGES: dict[str, list[tuple[str, str]]] = {"idefics3": [("\u010a", "\u010a")]}
"""BPE merges a family's real vocabulary has and the bundled one lacks, appended (ids from 4096 up, before the
image tokens). SmolVLM's GPT-2-style vocabulary holds "\\n\\n" as one token ("\u010a\u010a" beside "\u010a" for
"\\n"), and llama.cpp's idefics3 image template looks both up as single tokens (mtmd.cpp lookup_token)."""
LLAVA_TOKENS = {"image_token_index": "<image>"}
MLLAMA_TOKENS = {"image_token_index": "<|image|>"}

FAMILY_TOKENS: dict[str, dict[str, str]] = {
    "qwen2_5_vl": QWEN_TOKENS, "qwen3_vl": QWEN_TOKENS, "qwen3_5": QWEN_TOKENS, "gemma3": GEMMA3_TOKENS,
    "gemma4": GEMMA4_TOKENS, "idefics3": IDEFICS3_TOKENS, "llava": LLAVA_TOKENS, "llava_next": LLAVA_TOKENS,
    "mllama": MLLAMA_TOKENS,
}
"""config.json key of each special token id -> the token, per family."""

TOKENIZER_ATTRIBUTES: dict[str, dict[str, str]] = {
    "gemma3": {"image_token": "<image_soft_token>", "boi_token": "<start_of_image>", "eoi_token": "<end_of_image>"},
    "gemma4": {"image_token": "<|image|>", "boi_token": "<|image>", "eoi_token": "<image|>",
               "video_token": "<|video|>", "audio_token": "<|audio|>", "boa_token": "<|audio>",
               "eoa_token": "<audio|>"},
    "llava": {"image_token": "<image>"}, "llava_next": {"image_token": "<image>"},
    "mllama": {"image_token": "<|image|>"},
}
"""Tokens the family's processor reads off the tokenizer (`tokenizer.image_token`, ...)."""

PROCESSOR_PIL = {
    "qwen2_5_vl": "Qwen2VLImageProcessorPil", "qwen3_vl": "Qwen2VLImageProcessorPil",
    "qwen3_5": "Qwen2VLImageProcessorPil", "gemma3": "Gemma3ImageProcessorPil", "gemma4": "Gemma4ImageProcessorPil",
    "idefics3": "Idefics3ImageProcessorPil", "llava": "CLIPImageProcessorPil",
    "llava_next": "LlavaNextImageProcessorPil", "mllama": "MllamaImageProcessorPil",
}
"""The image processor each folder ships: the PIL class, which needs Pillow alone."""

NEEDS_VIDEO = ("qwen2_5_vl", "qwen3_vl", "qwen3_5", "gemma4")
"""Families whose transformers processor takes a video processor too, which needs torchvision: their
folders hold the image processor and tokenizer, and the backend builds the processor without video
(backend/training/model/vision_processor.py)."""


def _shrink(section: dict[str, Any], **values: Any) -> dict[str, Any]:
    return {**section, **values}


def qwen2_5_vl() -> dict[str, Any]:
    cfg = copy.deepcopy(model_configs.load("Qwen--Qwen2.5-VL-7B-Instruct"))
    # head_dim = hidden / heads = 128 as on the 7B, so the M-RoPE sections [16, 24, 24] still cover it
    cfg.update(hidden_size=128, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
               num_key_value_heads=1, max_window_layers=2)
    cfg["vision_config"] = _shrink(cfg["vision_config"], depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                                   out_hidden_size=128, fullatt_block_indexes=[1])
    return cfg


def qwen3_vl() -> dict[str, Any]:
    cfg = copy.deepcopy(model_configs.load("Qwen--Qwen3-VL-4B-Instruct"))
    cfg["text_config"] = _shrink(cfg["text_config"], **{**TEXT, "num_attention_heads": 2, "num_key_value_heads": 1})
    cfg["vision_config"] = _shrink(cfg["vision_config"], depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                                   out_hidden_size=TEXT["hidden_size"], deepstack_visual_indexes=[0])
    return cfg


def qwen3_5() -> dict[str, Any]:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("qwen3_5").to_dict()
    cfg["architectures"] = ["Qwen3_5ForConditionalGeneration"]
    text = cfg["text_config"]
    cfg["text_config"] = _shrink(text, **{**TEXT, "num_hidden_layers": 4, "num_key_value_heads": 1},
                                 layer_types=text["layer_types"][:4], linear_num_key_heads=2,
                                 linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16)
    cfg["vision_config"] = _shrink(cfg["vision_config"], depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                                   out_hidden_size=TEXT["hidden_size"])
    return cfg


def gemma3() -> dict[str, Any]:
    cfg = copy.deepcopy(model_configs.load("google--gemma-3-4b-it"))
    cfg["text_config"] = _shrink(cfg["text_config"], **TEXT, head_dim=16, query_pre_attn_scalar=16,
                                 sliding_window=32, sliding_window_pattern=2)
    cfg["vision_config"] = _shrink(cfg["vision_config"], hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=2)
    return cfg


def gemma4() -> dict[str, Any]:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("gemma4").to_dict()
    cfg["architectures"] = ["Gemma4ForConditionalGeneration"]
    text = cfg["text_config"]
    cfg["text_config"] = _shrink(text, **TEXT, head_dim=16, hidden_size_per_layer_input=8, sliding_window=32,
                                 layer_types=["sliding_attention", "full_attention"], per_layer_config={})
    cfg["vision_config"] = _shrink(
        AutoConfig.for_model("gemma4_vision").to_dict(), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, head_dim=16)
    return cfg


def idefics3() -> dict[str, Any]:
    # SmolVLM-256M's: 512 px tiles of 16 px patches, 4x4 shuffled (scale_factor 4) -> 64 tokens a tile
    cfg = copy.deepcopy(model_configs.load("HuggingFaceTB--SmolVLM-256M-Instruct"))
    cfg["text_config"] = _shrink(cfg["text_config"], **TEXT, head_dim=16)
    cfg["vision_config"] = _shrink(cfg["vision_config"], hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, image_size=512, patch_size=16)
    return cfg


def llava() -> dict[str, Any]:
    cfg = copy.deepcopy(model_configs.load("llava-hf--llava-1.5-7b-hf"))
    cfg["text_config"] = _shrink(cfg["text_config"], **TEXT)
    cfg["vision_config"] = _shrink(cfg["vision_config"], hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, projection_dim=32)
    cfg.pop("vocab_size", None)
    return cfg


def llava_next() -> dict[str, Any]:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("llava_next").to_dict()
    cfg["architectures"] = ["LlavaNextForConditionalGeneration"]
    cfg["text_config"] = _shrink(cfg["text_config"], **TEXT)
    cfg["vision_config"] = _shrink(cfg["vision_config"], hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, projection_dim=32)
    return cfg


def mllama() -> dict[str, Any]:
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("mllama").to_dict()
    cfg["architectures"] = ["MllamaForConditionalGeneration"]
    cfg["text_config"] = _shrink(cfg["text_config"], **{**TEXT, "num_hidden_layers": 3},
                                 cross_attention_layers=[1])
    cfg["vision_config"] = _shrink(cfg["vision_config"], hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                   num_global_layers=1, attention_heads=2, intermediate_layers_indices=[0, 2],
                                   vision_output_dim=96, image_size=560)
    return cfg


CONFIGS = {f.__name__: f for f in (qwen2_5_vl, qwen3_vl, qwen3_5, gemma3, gemma4, idefics3, llava, llava_next,
                                    mllama)}
"""Family key (as in backend/core/registries/vision_families.py) -> its tiny config.json."""


def _bundled_with_merges(merges: list[tuple[str, str]], folder: Path) -> Path:
    """A copy of the bundled tokenizer in `folder` whose BPE vocabulary ends with the merged tokens."""
    import json
    import shutil

    for name in ("tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(BUNDLED / name, folder / name)
    data = json.loads((BUNDLED / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    for left, right in merges:
        vocab[left + right] = len(vocab)
        data["model"]["merges"].append([left, right])
    (folder / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False))
    return folder


def tiny_tokenizer(family: str):
    """The bundled tokenizer with the family's MERGES and image tokens added (ids from 4096 up)."""
    import tempfile

    from transformers import AutoTokenizer

    tokens = list(dict.fromkeys(FAMILY_TOKENS[family].values()))
    if family == "idefics3":
        tokens += IDEFICS3_EXTRA
    with tempfile.TemporaryDirectory() as scratch:
        source = _bundled_with_merges(MERGES[family], Path(scratch)) if family in MERGES else BUNDLED
        tokenizer = AutoTokenizer.from_pretrained(source, extra_special_tokens=TOKENIZER_ATTRIBUTES.get(family, {}))
    tokenizer.add_special_tokens({"additional_special_tokens": tokens}, replace_extra_special_tokens=False)
    return tokenizer


def tiny_config(family: str, tokenizer) -> Any:
    """The family's shrunk config with the tokenizer's ids and vocabulary (rounded up to 64)."""
    from transformers import AutoConfig

    raw = CONFIGS[family]()
    vocab = (len(tokenizer) + 63) // 64 * 64
    text = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    text.update(vocab_size=vocab, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "gemma4":
        text["vocab_size_per_layer_input"] = vocab
    for key, token in FAMILY_TOKENS[family].items():
        raw[key] = tokenizer.convert_tokens_to_ids(token)
    return AutoConfig.for_model(**{k: v for k, v in raw.items() if k != "transformers_version"})


def tiny_image_processor(family: str, config: Any):
    """The family's PIL image processor, set to the config's patch, merge and tile sizes (small caps so a
    test image stays a few hundred tokens)."""
    import transformers

    cls = getattr(transformers, PROCESSOR_PIL[family])
    vision = config.vision_config
    if family in ("qwen2_5_vl", "qwen3_vl", "qwen3_5"):
        return cls(patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
                   temporal_patch_size=vision.temporal_patch_size,
                   size={"shortest_edge": 56 * 56, "longest_edge": 256 * 256})
    if family == "gemma3":
        return cls(size={"height": vision.image_size, "width": vision.image_size})
    if family == "gemma4":
        return cls(patch_size=vision.patch_size, pooling_kernel_size=vision.pooling_kernel_size, max_soft_tokens=70)
    if family == "idefics3":
        return cls(size={"longest_edge": 2 * vision.image_size}, max_image_size={"longest_edge": vision.image_size})
    if family == "llava":
        side = vision.image_size
        return cls(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    if family == "llava_next":
        side = vision.image_size
        return cls(size={"shortest_edge": side}, crop_size={"height": side, "width": side},
                   image_grid_pinpoints=config.image_grid_pinpoints)
    if family == "mllama":
        return cls(size={"height": vision.image_size, "width": vision.image_size}, max_image_tiles=vision.max_num_tiles)
    raise KeyError(family)


PROCESSORS = {
    "qwen2_5_vl": "Qwen2_5_VLProcessor", "qwen3_vl": "Qwen3VLProcessor", "qwen3_5": "Qwen3VLProcessor",
    "gemma3": "Gemma3Processor", "gemma4": "Gemma4Processor", "idefics3": "Idefics3Processor",
    "llava": "LlavaProcessor", "llava_next": "LlavaNextProcessor", "mllama": "MllamaProcessor",
}


def processor_class(family: str):
    """The family's transformers processor; for NEEDS_VIDEO families the image-only one the backend loads
    (backend/training/model/vision_processor.py)."""
    import transformers

    from backend.training.model.vision_processor import WITH_VIDEO, image_only

    return image_only(WITH_VIDEO[family]) if family in NEEDS_VIDEO else getattr(transformers, PROCESSORS[family])


def tiny_processor(family: str, config: Any, tokenizer):
    kwargs: dict[str, Any] = {}
    if family == "gemma3":
        kwargs["image_seq_length"] = config.mm_tokens_per_image
    if family == "idefics3":
        vision = config.vision_config
        kwargs["image_seq_len"] = (vision.image_size // vision.patch_size) ** 2 // config.scale_factor ** 2
    if family in ("llava", "llava_next"):
        kwargs.update(patch_size=config.vision_config.patch_size, num_additional_image_tokens=1,
                      vision_feature_select_strategy=config.vision_feature_select_strategy)
    if family in NEEDS_VIDEO:
        kwargs["video_processor"] = None
    if family == "gemma4":
        from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor

        kwargs.update(feature_extractor=Gemma4AudioFeatureExtractor(),
                      image_seq_length=tiny_image_processor(family, config).max_soft_tokens)
    return processor_class(family)(image_processor=tiny_image_processor(family, config), tokenizer=tokenizer,
                                   **kwargs)


def load_processor(folder: Path, family: str):
    """A tiny folder's processor, read back the way the backend reads any VLM folder."""
    from backend.training.model.vision_processor import load_vision_processor

    return load_vision_processor(folder)


def build_tiny_vlm(family: str, folder: Path, *, seed: int = 0) -> Path:
    """Write a random-weight `family` model (safetensors), its processor and tokenizer into `folder`."""
    import torch
    from transformers import AutoModelForImageTextToText

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer(family)
    config = tiny_config(family, tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    model.save_pretrained(folder)
    processor = tiny_processor(family, config, tokenizer)
    if family in NEEDS_VIDEO:
        processor.image_processor.save_pretrained(folder)
        tokenizer.save_pretrained(folder)  # Gemma 4's audio feature extractor would overwrite the same file
    else:
        processor.save_pretrained(folder)
    return folder


def image(width: int, height: int, seed: int = 0):
    """A generated RGB image: random noise, so no two patches are alike."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, "RGB")


PROMPT_IMAGE = {
    "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>", "qwen3_vl": "<|vision_start|><|image_pad|><|vision_end|>",
    "qwen3_5": "<|vision_start|><|image_pad|><|vision_end|>", "gemma3": "<start_of_image>", "gemma4": "<|image|>",
    "idefics3": "<image>", "llava": "<image>", "llava_next": "<image>", "mllama": "<|image|>",
}
"""What a prompt holds where one image goes; the processor expands it to the image's tokens."""


def image_token_id(family: str, config: Any) -> int:
    """The id the processor repeats once per image token (Gemma 3 and 4: the soft token, not boi)."""
    key = next(k for k in FAMILY_TOKENS[family] if k.startswith("image_token"))
    return getattr(config, key)
