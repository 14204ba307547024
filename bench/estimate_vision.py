"""The VLM estimate's image rows against a measurement: tiny random-weight models of the proven families
(tests/vision_models.py, each from its family's real config shape), one image at a resolution cap, on
the CPU in fp32.

What is measured, part by part, on the image side of a step (the tower and the projector):
- tower / projector parameters: the model's own `named_parameters`, by the registry's prefixes;
- trained activations: the bytes autograd saves through the tower and the projector when both train
  (every parameter requires a gradient), storages counted once, the parameters left out
  (bench/estimate_tensors.py's meter);
- frozen forward peak: the most new storage alive at once while the frozen tower and projector run
  (no autograd graph: nothing requires a gradient), the pixel tensor left out (PeakTracker of bench/estimate_tensors.py);
- pixel values: the processor's tensor for the image (fp32).
Each is printed beside `backend/estimate/vision_memory.py`'s figure and the ratio.

    PYTHONPATH=. python bench/estimate_vision.py [FAMILY ...] [--pixels 200704]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FAMILIES = ("qwen2_5_vl", "qwen3_vl", "qwen3_5", "gemma3", "gemma4", "idefics3", "llava", "mllama")
"""Every tower kind; LLaVA-NeXT's tower is LLaVA's (its anyres crops are more passes of it, not measured apart)."""


def _raw(config: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in ("transformers_version", "_name_or_path", "auto_map")}


def tower_inputs(family: str, model, config: dict[str, Any], pixels: int) -> dict[str, Any]:
    """The pixel tensors of one square image at the cap, shaped as the family's processor makes them."""
    import torch
    from transformers import AutoConfig

    from backend.estimate.vision_memory import patches_per_image

    torch.manual_seed(0)
    vision = config["vision_config"]
    if family.startswith("qwen"):
        patches, side = patches_per_image(config, family, pixels, square=True)
        values = vision.get("in_channels", 3) * vision["temporal_patch_size"] * vision["patch_size"] ** 2
        return {"pixel_values": torch.randn(patches, values),
                "image_grid_thw": torch.tensor([[1, side, side]])}
    if family == "gemma4":  # the processor's patches of a square image at the budget, padded to the most patches
        from backend.core.registries.vision_families import VISION_FAMILIES
        from tests import vision_models

        budget = VISION_FAMILIES[family].cap(config)
        processor = vision_models.tiny_image_processor(family, AutoConfig.for_model(**_raw(config)))
        processor.max_soft_tokens = budget
        out = processor(images=[vision_models.image(1024, 1024)], return_tensors="pt")
        return {"pixel_values": out["pixel_values"], "image_position_ids": out["image_position_ids"]}
    if family == "mllama":  # a square of max_num_tiles tiles, every tile real
        from tests import vision_models

        hf = AutoConfig.for_model(**_raw(config))
        side = vision["image_size"] * int(hf.vision_config.max_num_tiles ** 0.5)
        out = vision_models.tiny_image_processor(family, hf)(images=[[vision_models.image(side, side)]],
                                                              return_tensors="pt")
        return {k: out[k] for k in ("pixel_values", "aspect_ratio_ids", "aspect_ratio_mask")}
    size = vision["image_size"]
    tiles = 1
    if family == "idefics3":  # the tiles of a cap x cap image and the shrunk whole, each a tower pass
        patches, grid = patches_per_image(config, family, None)
        tiles = patches // (grid * grid)
    return {"pixel_values": torch.randn(tiles, 3, size, size)}


def image_side(family: str, model, inputs: dict[str, Any]):
    """The tower and the projector of `model` on `inputs`: what get_image_features runs."""
    if family == "mllama":
        inner = model.model
        hidden = inner.vision_model(**inputs).last_hidden_state
        return inner.multi_modal_projector(hidden)
    if family == "idefics3":
        inner = model.model
        hidden = inner.vision_model(pixel_values=inputs["pixel_values"]).last_hidden_state
        return inner.connector(hidden)
    out = model.model.get_image_features(**inputs)
    return out.pooler_output if hasattr(out, "pooler_output") and out.pooler_output is not None else out


