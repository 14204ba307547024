"""The bundled vision demo (resources/presets/tiny_vision.yaml, scripts/make_tiny_vision.py): the preset loads,
its data reads with its images, its model folder is a proven VLM; the train + eval run that the README's
figures come from is slow."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

from backend.core.config.run_config import RunConfig
from backend.core.data.examples import DatasetReader
from backend.core.paths import resolve_resource
from backend.core.vision_folder import VisionFolder
from tests.conftest import ROOT

PRESET = ROOT / "resources" / "presets" / "tiny_vision.yaml"
ANSWER = re.compile(r"A (red|green|blue|yellow) (circle|square|triangle)\.")


def test_the_preset_loads_and_names_the_bundled_vlm_and_images():
    config = RunConfig.load(PRESET)
    assert config.model.path == "bundled:tiny_vision" and config.data.validation_split > 0
    vision = VisionFolder.read(resolve_resource(config.model.path))
    assert vision.is_vlm and vision.family is not None and not vision.refusal
    assert vision.family.key == "qwen2_5_vl"
    assert vision.tokens_per_image(112, 112) == 16
    examples = DatasetReader(resolve_resource(config.data.path), max_images=1).examples()
    assert len(examples) == 480 and all(len(e.images) == 1 for e in examples)
    assert {(e.images[0].width, e.images[0].height) for e in examples} == {(112, 112)}
    answers = [e.messages[-1]["content"] for e in examples]
    assert all(ANSWER.fullmatch(a) for a in answers)
    assert set(Counter(answers).values()) == {40}  # 12 classes, 40 images each
    names = [e.images[0].path.name for e in examples]
    assert all(n.startswith(a[2:-1].replace(" ", "_")) for n, a in zip(names, answers))


@pytest.mark.slow
def test_the_tuned_model_names_held_out_images_and_the_base_does_not(capsys):
    from backend.cli.app import main
    from backend.core.paths import runs_dir

    assert main(["train", str(PRESET)]) == 0
    run = next(runs_dir().glob("*-tiny-vision-*"))
    assert main(["eval", str(run)]) == 0
    report = json.loads((run / "eval_report.json").read_text())
    em = report["exact_match"]
    assert em["held_out"] and em["n"] == 48
    assert em["base"]["hits"] == 0 and em["tuned"]["accuracy"] >= 0.5
