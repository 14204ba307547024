"""The VLM estimate's image side: tower and projector parameters as transformers builds them, the
per-image activations and pixels against a measurement (bench/estimate_vision.py) on tiny models, the rows
for each tuning, image tokens inside seq_len, and "Longest that fits" leaving room for them."""

from __future__ import annotations

import pytest

from backend.core.config.run_config import RunConfig
from backend.estimate import GIB, estimate
from backend.estimate.seq_len import longest_seq_len, run_total
from backend.estimate.vision_towers import READERS, tower_shape
from tests import model_configs, vision_models

QWEN = model_configs.CONFIGS_DIR / "Qwen--Qwen2.5-VL-7B-Instruct"
GEMMA = model_configs.CONFIGS_DIR / "google--gemma-3-4b-it"


def run(method: str = "lora", tower: str = "frozen", projector: str = "frozen", seq_len: int = 2048,
        max_pixels: int | None = None) -> RunConfig:
    return RunConfig.model_validate({
        "model": {"path": "x"}, "data": {"path": "x.jsonl"},
        "technique": {"method": method, "gradient_checkpointing": True},
        "train": {"seq_len": seq_len, "micro_batch_size": 1},
        "vision": {"tower": tower, "projector": projector, "max_pixels": max_pixels}})


@pytest.mark.parametrize("family", sorted(READERS))
def test_tower_and_projector_parameters_are_what_transformers_builds(family):
    from backend.training.model.vision_parts import PROJECTOR, TOWER, count_parts

    config = vision_models.CONFIGS[family]()
    parts = count_parts(config)
    shape = tower_shape(config, family)
    assert (shape.tower_params, shape.projector_params) == (parts[TOWER], parts[PROJECTOR])


@pytest.mark.parametrize("family", ["gemma3", "gemma4", "qwen2_5_vl", "llava",
                                    pytest.param("mllama", marks=pytest.mark.slow)])  # its 6432^2 masks: 20 s
def test_image_side_is_within_ten_percent_of_the_measured_at_a_held_out_shape(family):
    """Width 48, intermediate 160, depth 3: none of the shapes the coefficients were measured at."""
    from bench.estimate_vision import compare, measure

    pixels = 448 * 448
    rows = compare(measure(family, pixels, (48, 160, 3)), pixels)
    for key, row in rows.items():
        assert row["ratio"] == pytest.approx(1, abs=0.10), (key, row)
    assert rows["tower_params"]["ratio"] == rows["projector_params"]["ratio"] == rows["pixel_bytes"]["ratio"] == 1


def test_rows_follow_each_parts_tuning():
    frozen = estimate(GEMMA, run(), device="cuda")
    lora = estimate(GEMMA, run(tower="lora"), device="cuda")
    full = estimate(GEMMA, run(tower="full", projector="full"), device="cuda")
    v = frozen.details["vision"]
    assert v["tower"]["parameters"] == 416_866_032 and v["projector"]["parameters"] == 2_950_272
    assert frozen.vision_tower == 416_866_032 * 2 and v["activations_held"] is False  # 16-bit, no graph
    assert frozen.vision_tower < lora.vision_tower < full.vision_tower
    assert lora.details["vision"]["tower"]["trained"] > 0 and lora.details["vision"]["activations_held"]
    # full: fp32 weights under autocast, their gradients, AdamW's two moments (16 bytes a parameter)
    assert full.vision_tower == pytest.approx(416_866_032 * 16, rel=1e-3)
    assert frozen.vision_activations < lora.vision_activations
    assert frozen.total_bytes < lora.total_bytes < full.total_bytes
    for b in (frozen, lora, full):
        assert {"vision_tower", "projector", "vision_activations", "pixel_values"} <= set(b.breakdown())
        assert "vision_tower" in b.format_table() and "image tokens" in b.format_table()


