"""Write the bundled vision demo: a tiny random-init Qwen2.5-VL (resources/tiny_vision/) and a generated
image set of coloured shapes (resources/datasets/demo_vision/), for resources/presets/tiny_vision.yaml.

The model is tests/vision_models.py's tiny Qwen2.5-VL (the bundled tokenizer with the family's image tokens),
so the demo runs on the same proven family the tests load; the images are 64x64 PNGs (4 image tokens each),
so a CPU learns to name them in a minute or two. Deterministic: fixed seeds, no clock.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

COLOURS = {"red": (220, 30, 30), "green": (30, 170, 40), "blue": (30, 60, 220), "yellow": (235, 205, 20)}
SHAPES = ("circle", "square", "triangle")
FAMILY = "qwen2_5_vl"
PROMPT = "<image>What is in this picture?"
SIDE = 112
"""Qwen2.5-VL makes a 112x112 image 16 image tokens (28x28 pixels each): enough to tell a triangle from a square."""
PER_CLASS = 40
"""Images per colour and shape: 12 classes x 40 = 480 rows; the preset holds 10% out for evaluation."""


def draw(colour: str, shape: str, rng: random.Random):
    """One shape on white, near the centre, its size and place jittered so that no two images are alike."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (SIDE, SIDE), (255, 255, 255))
    size = rng.randint(SIDE * 3 // 5, SIDE * 4 // 5)
    x, y = ((SIDE - size) // 2 + rng.randint(-6, 6) for _ in range(2))
    pen = ImageDraw.Draw(image)
    fill = COLOURS[colour]
    if shape == "circle":
        pen.ellipse((x, y, x + size, y + size), fill=fill)
    elif shape == "square":
        pen.rectangle((x, y, x + size, y + size), fill=fill)
    else:
        pen.polygon([(x + size // 2, y), (x, y + size), (x + size, y + size)], fill=fill)
    return image


def write_images(folder: Path, seed: int) -> int:
    """The PNGs under folder/images and train.jsonl in LLaMA-Factory's shape (messages + images), shuffled."""
    rng = random.Random(seed)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for colour in COLOURS:
        for shape in SHAPES:
            for i in range(PER_CLASS):
                name = f"images/{colour}_{shape}_{i:02d}.png"
                draw(colour, shape, rng).save(folder / name, optimize=True)
                rows.append({"messages": [{"role": "user", "content": PROMPT},
                                          {"role": "assistant", "content": f"A {colour} {shape}."}],
                             "images": [name]})
    rng.shuffle(rows)
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def build_model(folder: Path, seed: int) -> Path:
    """tests/vision_models.py's tiny Qwen2.5-VL with its output layer tied to the embeddings (half the file)."""
    import torch
    from transformers import AutoModelForImageTextToText

    from tests import vision_models

    tokenizer = vision_models.tiny_tokenizer(FAMILY)
    config = vision_models.tiny_config(FAMILY, tokenizer)
    config.tie_word_embeddings = True
    config.get_text_config().tie_word_embeddings = True
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor = vision_models.tiny_processor(FAMILY, config, tokenizer)
    processor.image_processor.save_pretrained(folder)  # no video processor: it needs torchvision
    tokenizer.save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resources", type=Path, default=ROOT / "resources")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    model = build_model(args.resources / "tiny_vision", args.seed)
    rows = write_images(args.resources / "datasets" / "demo_vision", args.seed)
    print(f"wrote {model} and {rows} image rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
