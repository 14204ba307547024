"""Calibrated exports of a vision-language run (backend/export/calibrated/vision_capture.py): the language
model's decoder layers calibrated on the run's own image rows and packed, the vision tower and projector kept
16-bit (byte for byte the merged export's) on compressed-tensors' ignore list, reloaded with
AutoModelForImageTextToText and checked on the image rows. Every calibrated format runs on one family; tiny
random VLMs (tests/vision_models.py) trained 2 steps through the CLI on generated images."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from backend.core.registries.export_formats import CALIBRATED, vision_refusal
from backend.core.registries.vision_families import VISION_FAMILIES
from tests import vision_models
from tests.backend.test_vision_export import image_inputs

CASES = [("qwen2_5_vl", "gptq-int4"), ("gemma3", "awq-int4"), ("llava", "w8a8")] + [
    pytest.param(*case, marks=pytest.mark.slow) for case in (("idefics3", "gptq-int4"), ("qwen3_vl", "awq-int4"))]
"""Every proven family with one format, every calibrated format at least once in the fast suite (about 15 s each
on two shared cores past the imports: training and two exports, in-process); the layer-by-layer test below
checks every family's calibration inputs in about a second each."""


def train_here(tmp: Path, family: str) -> Path:
    """A finished 2-step LoRA run of the family's tiny VLM, its projector tuned full, trained in this process
    (no worker to start: half the time of test_vision_export.train)."""
    from tests.backend.test_export import _train
    from tests.backend.test_vision_training import write_data

    folder = vision_models.build_tiny_vlm(family, tmp / family)
    sets = [f"model.path={folder}", f"data.path={write_data(tmp / 'data')}", "data.validation_split=0",
            "train.max_steps=2", "train.seq_len=2048", "train.learning_rate=0.01", "vision.projector=full"]
    return _train(tmp / "runs", family, *sets).path


def tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for path in sorted(folder.glob("*.safetensors")):
        out.update(load_file(path))
    return out


@pytest.mark.parametrize("family,fmt", CASES)
def test_a_vlm_runs_calibrated_export_quantizes_the_language_model_only_and_passes(family, fmt, tmp_path):
    import torch
    from transformers import AutoModelForImageTextToText

    from backend.core.runs.run_folder import RunFolder
    from backend.training.model import packed_zero_points
    from tests.backend.test_export import export

    spec = VISION_FAMILIES[family]
    run = train_here(tmp_path, family)
    assert export(RunFolder(run), "merged")[1]["outcome"] == "passed"
    events, report = export(RunFolder(run), fmt, calibration_samples=4)
    out = run / "exports" / fmt
    assert events[-1]["type"] == "JobFinished", events[-1]
    assert report["outcome"] == "passed" and "compressed-tensors" in report["loaded_as"]
    assert "rows with their images" in next(c for c in report["checks"] if c["name"] == "perplexity")["what"]
    assert any(n.startswith("calibrated on 4 rows of the run's training data (3 with their images") for n in
               report["notes"]), report["notes"]
    assert any("kept 16-bit: embeddings, norms, the vision tower" in n and "lm_head" in n for n in report["notes"])

    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors" and "lm_head" in quant["ignore"]
    parts = {p.rstrip(".").rsplit(".", 1)[-1] for p in spec.tower + spec.projector}  # visual, vision_tower, ...
    assert {f"re:.*{part}.*" for part in parts} <= set(quant["ignore"])
    assert {p.name for p in out.iterdir()} & {"preprocessor_config.json", "processor_config.json"}

    # Checkpoint names (Qwen2.5-VL saves `visual.*` and `model.layers.*`), the same in both folders.
    merged, written = tensors(run / "exports" / "merged"), tensors(out)
    def image_side(names):
        return [n for n in names if any(part in n.split(".") for part in parts)]

    assert image_side(merged) and image_side(written) == image_side(merged)  # no scale or packed tensor among them
    assert all(written[n].dtype == torch.bfloat16 and torch.equal(written[n], merged[n]) for n in image_side(merged))
    language = [n for n in written if ".layers." in n and n not in image_side(written)]
    if fmt == "w8a8":  # int8 weights beside their scales
        assert all(written[n].dtype == torch.int8 for n in language if n.endswith("_proj.weight"))
    else:  # int4 packed into int32, no 16-bit weight left
        assert not any(n.endswith("_proj.weight") for n in language)
        assert all(written[n].dtype == torch.int32 for n in language if n.endswith("weight_packed"))
    assert sum(n.endswith(("_proj.weight", "weight_packed")) for n in language) == 7 * 2  # 2 layers of 7 linears

    packed_zero_points.allow()
    model = AutoModelForImageTextToText.from_pretrained(out, dtype=torch.bfloat16)
    quantized = {n for n, m in model.named_modules() if getattr(m, "quantization_scheme", None) is not None}
    assert quantized and all(n.startswith(spec.calibrated_layers + ".") for n in quantized)
    assert len(quantized) == 7 * 2


