"""The rows a vision-language run's export is checked on: its own image rows, with their images.

A VLM export's tower and projector change what the language model sees, so a text-only probe would not
measure them. The rows come from the run's data through the training path itself (backend/training/vision:
rows.py builds them with assistant-only labels, collator.py turns each into the processor's tensors:
pixels, grids, masks), the validation split first, then the training rows; `verify.measure` runs each
row alone with its tensors (`inputs`), since an image's pixels belong to its own row.
"""

from __future__ import annotations

from typing import Any

import torch

from backend.core.config.run_config import RunConfig

ROWS_LIMIT = 256
"""Most rows of each split turned into tensors (the probe's token budget takes far fewer)."""


def image_row_sources(config: RunConfig) -> list[tuple[list[dict[str, Any]], str]]:
    """(rows, where from) of a VLM run, in the order a probe takes them; each row carries `inputs`, the
    forward's keyword arguments for that row alone (its labels left out)."""
    from backend.training.vision.door import VisionRun

    vision = VisionRun.open(config.resolved_model_path(), config)
    train, evaluation, _, side = vision.build_datasets(config)
    collator = vision.collator(side)

    def rows(dataset: Any) -> list[dict[str, Any]]:
        out = []
        for i in range(min(ROWS_LIMIT, len(dataset))):
            feature = dataset[i]
            batch = collator([feature])
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            out.append({"input_ids": list(feature["input_ids"]), "labels": list(feature["labels"]), "inputs": inputs})
        return out

    family = vision.family.label
    if evaluation is not None and len(evaluation):
        return [(rows(evaluation), f"the run's validation split ({family} rows with their images)"),
                (rows(train), "its training data")]
    return [(rows(train), f"the run's training data ({family} rows with their images; it has no validation split)")]


def forward_inputs(model: Any, inputs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A row's tensors on the model's device, pixels in the model's own floating dtype."""
    dtype = model.get_input_embeddings().weight.dtype
    return {k: (v.to(device, dtype) if v.is_floating_point() else v.to(device)) if isinstance(v, torch.Tensor) else v
            for k, v in inputs.items()}
