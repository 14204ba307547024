"""The result: bytes per part (Breakdown) and how it is shown."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from backend.core.units import GIB, MIB, human_bytes  # noqa: F401  (the estimate hands these names on)

PARTS = ("weights", "adapters", "gradients", "optimizer", "master_weights", "activations", "logits", "runtime")
"""The parts of a Breakdown, in display order."""
OBJECTIVE_PARTS = ("ref_model", "ref_adapter", "reference", "generation")
"""The parts DPO, KTO and GRPO add (backend/estimate/objectives.py), shown only when not zero."""
VISION_PARTS = ("vision_tower", "projector", "vision_activations", "pixel_values")
"""A vision-language model's image side (backend/estimate/vision_rows.py), shown only when not zero."""
CUDA_PARTS = ("allocator_reserve", "cuda_context")
"""What a CUDA card holds beyond torch's allocated tensors (backend/estimate/cuda.py); zero, so not
shown, on the CPU."""


@dataclass
class Breakdown:
    """Bytes per part of one training step on one device (see the module docstring)."""

    weights: int = 0
    adapters: int = 0
    gradients: int = 0
    optimizer: int = 0
    master_weights: int = 0
    activations: int = 0
    logits: int = 0
    runtime: int = 0
    ref_model: int = 0
    ref_adapter: int = 0
    reference: int = 0
    generation: int = 0
    vision_tower: int = 0
    projector: int = 0
    vision_activations: int = 0
    pixel_values: int = 0
    allocator_reserve: int = 0
    cuda_context: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def sum_bytes(self) -> int:
        """The sum of the parts: an upper bound that holds every part at its own peak at once."""
        return sum(self.breakdown().values())

    @property
    def total_bytes(self) -> int:
        """The step's peak: the largest of its phases (details["peak_phases"]), since the parts
        peak at different moments (with checkpointing the loss buffers are freed before any layer
        is recomputed); the sum of the parts when no phases are known."""
        peak = (self.details.get("peak_phases") or {}).get("peak")
        return int(peak) if isinstance(peak, int) and peak > 0 else self.sum_bytes

    def breakdown(self) -> dict[str, int]:
        extra = {part: int(getattr(self, part)) for part in OBJECTIVE_PARTS + VISION_PARTS + CUDA_PARTS
                 if getattr(self, part)}
        return {**{part: int(getattr(self, part)) for part in PARTS}, **extra}

    def to_json(self, details: bool = False) -> dict[str, Any]:
        """`{"total_bytes": peak, "sum_of_parts_bytes": int, "breakdown": {part: int}}` (and
        `details` when asked)."""
        out: dict[str, Any] = {"total_bytes": self.total_bytes, "sum_of_parts_bytes": self.sum_bytes,
                               "breakdown": self.breakdown()}
        if details:
            out["details"] = self.details
        return out

    def format_table(self) -> str:
        """A CLI table: part, bytes in GiB/MiB, share of the total."""
        total = self.sum_bytes or 1
        w = max(16, *(len(part) + 1 for part in self.breakdown()))  # vision_activations is wider
        lines = [f"{'part':<{w}}{'size':>12}{'share':>8}"]
        for part, value in self.breakdown().items():
            lines.append(f"{part:<{w}}{human_bytes(value):>12}{value / total:>8.1%}")
        lines.append(f"{'sum of parts':<{w}}{human_bytes(self.sum_bytes):>12}{1:>8.0%}")
        phases = {k: v for k, v in (self.details.get("peak_phases") or {}).items() if k not in ("peak", "fixed_runtime")}
        when = f"  (at {max(phases, key=phases.get).replace('_', ' ')})" if phases else ""
        vision = self.details.get("vision")
        if vision and vision["images_per_row"]:
            lines.append(f"{'image tokens':<{w}}{vision['image_tokens_per_row']:>12,}  a row ({vision['images_per_row']} "
                         f"image{'s' if vision['images_per_row'] != 1 else ''} at the cap, within seq_len)")
        lines.append(f"{'total (peak)':<{w}}{human_bytes(self.total_bytes):>12}{when}")
        trained = self.details.get("trainable_parameters") or 0
        if (self.details.get("setup") or {}).get("method") == "full" and trained:
            # the ZeRO paper's (and the first seed article's) 16 bytes per parameter for mixed-precision Adam
            states = self.weights + self.gradients + self.optimizer + self.master_weights
            lines.append(f"{'model states':<{w}}{human_bytes(states):>12}  ({states / trained:.1f} bytes x "
                         f"{trained / 1e9:.2f} B parameters = {states / 1e9:.1f} GB)")
        for warning in self.details.get("warnings", []):
            lines.append(f"note: {warning}")
        return "\n".join(lines)
