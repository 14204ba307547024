"""VisionCollator: a padded batch of image rows, the pixel tensors laid out as each family's model wants.

The family's own processor batches the images (Qwen concatenates patches with a grid per image, Idefics3
pads tiles per row, Mllama its tiles and cross-attention mask, ...), so no family's tensor shapes are
written here. The rows' token lists were made at build time by the same processor (rows.py); the batch's
text tensors are cut back to those rows (a truncated row) and checked equal, so a processor that
tokenized differently twice is an error, never a silently shifted label.
"""

from __future__ import annotations

from typing import Any

import torch

from backend.core.data.images import decode
from backend.training.tokenized import IGNORE
from backend.training.vision.rows import ImageRows


class VisionCollator:
    """Pads to the longest row of the batch, right-aligned, labels -100 beyond each row."""

    def __init__(self, processor: Any, rows: ImageRows, processor_kwargs: dict[str, Any] | None = None):
        self.processor = processor
        self.rows = rows
        self.processor_kwargs = processor_kwargs or {}
        self.pad_id = processor.tokenizer.pad_token_id
        self.image_rows_seen = 0
        self.image_tokens_seen = 0

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        texts = [self.rows.texts[f["row"]] for f in features]
        images = [[decode(ref) for ref in self.rows.images[f["row"]]] for f in features]
        kwargs: dict[str, Any] = dict(text=texts, return_tensors="pt", padding=True, add_special_tokens=False,
                                      **self.processor_kwargs)
        if any(images):
            kwargs["images"] = images
        out = dict(self.processor(**kwargs))
        batch, full = out["input_ids"].shape
        width = max(len(f["input_ids"]) for f in features)
        for key, value in out.items():
            if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[:2] == (batch, full):
                value = value[:, :width].clone()
                for row, feature in enumerate(features):
                    value[row, len(feature["input_ids"]):] = self.pad_id if key == "input_ids" else 0
                out[key] = value
        labels = torch.full((batch, width), IGNORE, dtype=torch.long)
        for row, feature in enumerate(features):
            n = len(feature["input_ids"])
            if out["input_ids"][row, :n].tolist() != list(feature["input_ids"]):
                raise RuntimeError(f"row {feature['row']}: the processor tokenized it differently from when the "
                                   "dataset was built")
            labels[row, :n] = torch.tensor(feature["labels"])
        out["labels"] = labels
        out["attention_mask"] = (torch.arange(width)[None, :] < torch.tensor(
            [len(f["input_ids"]) for f in features])[:, None]).long()
        return out