def test_qlora_holds_the_unquantized_tower_16_bit_and_images_scale_the_per_image_rows():
    one = estimate(QWEN, run("qlora", max_pixels=301056), device="cuda", images_per_row=1)
    two = estimate(QWEN, run("qlora", max_pixels=301056), device="cuda", images_per_row=2)
    # in the skip list, and kept 16-bit past prepare_model_for_kbit_training (keep_image_side_dtype)
    assert one.vision_tower == one.details["vision"]["tower"]["parameters"] * 2
    full = estimate(QWEN, run("qlora", max_pixels=301056, projector="full"), device="cuda", images_per_row=1)
    assert full.details["vision"]["projector"]["weights"] == full.details["vision"]["projector"]["parameters"] * 4
    assert one.details["vision"]["image_tokens_per_row"] == 384  # 301,056 / 28^2
    assert two.pixel_values == 2 * one.pixel_values and two.vision_activations == 2 * one.vision_activations
    assert not any("assumed" in w for w in one.details["warnings"])
    unknown = estimate(QWEN, run("qlora", max_pixels=301056), device="cuda")
    assert any("1 image per row assumed" in w for w in unknown.details["warnings"])
    text = estimate(QWEN, run("qlora"), device="cuda", images_per_row=0)  # text-only data: loaded, never run
    assert text.vision_tower == one.vision_tower and text.details["vision"]["image_tokens_per_row"] == 0
    assert "vision_activations" not in text.breakdown() and "pixel_values" not in text.breakdown()
    assert text.total_bytes < one.total_bytes


def test_image_tokens_past_seq_len_are_said():
    b = estimate(QWEN, run("qlora", seq_len=256, max_pixels=301056), device="cuda", images_per_row=1)
    assert any("leaves no text beside 384 image tokens" in w and "vision.max_pixels" in w
               for w in b.details["warnings"])


def test_longest_seq_len_leaves_room_for_a_rows_image_tokens():
    config = run("qlora", max_pixels=301056)
    raw = model_configs.load("Qwen--Qwen2.5-VL-7B-Instruct")
    caps = None
    from backend.core.device_caps import device_caps

    caps = device_caps("cuda", True, ())
    total = run_total("cuda", caps=caps, model_config=raw, images_per_row=1)
    answer = longest_seq_len(config, int(16 * GIB * 0.95), total, raw, images_per_row=1)
    assert answer.image_tokens == 384 and answer.seq_len is not None and answer.seq_len > 384
    assert "384 of them a row's image tokens" in answer.sentence("a 16 GB card")
    tight = longest_seq_len(config, total(config.model_copy(update={"train": config.train.model_copy(
        update={"seq_len": 300})})), total, raw, images_per_row=1)
    assert tight.seq_len is None and "image tokens a row" in tight.sentence("here")


def test_the_vlm_presets_hold_their_cost_lines():
    """The issue's VLM presets (SmolVLM-256M's on a config.json assembled from copies, see the fixtures' README)."""
    from backend.api.presets import list_presets
    from tests.conftest import ROOT

    presets = {p.hub_id: p for p in list_presets(ROOT / "resources" / "presets") if p.hub_id}
    for hub_id, method, card in (("Qwen/Qwen2.5-VL-7B-Instruct", "qlora", "16 GB"),
                                 ("google/gemma-3-4b-it", "lora", "24 GB"),
                                 ("HuggingFaceTB/SmolVLM-256M-Instruct", "lora", "8 GB")):
        preset = presets[hub_id]
        config = RunConfig.load(preset.path)
        assert (config.technique.method, preset.card_label) == (method, card)
        b = estimate(model_configs.CONFIGS_DIR / hub_id.replace("/", "--"), config, device="cuda")
        tokens = b.details["vision"]["image_tokens_per_row"]
        assert f"estimated peak {b.total_bytes / GIB:.1f} GiB" in preset.cost
        assert f"vision tower {b.vision_tower / GIB:.1f}" in preset.cost and f"{tokens:,} of them image tokens" in preset.cost


@pytest.mark.parametrize("family,tower", [("qwen2_5_vl", "frozen"), ("llava", "lora"),
                                         pytest.param("idefics3", "frozen", marks=pytest.mark.slow),
                                         pytest.param("gemma4", "lora", marks=pytest.mark.slow)])
def test_a_real_step_of_ours_peaks_within_ten_percent_of_the_estimate(family, tower, tmp_path):
    """bench/estimate_vision.py --step: the training door's model and batch (one image at the cap), a steady
    step's peak on the CPU against the estimate's total for the same row."""
    from bench.estimate_vision import measure_step

    result = measure_step(family, tmp_path, tower=tower, projector=tower)
    assert result["ratio"] == pytest.approx(1, abs=0.10), result


