"""The registry's image-token arithmetic against transformers' own PIL image processors, on the real
configs (Qwen2.5-VL-7B, Qwen3-VL-4B, LLaVA-1.5-7b) and the families' config defaults; a few image sizes
each, odd aspects and sizes above the caps included. No model is built; no torchvision is needed."""

from __future__ import annotations

import pytest

from backend.core.registries.vision_families import BY_MODEL_TYPE, VISION_FAMILIES, proven_labels, smart_resize
from tests import model_configs
from tests.vision_models import image

SIZES = [(640, 480), (300, 200), (97, 1031), (1280, 720), (1500, 1500)]


def _qwen_processor(config, max_pixels):
    from transformers import Qwen2VLImageProcessorPil

    vision = config["vision_config"]
    return Qwen2VLImageProcessorPil(patch_size=vision["patch_size"], merge_size=vision["spatial_merge_size"],
                                    size={"shortest_edge": 56 * 56, "longest_edge": max_pixels})


@pytest.mark.parametrize("fixture", ["Qwen--Qwen2.5-VL-7B-Instruct", "Qwen--Qwen3-VL-4B-Instruct"])
@pytest.mark.parametrize("max_pixels", [200_704, 1_003_520])
def test_qwen_tokens_match_the_image_processor(fixture, max_pixels):
    config = model_configs.load(fixture)
    family = BY_MODEL_TYPE[config["model_type"]]
    processor = _qwen_processor(config, max_pixels)
    merge = config["vision_config"]["spatial_merge_size"]
    for width, height in SIZES:
        grid = processor(images=[image(width, height)], return_tensors="np")["image_grid_thw"][0]
        expected = int(grid.prod()) // merge ** 2
        assert family.tokens_per_image(config, width, height, max_pixels) == expected, (fixture, width, height)
    # the folder's own setting is read when no cap is given
    settings = {"size": {"shortest_edge": 3136, "longest_edge": max_pixels}}
    assert family.tokens_per_image(config, 640, 480, processor=settings) == family.tokens_per_image(
        config, 640, 480, max_pixels)


def test_smart_resize_keeps_the_area_under_the_cap_and_sides_on_the_grid():
    for height, width in [(480, 640), (1031, 97), (5000, 3000)]:
        h, w = smart_resize(height, width, 28, 3136, 1_003_520)
        assert h % 28 == 0 and w % 28 == 0 and 3136 <= h * w <= 1_003_520


@pytest.mark.parametrize("budget", [70, 280, 1120])
def test_gemma4_tokens_match_the_image_processor(budget):
    from transformers import AutoConfig, Gemma4ImageProcessorPil

    config = AutoConfig.for_model("gemma4", vision_config={"model_type": "gemma4_vision"}).to_dict()
    processor = Gemma4ImageProcessorPil(max_soft_tokens=budget)
    family = VISION_FAMILIES["gemma4"]
    for width, height in SIZES:
        out = processor(images=[image(width, height)])
        assert family.tokens_per_image(config, width, height, budget) == out["num_soft_tokens_per_image"][0]


@pytest.mark.parametrize("longest", [1024, 1536])
def test_idefics3_tokens_match_the_image_processor(longest):
    from transformers import Idefics3ImageProcessorPil

    config = {"model_type": "idefics3", "scale_factor": 4, "vision_config": {"image_size": 512, "patch_size": 16}}
    processor = Idefics3ImageProcessorPil(size={"longest_edge": longest}, max_image_size={"longest_edge": 512})
    family = VISION_FAMILIES["idefics3"]
    for width, height in SIZES:
        out = processor(images=[[image(width, height)]], return_row_col_info=True)
        rows, cols = out["rows"][0][0], out["cols"][0][0]
        expected = 64 * (rows * cols + 1) if rows or cols else 64  # processing_idefics3: grid + the whole image
        assert family.tokens_per_image(config, width, height, longest) == expected, (width, height)


def test_llava_tokens_match_the_clip_processor():
    from transformers import CLIPImageProcessorPil

    config = model_configs.load("llava-hf--llava-1.5-7b-hf")
    side = config["vision_config"]["image_size"]
    processor = CLIPImageProcessorPil(size={"shortest_edge": side}, crop_size={"height": side, "width": side})
    for width, height in SIZES[:2]:
        pixels = processor(images=[image(width, height)], return_tensors="np")["pixel_values"][0]
        expected = (pixels.shape[-2] // 14) * (pixels.shape[-1] // 14)  # + 1 CLS, - 1 for the "default" strategy
        assert VISION_FAMILIES["llava"].tokens_per_image(config, width, height) == expected == 576


def test_every_family_names_its_parts_and_its_image_token_id_key():
    for family in VISION_FAMILIES.values():
        assert family.tower and family.projector and family.model_types and family.cap_key
        assert family.image_token_id_key in ("image_token_id", "image_token_index")
    assert "Qwen2.5-VL" in proven_labels() and "Mllama" in proven_labels()


def test_fixture_image_token_ids_are_read_from_their_config():
    for name, expected in [("Qwen--Qwen2.5-VL-7B-Instruct", 151655), ("Qwen--Qwen3-VL-4B-Instruct", 151655),
                           ("llava-hf--llava-1.5-7b-hf", 32000)]:
        config = model_configs.load(name)
        assert BY_MODEL_TYPE[config["model_type"]].image_token_id(config) == expected


def test_an_empty_image_is_refused():
    with pytest.raises(ValueError, match="no tokens"):
        VISION_FAMILIES["llava"].tokens_per_image({}, 0, 10)


def test_only_gemma3_text_rows_with_frozen_parts_keep_the_text_path():
    from backend.core.registries.vision_families import takes_image_door

    gemma3, qwen = model_configs.load("google--gemma-3-4b-it"), model_configs.load("Qwen--Qwen2.5-VL-7B-Instruct")
    assert not takes_image_door(gemma3, "frozen", "frozen", 0)  # text rows: shortcuts and objectives, as before
    assert takes_image_door(gemma3, "frozen", "frozen", 1) and takes_image_door(gemma3, "frozen", "frozen", None)
    assert takes_image_door(gemma3, "lora", "frozen", 0) and takes_image_door(gemma3, "frozen", "full", 0)
    assert takes_image_door(qwen, "frozen", "frozen", 0)  # no causal-LM class loads it: always the image door
    assert not takes_image_door(model_configs.load("google--gemma-3-1b-it"), "frozen", "frozen", None)  # no tower


def test_gemma3_text_rows_are_estimated_with_the_text_paths_logits():
    from backend.core.config.run_config import RunConfig
    from backend.estimate.estimator import estimate

    config, run = model_configs.load("google--gemma-3-4b-it"), RunConfig()
    run = run.model_copy(update={"train": run.train.model_copy(update={"seq_len": 1024})})
    text = estimate(config, run, images_per_row=0, target_tokens=100)  # 100 answer tokens a row
    images = estimate(config, run, images_per_row=1, target_tokens=100)
    assert text.logits < images.logits / 4  # the text path's logits only where the loss looks
