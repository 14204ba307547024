"""Packed against padded image rows (the `packed_image_rows` shortcut), trained step for step in one process.

A tiny random Qwen2.5-VL (tests/vision_models.py) is built, rows over generated images of mixed sizes
(so their token counts differ several-fold) are read through the vision door, and each micro-batch is
trained on (forward + backward) once padded and once packed, in an order that alternates per batch. Both
must give the same loss (1e-4). Reported: the tokens the rows hold per second (padding not counted, the
same for both) and the tokens computed (padding included), medians over batches.

    python bench/vision_packing.py [--rows 48] [--batch 4] [--repeats 3] [--threads N]

What a tiny model shows: its vision tower costs the same either way, and its language model is two layers of
width 128, so the padding saved weighs less than on a real model, where the language model dominates a step.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = [(64, 64), (448, 336), (112, 84), (280, 280), (84, 168), (392, 196)]
"""Image sides in pixels: 4 to 192 image tokens each at Qwen2.5-VL's 28-pixel token."""


def write_rows(folder: Path, rows: int, seed: int) -> Path:
    from tests import vision_models

    rng = random.Random(seed)
    lines = []
    for i in range(rows):
        width, height = SIZES[i % len(SIZES)]
        vision_models.image(width, height, seed=i).save(folder / f"im{i}.png")
        answer = " ".join(rng.choice(["red", "grey", "noise", "pixels", "static", "square"])
                          for _ in range(rng.randint(3, 40)))
        lines.append({"messages": [{"role": "user", "content": "<image>What is in this picture?"},
                                   {"role": "assistant", "content": answer}], "images": [f"im{i}.png"]})
    path = folder / "train.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def widen(folder: Path, hidden: int, layers: int) -> None:
    """The tiny model's language model rebuilt wider and deeper (random weights), its tower unchanged."""
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(folder)
    heads = max(1, hidden // 128)
    config.text_config.update(dict(hidden_size=heads * 128, num_attention_heads=heads, num_key_value_heads=heads,
                                   intermediate_size=heads * 128 * 3, num_hidden_layers=layers,
                                   max_window_layers=layers, layer_types=["full_attention"] * layers))
    config.vision_config.out_hidden_size = heads * 128
    torch.manual_seed(0)
    AutoModelForImageTextToText.from_config(config, dtype=torch.float32).save_pretrained(folder)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=48)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="passes over the batches; the first warms up")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--hidden", type=int, default=0,
                        help="widen the language model to this hidden size (heads of 128, as M-RoPE wants) and "
                             "--layers layers, so that it weighs in a step as on a real model (0: the tiny one)")
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args(argv)

    import torch

    from backend.core.config.run_config import RunConfig
    from backend.core.protocol import Capabilities
    from backend.training.model.model_facts import ModelFacts
    from backend.training.model.techniques import plan_techniques
    from backend.training.vision.door import VisionRun, add_vision_adapters, load_vision_model
    from tests import vision_models

    if args.threads:
        torch.set_num_threads(args.threads)
    root = Path(tempfile.mkdtemp(prefix="vision_packing_"))
    folder = vision_models.build_tiny_vlm("qwen2_5_vl", root / "model")
    if args.hidden:
        widen(folder, args.hidden, args.layers)
    (root / "data").mkdir()
    data = write_rows(root / "data", args.rows, seed=0)
    config = RunConfig.model_validate({
        "model": {"path": str(folder)}, "data": {"path": str(data), "validation_split": 0},
        "technique": {"method": "lora", "lora_rank": 8, "lora_alpha": 16, "lora_dropout": 0.0, "precision": "fp32"},
        "train": {"micro_batch_size": args.batch, "seq_len": 1024, "max_steps": 1, "seed": 0}})
    plan = plan_techniques(config, Capabilities(cuda=False), ModelFacts.read(folder, False), 1, image_rows=True)
    print(f"plan: {plan.summary()}; {torch.get_num_threads()} thread(s)", flush=True)
    run = VisionRun.open(folder, config)
    train, _, _, rows = run.build_datasets(config)
    torch.manual_seed(0)
    model = add_vision_adapters(load_vision_model(folder, config, plan, run.family), config, plan, run.family)
    model.train()
    padded, packed = run.collator(rows), run.collator(rows, model)
    features = [train[i] for i in range(len(train))]
    groups = [features[k:k + args.batch] for k in range(0, len(features) - args.batch + 1, args.batch)]

    def step(batch: dict) -> tuple[float, float]:
        model.zero_grad()
        began = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        return time.perf_counter() - began, float(loss.detach())

    times: dict[str, list[float]] = {"padded": [], "packed": []}
    held = sum(len(f["input_ids"]) for f in features[:len(groups) * args.batch])
    computed = {"padded": 0, "packed": held}
    for repeat in range(args.repeats):
        spent = {"padded": 0.0, "packed": 0.0}
        for k, group in enumerate(groups):
            batches = {"padded": padded(group), "packed": packed(group)}
            if repeat == 0:
                computed["padded"] += int(batches["padded"]["input_ids"].numel())
            order = ("padded", "packed") if (k + repeat) % 2 == 0 else ("packed", "padded")
            losses = {}
            for name in order:
                seconds, losses[name] = step(batches[name])
                spent[name] += seconds
            if abs(losses["padded"] - losses["packed"]) > 1e-4:
                raise SystemExit(f"batch {k}: packed loss {losses['packed']} != padded {losses['padded']}")
        if repeat:  # the first pass warms oneDNN's kernels for every row length
            for name in times:
                times[name].append(spent[name])
    rate = {name: held / statistics.median(times[name]) for name in times}
    print(f"{len(groups)} batches of {args.batch} rows, {held:,} tokens held; computed padded "
          f"{computed['padded']:,} (padding {1 - held / computed['padded']:.0%}), packed {computed['packed']:,}")
    for name in ("padded", "packed"):
        print(f"{name:>7}: {rate[name]:,.0f} row tokens/s ({computed[name] / statistics.median(times[name]):,.0f} "
              f"computed tokens/s), median of {len(times[name])} passes")
    print(f"packed / padded: {rate['packed'] / rate['padded']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
