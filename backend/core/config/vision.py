"""The settings of a vision-language model's image side: which parts train, and the image resolution cap.

Apart from run_config.py so that the image knobs read together; RunConfig holds them as the `vision`
section, which a text model ignores. Torch-free: the studio builds its vision controls from this model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from backend.core.config.base import Section

PartTuning = Literal["frozen", "lora", "full"]


class VisionSection(Section):
    tower: PartTuning = "frozen"
    """The vision tower (the image encoder): frozen keeps its pretrained features and costs only its 16-bit weights and the activations of its forward pass; lora adds adapters to its linear layers; full trains every weight (16 bytes/parameter, as full tuning). Frozen is what LLaMA-Factory and Unsloth default to: most tasks need only the language model to learn what the images show."""
    projector: PartTuning = "frozen"
    """The projector (the layers that map image features into the language model's width): frozen, lora or full, as the tower; it is small, so full costs little and helps a new image domain."""
    max_pixels: int | None = Field(default=None, ge=28 * 28)
    """The most pixels an image keeps: a larger image is scaled down (aspect kept) before it becomes tokens, so the image tokens per row and their memory stay bounded (Qwen-VL: about one token per 28x28 pixels). None: the family's processor default. Families with a fixed image size (Gemma 3, LLaVA-1.5) ignore it."""