def test_a_family_not_proven_is_refused_in_one_line_naming_the_proven_ones():
    from backend.export.calibrated.support import refusal

    unproven = [f for f in VISION_FAMILIES.values() if not f.calibrated_layers]
    assert unproven
    for fmt in CALIBRATED:
        line, fix = vision_refusal(fmt, unproven[0].label)
        assert line.startswith(f"{fmt} of a {unproven[0].label} run is not proven") and "Qwen2.5-VL" in line
        assert fmt not in fix and "merged" in fix
        assert vision_refusal(fmt, VISION_FAMILIES["qwen2_5_vl"].label) is None
        config = {"model_type": unproven[0].model_types[0], "vision_config": {}}
        assert "not proven (proven: Qwen2.5-VL" in refusal(fmt, config)
        assert refusal(fmt, {"model_type": "qwen2_5_vl", "vision_config": {}, "text_config": {}}) == ""


@pytest.mark.parametrize("family", [f.key for f in VISION_FAMILIES.values() if f.calibrated_layers])
def test_the_layer_by_layer_runs_on_an_image_row_reproduce_the_whole_models_forward(family, tmp_path):
    """collect.capture fed an image row (pixels, grids, masks) then each decoder layer run alone, as the
    calibration runs them, give the language model's own last hidden states: the image embeddings, M-RoPE
    positions, Gemma 3's image masks and Qwen3-VL's deepstack additions (vision_capture.between_layers) all
    reach the layers. Without the deepstack replay Qwen3-VL's differ."""
    import torch
    from transformers import AutoModelForImageTextToText

    from backend.export.calibrated.collect import capture
    from backend.export.calibrated.layers import decoder_layers
    from backend.export.calibrated.vision_capture import ImageRows, between_layers

    folder = vision_models.build_tiny_vlm(family, tmp_path / family)
    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
    inputs = image_inputs(folder, family)
    image_id = vision_models.image_token_id(family, model.config)
    assert (inputs["input_ids"] == image_id).sum() > 0
    final = {}
    language = model.get_decoder()
    handle = language.norm.register_forward_pre_hook(lambda m, args: final.setdefault("hidden", args[0]))
    with torch.no_grad():
        model(**inputs, use_cache=False)
    handle.remove()
    prefix, stack = decoder_layers(model)
    assert prefix == VISION_FAMILIES[family].calibrated_layers

    def layer_by_layer(replay: bool) -> torch.Tensor:
        rows = ImageRows([{"input_ids": inputs["input_ids"][0].tolist(), "inputs": inputs}], torch.float32)
        with torch.no_grad(), (between_layers(model, stack) if replay else contextlib.nullcontext()):
            batch = capture(model, stack, rows, None)[0]
            for index, layer in enumerate(stack):
                batch.hidden = batch.run(layer, index)
        return batch.hidden

    assert torch.allclose(layer_by_layer(True), final["hidden"], atol=1e-5)
    if hasattr(language, "_deepstack_process"):
        assert not torch.allclose(layer_by_layer(False), final["hidden"], atol=1e-3)