def measure(family: str, pixels: int, shape: tuple[int, int, int] | None = None) -> dict[str, Any]:
    """The image side of `family`'s tiny model (`shape`: its tower's width, intermediate and depth instead)."""
    import gc

    import torch

    from backend.training.model.vision_parts import PROJECTOR, TOWER, part_of
    from backend.core.registries.vision_families import BY_MODEL_TYPE
    from bench.estimate_tensors import PeakTracker, _SavedTensorMeter, _tensors_in, _unique_bytes
    from tests.vision_models import CONFIGS
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = CONFIGS[family]()
    if shape is not None:
        depth = "depth" if family.startswith("qwen") else "num_hidden_layers"
        if family == "mllama":  # the depth split as on the real tower: a quarter of it global, the rest local
            glob = max(1, shape[2] // 4)
            config["vision_config"].update(num_global_layers=glob, vision_output_dim=3 * shape[0],
                                           intermediate_layers_indices=[0, shape[2] - glob - 1])
            shape = (shape[0], shape[1], shape[2] - glob)
        config["vision_config"].update(hidden_size=shape[0], intermediate_size=shape[1], **{depth: shape[2]})
        if family == "qwen2_5_vl":
            config["vision_config"]["fullatt_block_indexes"] = [shape[2] - 1]
        if family == "gemma4":  # attention as wide as the tower, as on the real ones (12 heads of 64 = 768)
            config["vision_config"].update(num_attention_heads=2, num_key_value_heads=2, head_dim=shape[0] // 2)
    hf = AutoConfig.for_model(**_raw(config))
    hf._attn_implementation = "sdpa"
    model = AutoModelForImageTextToText.from_config(hf, dtype=torch.float32)
    vlm = BY_MODEL_TYPE[config["model_type"]]
    counts = {TOWER: 0, PROJECTOR: 0}
    for name, p in model.named_parameters():
        part = part_of(name, vlm)
        if part in counts:
            counts[part] += p.numel()
    inputs = tower_inputs(family, model, config, pixels)
    pixel_bytes = sum(t.numel() * t.element_size() for t in inputs.values() if t.is_floating_point())
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    param_keys = {(p.untyped_storage().data_ptr(), p.untyped_storage().nbytes()) for p in model.parameters()}

    model.requires_grad_(False)
    gc.collect()
    known = params | {t.untyped_storage().data_ptr() for t in inputs.values()}
    tracker = PeakTracker(known)
    with torch.no_grad(), tracker.mode():
        out = image_side(family, model, inputs)
    frozen_peak = tracker.peak
    features = sum(t.numel() * t.element_size() for t in _tensors_in(out))
    del out

    model.requires_grad_(True)
    with _SavedTensorMeter() as meter:
        out = image_side(family, model, inputs)
        saved, _ = _unique_bytes(meter.live() + _tensors_in(out), param_keys | {
            (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in inputs.values()})
    del out
    return {"family": family, "tower_params": counts[TOWER], "projector_params": counts[PROJECTOR],
            "pixel_bytes": pixel_bytes, "frozen_forward_peak": frozen_peak, "trained_activations": saved,
            "features": features, "config": config}


def compare(result: dict[str, Any], pixels: int) -> dict[str, Any]:
    """The estimate's figures beside the measured ones (fp32, one image)."""
    from backend.estimate.vision_memory import image_side_bytes

    cap = pixels if result["family"].startswith("qwen") else None  # the others' caps are their own squares and tiles
    est = image_side_bytes(result["config"], result["family"], cap, compute_bytes=4, images=1, square=True)
    rows = {}
    for key, measured in (("tower_params", result["tower_params"]), ("projector_params", result["projector_params"]),
                          ("pixel_bytes", result["pixel_bytes"]),
                          ("frozen_forward_peak", result["frozen_forward_peak"]),
                          ("trained_activations", result["trained_activations"])):
        predicted = est[key]
        rows[key] = {"measured": measured, "estimated": predicted, "ratio": round(predicted / max(1, measured), 3)}
    return rows


def measure_step(family: str, folder: Path, *, tower: str = "frozen", projector: str = "frozen",
                 pixels: int = 448 * 448) -> dict[str, Any]:
    """A real step of ours on the CPU: the tiny model through the training door (backend/training/vision,
    one_step: the model with its adapters and parts frozen as `vision` says, and a batch of one row with one
    image at the cap), a first step for the optimizer's state, then a steady-state step's peak
    (cpu_step_peak of bench/estimate_tensors.py) beside the estimate's total for the same row length."""
    import contextlib
    import json as _json

    import torch

    import backend.core.cpu_features as cpu_features
    from backend.core.config.run_config import RunConfig
    from backend.core.protocol import Capabilities
    from backend.estimate import estimate
    from backend.estimate.seq_len import with_seq_len
    from backend.training.model.model_facts import ModelFacts
    from backend.training.model.techniques import plan_techniques
    from backend.training.vision.door import one_step
    from bench.estimate_tensors import cpu_step_peak
    from tests import vision_models

    model_dir = vision_models.build_tiny_vlm(family, folder / "model")
    if family.startswith("qwen"):
        side = int(pixels ** 0.5)
    else:  # the fixed squares take any size; SmolVLM's tiles are counted for an image at its cap
        from backend.core.registries.vision_families import VISION_FAMILIES

        side = VISION_FAMILIES[family].cap(vision_models.CONFIGS[family]()) if family == "idefics3" else 64
    (folder / "data").mkdir(parents=True, exist_ok=True)
    vision_models.image(side, side).save(folder / "data" / "im.png")
    row = {"messages": [{"role": "user", "content": "<image>What is in this picture?"},
                        {"role": "assistant", "content": "Random pixels."}], "images": ["im.png"]}
    (folder / "data" / "train.jsonl").write_text(_json.dumps(row) + "\n")
    config = RunConfig.model_validate({
        "model": {"path": str(model_dir)}, "data": {"path": str(folder / "data" / "train.jsonl"), "validation_split": 0},
        "technique": {"method": "lora", "lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.0, "packing": False,
                      "gradient_checkpointing": False},
        "vision": {"tower": tower, "projector": projector, "max_pixels": pixels if family.startswith("qwen") else None},
        "train": {"micro_batch_size": 1, "seq_len": 4096, "max_steps": 1, "seed": 0}})
    plan = plan_techniques(config, Capabilities(cuda=False), ModelFacts.read(model_dir, False), 1)
    torch.manual_seed(0)
    model, batch = one_step(config, plan)
    trainable = [p for p in model.parameters() if p.requires_grad]
    model(**batch).loss.backward()
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, fused=True)
    optimizer.step()
    static = list(model.parameters()) + list(model.buffers())
    peak = cpu_step_peak(model, optimizer, batch, contextlib.nullcontext, static)
    tokens = int(batch["input_ids"].shape[1])
    targets = int((batch["labels"] != -100).sum())
    b = estimate(model_dir, with_seq_len(config, tokens), device="cpu", images_per_row=1, target_tokens=targets,
                 cpu_bf16=cpu_features.native_bf16())
    return {"family": family, "tower": tower, "projector": projector, "row_tokens": tokens,
            "image_tokens": (b.details.get("vision") or {}).get("image_tokens_per_row"), "measured_peak": peak,
            "estimated_peak": b.total_bytes, "ratio": round(b.total_bytes / max(1, peak), 3),
            "estimate": b.breakdown()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--pixels", type=int, default=448 * 448, help="max_pixels for the Qwen families")
    parser.add_argument("--shape", type=int, nargs=3, metavar=("WIDTH", "INTERMEDIATE", "DEPTH"),
                        help="the tower's widths and depth (the coefficients were measured at 32/64, 64/128, "
                             "64/256 and depths 2 and 4; another shape is a held-out check)")
    parser.add_argument("--step", action="store_true", help="a real step of ours per family instead (frozen, then "
                        "the tower and projector under lora)")
    args = parser.parse_args(argv)
    worst = 0.0
    if args.step:
        import tempfile

        for family in args.families:
            for tower, projector in (("frozen", "frozen"), ("lora", "lora")):
                with tempfile.TemporaryDirectory() as tmp:
                    result = measure_step(family, Path(tmp), tower=tower, projector=projector, pixels=args.pixels)
                worst = max(worst, abs(result["ratio"] - 1))
                print(json.dumps(result))
        print(f"worst error {worst:.1%}")
        return 0 if worst <= 0.10 else 1
    for family in args.families:
        rows = compare(measure(family, args.pixels, args.shape), args.pixels)
        worst = max(worst, *(abs(r["ratio"] - 1) for r in rows.values()))
        print(json.dumps({"family": family, **rows}))
    print(f"worst error {worst:.1%}")
    return 0 if worst <= 0.10 else 1


if __name__ == "__main__":
    raise SystemExit(main())
