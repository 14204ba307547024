"""The facade's door to a VLM folder: part counts come from a subprocess on the meta device (the studio
never imports torch), once per folder until its config.json changes."""

from __future__ import annotations

import json

import pytest

from backend.api import vision
from tests import model_configs


def test_part_counts_of_the_real_llava_config_in_a_subprocess(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(model_configs.load("llava-hf--llava-1.5-7b-hf")))
    parts = vision.part_counts(tmp_path)
    assert parts == {"vision tower": 303_507_456, "projector": 20_979_712, "language model": 6_738_939_904}
    (tmp_path / "config.json").write_text("{}")  # the folder changed: the kept count is not reused
    with pytest.raises(RuntimeError, match="not a proven vision-language family"):
        vision.part_counts(tmp_path)


def test_the_counting_module_answers_one_json_line(tmp_path, capsys):
    from backend.training.model.vision_parts import main

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "paligemma", "vision_config": {}}))
    assert main([str(tmp_path)]) == 1
    line = capsys.readouterr().out.strip()
    assert "\n" not in line and "not a proven vision-language family" in json.loads(line)["error"]


def test_data_rules_for_the_data_page(tmp_path):
    text, vlm, odd = tmp_path / "text", tmp_path / "vlm", tmp_path / "odd"
    for folder, config in [(text, model_configs.load("Qwen--Qwen3-8B")),
                           (vlm, model_configs.load("llava-hf--llava-1.5-7b-hf")),
                           (odd, {"model_type": "paligemma", "vision_config": {}})]:
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
    assert vision.data_rules(text) == (None, 0)  # a text model takes no image
    tokens, most = vision.data_rules(vlm)
    assert tokens(640, 480) == 576 and most is None
    assert vision.data_rules(odd) == (None, None) and vision.data_rules(None) == (None, None)
