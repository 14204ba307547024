"""Recognising a vision-language folder: a proven family, a text model, or one line refusing a family
transformers has but this studio has not proven (and the model check refuses it the same way)."""

from __future__ import annotations

import json

import pytest

from backend.core.registries.vision_families import VISION_FAMILIES
from backend.core.vision_folder import KNOWN_VLM_TYPES, VisionFolder
from tests import model_configs


def _folder(tmp_path, config, **files):
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    for name, value in files.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(value), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("name, family", [("Qwen--Qwen2.5-VL-7B-Instruct", "qwen2_5_vl"),
                                          ("Qwen--Qwen3-VL-4B-Instruct", "qwen3_vl"),
                                          ("llava-hf--llava-1.5-7b-hf", "llava"), ("google--gemma-3-4b-it", "gemma3")])
def test_real_configs_are_recognised(name, family, tmp_path):
    vision = VisionFolder.read(_folder(tmp_path, model_configs.load(name)))
    assert vision.is_vlm and vision.family is VISION_FAMILIES[family] and vision.refusal == ""


@pytest.mark.parametrize("name", ["google--gemma-3-1b-it", "Qwen--Qwen3-8B", "meta-llama--Llama-3.2-1B-Instruct"])
def test_text_models_are_not_vlms(name, tmp_path):
    assert not VisionFolder.read(_folder(tmp_path, model_configs.load(name))).is_vlm


@pytest.mark.parametrize("config", [
    {"model_type": "paligemma", "image_token_index": 257152, "vision_config": {"model_type": "siglip_vision_model"}},
    {"model_type": "internvl_chat", "vision_config": {"image_size": 448}},  # remote code: the tower tells
    {"model_type": "llava_onevision", "image_token_index": 151646},
    {"model_type": "llava", "image_token_index": 10, "vision_config": {"model_type": "pixtral"}},  # Pixtral-12B
])
def test_unproven_families_are_refused_in_one_line_naming_the_proven(config, tmp_path):
    vision = VisionFolder.read(_folder(tmp_path, config))
    assert vision.is_vlm and vision.family is None
    assert "\n" not in vision.refusal and str(tmp_path / "config.json") in vision.refusal
    assert f"model_type '{config['model_type']}'" in vision.refusal
    assert all(family.label in vision.refusal for family in VISION_FAMILIES.values())


def test_the_model_check_refuses_an_unproven_vlm_with_that_line(tmp_path):
    from backend.core.errors import JobError
    from backend.training.model.model_check import check_files

    folder = _folder(tmp_path, {"model_type": "paligemma", "image_token_index": 257152,
                                "vision_config": {"model_type": "siglip_vision_model"}, "text_config": {}})
    with pytest.raises(JobError, match="not proven; proven: Qwen2.5-VL"):
        check_files(folder, json.loads((folder / "config.json").read_text()), False, False)


def test_the_processor_files_set_the_cap(tmp_path):
    config = model_configs.load("Qwen--Qwen2.5-VL-7B-Instruct")
    folder = _folder(tmp_path, config, preprocessor_config={"min_pixels": 3136, "max_pixels": 12845056,
                                                            "patch_size": 14, "merge_size": 2})
    vision = VisionFolder.read(folder)
    assert vision.cap == 12845056 and vision.processor_files == "preprocessor_config.json"
    assert vision.tokens_per_image(1024, 768) == 37 * 27  # smart_resize: 1036 x 756 (sides rounded to 28), 2x2 merged
    assert vision.largest_tokens() == 16384  # 3584 x 3584 at most: 128 x 128 merged patches


def test_known_vlm_types_are_transformers_image_text_to_text_table():
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES

    assert KNOWN_VLM_TYPES == set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES)
    assert {t for f in VISION_FAMILIES.values() for t in f.model_types} <= KNOWN_VLM_TYPES
