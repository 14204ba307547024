"""A tiny random model of every proven vision-language family, built from its real config shape
(tests/vision_models.py), saved with its processor and tokenizer, loads back through transformers and
runs one forward on generated images; the image tokens its processor writes are the registry's count."""

from __future__ import annotations

import json
import math

import pytest

from backend.core.registries.vision_families import VISION_FAMILIES
from backend.core.vision_folder import VisionFolder
from tests import vision_models

FAMILIES = ["qwen2_5_vl", "qwen3_vl", "qwen3_5", "gemma3", "gemma4", "idefics3", "llava", "llava_next", "mllama"]


def test_every_proven_family_has_a_tiny_model():
    assert set(vision_models.CONFIGS) == set(VISION_FAMILIES) == set(FAMILIES)


def test_the_tiny_smolvlm_holds_the_newlines_llama_cpps_idefics3_template_looks_up():
    # mtmd.cpp's lookup_token wants "\n\n" and "\n" as single tokens, as SmolVLM's vocabulary has them
    tokenizer = vision_models.tiny_tokenizer("idefics3")
    for text in ("\n\n", "\n"):
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert len(ids) == 1 and tokenizer.decode(ids) == text
    assert tokenizer.convert_tokens_to_ids("<image>") == vision_models.tiny_config("idefics3", tokenizer).image_token_id


@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_vlm_loads_and_runs_one_forward_with_images(family, tmp_path):
    import torch
    from transformers import AutoImageProcessor, AutoModelForImageTextToText

    folder = vision_models.build_tiny_vlm(family, tmp_path / family)
    vision = VisionFolder.read(folder)
    assert vision.is_vlm and vision.family is VISION_FAMILIES[family] and not vision.refusal
    assert type(AutoImageProcessor.from_pretrained(folder)).__name__.endswith("Pil")  # no torchvision needed
    processor = vision_models.load_processor(folder, family)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    token_id = vision_models.image_token_id(family, model.config)
    assert vision.family.image_token_id(vision.config) == token_id
    for width, height in [(300, 200), (150, 420)]:
        text = vision_models.PROMPT_IMAGE[family] + " what is in it?"
        inputs = processor(images=[vision_models.image(width, height)], text=[text], return_tensors="pt")
        assert int((inputs["input_ids"] == token_id).sum()) == vision.tokens_per_image(width, height), (width, height)
        with torch.no_grad():
            logits = model(**inputs).logits
        assert logits.shape[:2] == inputs["input_ids"].shape and math.isfinite(float(logits[0, -1].sum()))


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_next"])
def test_parts_add_up_to_the_model_and_name_its_tower(family, tmp_path):
    from transformers import AutoModelForImageTextToText

    from backend.training.model.vision_parts import LANGUAGE, PROJECTOR, TOWER, count_parts

    folder = vision_models.build_tiny_vlm(family, tmp_path / family)
    model = AutoModelForImageTextToText.from_pretrained(folder)
    parts = count_parts(VisionFolder.read(folder).config)
    assert sum(parts.values()) == sum(p.numel() for p in model.parameters())
    tower = model.model.visual if family == "qwen2_5_vl" else model.model.vision_tower
    projector = model.model.visual.merger if family == "qwen2_5_vl" else model.model.multi_modal_projector
    own = sum(p.numel() for p in projector.parameters())
    assert parts[TOWER] == sum(p.numel() for p in tower.parameters()) - (own if family == "qwen2_5_vl" else 0)
    assert parts[PROJECTOR] == own + (model.model.image_newline.numel() if family == "llava_next" else 0)
    assert parts[LANGUAGE] > parts[TOWER] > 0


def test_the_processor_loader_refuses_a_folder_without_processor_files(tmp_path):
    from backend.core.errors import JobError
    from backend.training.model.vision_processor import load_vision_processor
    from tests import model_configs

    (tmp_path / "config.json").write_text(json.dumps(model_configs.load("Qwen--Qwen2.5-VL-7B-Instruct")))
    with pytest.raises(JobError, match="no preprocessor_config.json or processor_config.json"):
        load_vision_processor(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "paligemma", "vision_config": {}}))
    with pytest.raises(JobError, match="'paligemma' is a vision-language model this studio has not proven"):
        load_vision_processor(tmp_path)
