"""Random-weight vision-language models from real config.json files, and rows with an image at the resolution cap,
for the VLM presets of bench/gpu_check.sh (GPU_CHECK_PARTS=vlm).

Each model is the preset's family built from its published config.json (tests/fixtures/model_configs), on the GPU
in bf16, saved with the bundled tokenizer plus the family's image tokens (their ids written into the config,
the vocabulary kept) and the family's PIL image processor (tests/vision_models.py: the same folder layout the
backend reads). The rows hold one generated image at the preset's cap and enough text to fill `train.seq_len`
after it, so the step costs what the preset's Cost line counts: one image at the cap, full rows.
--dry builds the tiny models of tests/vision_models.py on the CPU instead, so that the mechanics run anywhere.

    python bench/gpu_vlm_models.py --out /tmp/gpu-check --rows 64
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
import hub_kernels  # noqa: E402
from gpu_models import built_where_it_trains  # noqa: E402

hub_kernels.switch_off()  # before transformers

PRESETS = ROOT / "resources" / "presets"
CORPUS = ROOT / "resources" / "corpus" / "python-docs-3.11.txt"
VLMS = {  # folder name under --out: (family, fixture folder, preset file)
    "vl7b": ("qwen2_5_vl", "Qwen--Qwen2.5-VL-7B-Instruct", "qwen2.5-vl-7b_qlora_16gb.yaml"),
    "gemma4b": ("gemma3", "google--gemma-3-4b-it", "gemma-3-4b_lora_24gb.yaml"),
}
"""The VLM presets the GPU check runs, each on a model built from the config.json its Cost line was computed on."""


def real_config(family: str, fixture: str, tokenizer):
    """The published config with the tokenizer's ids for the family's image tokens and bos/eos/pad; widths,
    depths and the vocabulary as published."""
    from transformers import AutoConfig

    from tests import model_configs, vision_models

    raw = model_configs.load(fixture)
    ids = {"pad_token_id": tokenizer.pad_token_id or 0, "bos_token_id": tokenizer.bos_token_id or 1,
           "eos_token_id": tokenizer.eos_token_id or 2}
    for section in (raw, raw.get("text_config")):
        if isinstance(section, dict):
            section.update({k: v for k, v in ids.items() if k in section or section is not raw})
    for key, token in vision_models.FAMILY_TOKENS[family].items():
        raw[key] = tokenizer.convert_tokens_to_ids(token)
    return AutoConfig.for_model(**{k: v for k, v in raw.items() if k != "transformers_version"})


def cap_size(family: str, preset: Path, config) -> tuple[int, int]:
    """(width, height) of the image that costs the most at the preset's resolution cap: for Qwen the sides on
    multiples of patch x merge with the most merged tokens within vision.max_pixels (the estimate's worst
    aspect: 672 x 448 at 301,056 pixels, 384 tokens); for Gemma 3 its tower's square, which any image is resized to."""
    from backend.core.config.run_config import RunConfig

    run = RunConfig.load(preset)
    if not family.startswith("qwen"):
        side = int(config.vision_config.image_size)
        return side, side
    factor = config.vision_config.patch_size * config.vision_config.spatial_merge_size
    cap = run.vision.max_pixels
    best = max((cap // (factor * factor * rows) * rows, rows) for rows in range(1, math.isqrt(cap) // factor + 1))
    rows = best[1]
    return cap // (factor * factor * rows) * factor, rows * factor


def build(name: str, out: Path, dry: bool) -> dict:
    """Build and save one VLM with its processor and tokenizer; -> what was built and how long it took."""
    import torch
    from transformers import AutoModelForImageTextToText

    from tests import vision_models

    family, fixture, _ = VLMS[name]
    tokenizer = vision_models.tiny_tokenizer(family)
    config = vision_models.tiny_config(family, tokenizer) if dry else real_config(family, fixture, tokenizer)
    start = time.monotonic()
    model, device = built_where_it_trains(AutoModelForImageTextToText, config, dry)
    built = time.monotonic() - start
    folder = out / name
    model.save_pretrained(folder)
    processor = vision_models.tiny_processor(family, config, tokenizer)
    if family in vision_models.NEEDS_VIDEO:
        processor.image_processor.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    else:
        processor.save_pretrained(folder)
    params = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return {"model": name, "family": family, "path": str(folder), "params": params, "device": device,
            "build_s": round(built, 1), "with_save_s": round(time.monotonic() - start, 1), "config": config}


def write_rows(name: str, out: Path, rows: int, config, dry: bool) -> dict:
    """`rows` rows, each one image at the cap and an answer of more than the preset's seq_len tokens."""
    from transformers import AutoTokenizer

    from backend.core.config.run_config import RunConfig
    from tests import vision_models

    family, _, preset = VLMS[name]
    seq_len = RunConfig.load(PRESETS / preset).train.seq_len
    width, height = (64, 64) if dry else cap_size(family, PRESETS / preset, config)
    folder = out / f"{name}_rows"
    folder.mkdir(parents=True, exist_ok=True)
    vision_models.image(width, height).save(folder / "image.png")
    tokenizer = AutoTokenizer.from_pretrained(out / name)
    text = CORPUS.read_text(encoding="utf-8")[:200_000]
    per_token = len(text) / len(tokenizer(text, add_special_tokens=False)["input_ids"])
    chars = int(per_token * (seq_len + 64)) + 1
    records = []
    for i in range(rows):
        offset = (i * chars) % max(1, len(text) - chars)
        records.append({"messages": [{"role": "user", "content": "<image>What does this picture hold?"},
                                     {"role": "assistant", "content": text[offset:offset + chars]}],
                        "images": ["image.png"]})
    path = folder / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return {"path": str(path), "rows": rows, "image": f"{width}x{height}", "seq_len": seq_len}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--models", default=",".join(VLMS))
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--dry", action="store_true", help="the tiny models of tests/vision_models.py, on the CPU")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = []
    for name in args.models.split(","):
        built = build(name, out, args.dry)
        built["data"] = write_rows(name, out, args.rows, built.pop("config"), args.dry)
        result.append(built)
        print(json.dumps(built), flush=True)
    (out / "build_vlm.json").write_text(json.dumps({"models": result}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
