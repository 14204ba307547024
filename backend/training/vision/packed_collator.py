"""PackedVisionCollator: image rows packed into one row without padding (the `packed_image_rows` shortcut).

The padded batch is built first, by the family's processor (collator.py), so pixels, grids and tokens are
exactly what an unpacked step sees; then the rows' real tokens are laid end to end. The pixel tensors need
no change: Qwen-VL's are the images' patches in row order with one `image_grid_thw` line per image, and the
model scatters image features into the image tokens in that same order. Positions are what the model
computes for each padded row (`get_rope_index`, M-RoPE's temporal/height/width ids), concatenated, with the
text positions restarting at 0 in front as a fourth line: transformers' Qwen-VL text model reads that line
as packed input and hands it to every attention call, so each row attends to itself only (`sdpa_packed`'s
one causal SDPA per row, which the plan loads on SDPA; a block-diagonal mask on eager; varlen bounds from the
positions on FlashAttention-2). No `cu_seq_lens_*` go in: the model would hand them to its vision tower,
which keeps its own per-image bounds. `use_cache=False` goes with the batch: transformers reads packed
positions only when no cache is built, and a VLM's text config can ask for one when the outer config does
not. Proven exact in tests/backend/test_vision_packing.py.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from backend.training.tokenized import IGNORE
from backend.training.vision.collator import VisionCollator

TEXT_KEYS = ("input_ids", "labels", "mm_token_type_ids")
"""The per-token tensors of a Qwen-VL batch; everything else (pixels, grids) is per image already."""

RopeIndex = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def rope_index_of(model: Any) -> RopeIndex:
    """The model's own M-RoPE position function (`get_rope_index` on Qwen-VL's inner model, under peft too)."""
    for module in model.modules():
        method = getattr(module, "get_rope_index", None)
        if callable(method):
            return method
    raise ValueError(f"{type(model).__name__} has no get_rope_index: its image rows cannot be packed")


class PackedVisionCollator:
    """A batch of image rows -> one row: tokens end to end, pixels in order, positions per row."""

    def __init__(self, padded: VisionCollator, rope_index: RopeIndex):
        self.padded = padded
        self.rope_index = rope_index

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        batch = self.padded(features)
        mask = batch.pop("attention_mask").bool()
        lengths = mask.sum(dim=1).tolist()
        batch["labels"][:, 0] = IGNORE  # a row's first token must not be predicted from the row before it
        positions = self.positions(batch, mask)  # (3, rows, width)
        text = torch.cat([torch.arange(n) for n in lengths])
        out = {key: value for key, value in batch.items() if key not in TEXT_KEYS}
        for key in TEXT_KEYS:
            if key in batch:
                out[key] = batch[key][mask][None]
        out["position_ids"] = torch.cat([text[None], positions[:, mask]])[:, None]  # (4, 1, tokens)
        # transformers reads packed positions only without a cache; a VLM's text config may still ask for one
        out["use_cache"] = False
        return out

    def positions(self, batch: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        """M-RoPE ids of each padded row, as the model would compute them unpacked; a batch without images
        counts 0, 1, 2, ... on all three lines, as the model does then."""
        if batch.get("image_grid_thw") is None:
            return (mask.long().cumsum(1) - 1).clamp(min=0)[None].expand(3, -1, -1)
        ids, _ = self.rope_index(batch["input_ids"], batch["mm_token_type_ids"],
                                 image_grid_thw=batch["image_grid_thw"], attention_mask=mask.long())
        return ids