def test_smolvlm_holds_the_processors_tiles_and_their_int64_pixel_mask():
    """SmolVLM's processor splits an image at its cap into tiles plus the shrunk whole, each padded with an int64
    pixel_attention_mask, one value a pixel; the estimate holds the pixels and that mask through the step (the
    real step's peak was 0.72 of the estimate's before the mask was counted) and counts get_image_features'
    copies of both while the tower runs."""
    from backend.core.registries.vision_families import VISION_FAMILIES
    from backend.estimate.vision_memory import image_side_bytes

    raw = vision_models.CONFIGS["idefics3"]()
    config = vision_models.tiny_config("idefics3", vision_models.tiny_tokenizer("idefics3"))
    processor = vision_models.tiny_image_processor("idefics3", config)
    side = VISION_FAMILIES["idefics3"].cap(raw, processor.to_dict())
    out = processor(images=[[vision_models.image(side, side)]], return_tensors="pt")
    est = image_side_bytes(raw, "idefics3", None, compute_bytes=2, images=1, processor=processor.to_dict())
    values, mask = out["pixel_values"], out["pixel_attention_mask"]
    assert values.shape[1] == 5 and mask.dtype.itemsize == 8  # 2x2 tiles and the whole
    assert est["pixel_bytes"] == values.numel() * (4 + 2) and est["pixel_extra"] == mask.numel() * 8
    assert est["forward_copies"] == values.numel() * 2 + mask.numel() * 8


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_mllama_cross_attention_saves_what_the_estimate_counts(kv_heads):
    """The language model's cross-attention layers over a tiny Mllama's vision tokens, two image sizes apart: the
    saved bytes per vision token per layer (the saved-tensor meter of bench/estimate_tensors.py) are the estimate's."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.mllama.modeling_mllama import _prepare_cross_attention_mask

    from backend.estimate.vision_rows import cross_attention_bytes
    from bench.estimate_tensors import _SavedTensorMeter, _unique_bytes

    raw = vision_models.CONFIGS["mllama"]()
    raw["text_config"].update(vocab_size=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                              num_key_value_heads=kv_heads)
    config = AutoConfig.for_model(**{k: v for k, v in raw.items() if k != "transformers_version"})
    config.text_config._attn_implementation = "sdpa"
    lm = AutoModelForImageTextToText.from_config(config).model.language_model
    lm.requires_grad_(False)
    for name, p in lm.named_parameters():
        p.requires_grad_("proj" in name)
    tiles, seq = config.vision_config.max_num_tiles, 9

    def saved(per_tile: int) -> int:
        cross = torch.randn(1, tiles * per_tile, config.text_config.hidden_size)
        mask, full = _prepare_cross_attention_mask(torch.ones(1, seq, 1, tiles, dtype=torch.int64), per_tile,
                                                   torch.float32)
        known = {(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
                 for t in [*lm.parameters(), cross, mask, full]}
        with _SavedTensorMeter() as meter:
            out = lm(input_ids=torch.randint(0, 256, (1, seq)), cross_attention_states=cross,
                     cross_attention_mask=mask, full_text_row_masked_out_mask=full)
            return _unique_bytes(meter.live() + [out.last_hidden_state], known)[0]

    grid = raw["vision_config"]["image_size"] // raw["vision_config"]["patch_size"]
    small = dict(raw, vision_config=dict(raw["vision_config"], image_size=raw["vision_config"]["patch_size"] * 20))
    measured = saved(grid * grid + 1) - saved(20 * 20 + 1)
    counted = (cross_attention_bytes(raw, 1, 0, 4) - cross_attention_bytes(small, 1, 0, 4))
    assert measured == counted


def test_the_data_gives_the_most_images_a_row(tmp_path):
    """run_estimate.data_facts and the studio's estimate read the images per row from the data profile."""
    import json

    from backend.core.data.dataset_profile import DatasetProfile

    for i in range(2):
        vision_models.image(32, 24, seed=i).save(tmp_path / f"im{i}.png")
    rows = [{"messages": [{"role": "user", "content": "<image><image>Compare."},
                          {"role": "assistant", "content": "Both noise."}], "images": ["im0.png", "im1.png"]},
            {"messages": [{"role": "user", "content": "No picture."}, {"role": "assistant", "content": "Fine."}]}]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert DatasetProfile.read(str(path)).most_images() == 2
    text = tmp_path / "text.jsonl"
    text.write_text(json.dumps(rows[1]) + "\n")
    assert DatasetProfile.read(str(text)).most_images() == 0
