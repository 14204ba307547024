"""The estimate's rows for a vision-language model's image side: vision tower, projector, the tower's
activations, the processor's pixel tensors; and the image tokens a row puts into the language model's sequence.

Each part's tuning comes from the run's `vision` section (frozen, lora or full): frozen holds its weights as
the language model's unquantized weights are held, except under QLoRA/LoRA8: the tower and projector are in
bitsandbytes' skip list, and training/vision/parts.keep_image_side_dtype keeps them 16-bit where peft's
prepare_model_for_kbit_training would cast them to fp32 (a part tuned full is cast, as its updates need);
bench/estimate_vision.py cannot check that without CUDA); lora adds adapters on its linears,
their gradients and optimizer state; full gradients and optimizer state for every parameter. The per-image
figures are `vision_memory.image_side_bytes`' at the resolution cap (`vision.max_pixels` for Qwen, the
family's fixed square elsewhere; the folder's processor files set the cap where they are beside config.json),
times the images of a micro-batch: the data's most images per row when
the caller knows it, else `DEFAULT_IMAGES_PER_ROW`, said in a note.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.core.config.run_config import RunConfig
from backend.core.vision_folder import processor_settings
from backend.estimate.setup import Setup
from backend.estimate.states import optimizer_state
from backend.estimate.towers import vision_family
from backend.estimate.vision_memory import DEFAULT_IMAGES_PER_ROW, image_side_bytes
from backend.estimate.vision_towers import Linears, tower_shape



@dataclass(frozen=True)
class VisionRows:
    """Bytes of the image side of one step, and the moments they are held."""

    tower: int = 0
    projector: int = 0
    activations: int = 0
    """Held from the tower's forward to its backward when a part trains; else the frozen forward's transient."""
    held_activations: bool = False
    pixels: int = 0
    forward_copies: int = 0
    """Alive only while the tower runs: Idefics3's real-tile copies, what Mllama's mask building reaches beyond
    the tower's activations."""
    language_side: int = 0
    """Image activations the language model holds until its backward: Mllama's cross-attention keys and values
    over every vision token, in each cross-attention layer, and its text x vision mask."""
    image_tokens_per_row: int = 0
    gradients: int = 0
    """Of `tower` and `projector`: the gradients (they exist from the backward to the optimizer step)."""
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def static(self) -> int:
        """Weights, adapters and optimizer state: held through the whole step."""
        return self.tower + self.projector - self.gradients


def _part(params: int, linears: Linears, tuning: str, setup: Setup, weight_bytes: int,
          optimizer: str) -> dict[str, int]:
    """One part's weights, adapters, gradients and optimizer state for its tuning."""
    weights = params * weight_bytes
    if tuning == "frozen":
        return {"weights": weights, "adapters": 0, "gradients": 0, "optimizer": 0, "trained": 0}
    if tuning == "lora":
        sizes = [setup.rank * inp * count for inp, _, count in linears] + [
            setup.rank * out * count for _, out, count in linears]
        trained = sum(sizes)
        opt, _ = optimizer_state(optimizer, sizes)
        return {"weights": weights, "adapters": trained * setup.adapter_bytes,
                "gradients": trained * setup.adapter_bytes, "optimizer": opt, "trained": trained}
    opt, _ = optimizer_state(optimizer, [params])
    master = params * 4 if weight_bytes != 4 else 0
    return {"weights": weights, "adapters": 0, "gradients": params * weight_bytes, "optimizer": opt + master,
            "trained": params}


def vision_rows(raw: dict[str, Any], run: RunConfig, setup: Setup, images_per_row: int | None,
                warnings: list[str]) -> VisionRows:
    """The image side of `raw` (config.json) for `run`; empty for a text model or an untranscribed tower."""
    family = vision_family(raw)
    if family is None:
        return VisionRows()
    shape = tower_shape(raw, family)
    assert shape is not None  # vision_family names transcribed families only
    per_row = images_per_row if images_per_row is not None else DEFAULT_IMAGES_PER_ROW
    # every row of a micro-batch brings its images, packed into one row or not (0 for text-only data: the
    # tower and projector are loaded, never run)
    images = per_row * run.train.micro_batch_size
    cap = run.vision.max_pixels if family.startswith("qwen") else None
    side = image_side_bytes(raw, family, cap, compute_bytes=setup.compute_bytes, images=images,
                            checkpointing=setup.checkpointing, processor=folder_processor(raw))
    vision = run.vision

    def held(tuning: str) -> int:  # k-bit runs keep a frozen or LoRA part 16-bit (keep_image_side_dtype)
        return setup.compute_bytes if setup.quant and tuning != "full" else setup.weight_bytes

    tower = _part(shape.tower_params, shape.tower_linears, vision.tower, setup, held(vision.tower),
                  run.technique.optimizer)
    projector = _part(shape.projector_params, shape.projector_linears, vision.projector, setup,
                      held(vision.projector), run.technique.optimizer)
    if not images:
        activations, held = 0, False
    elif vision.tower != "frozen":
        activations, held = side["trained_activations"], True
    elif vision.projector != "frozen":
        # the tower runs without a graph; the projector's inputs and outputs are saved
        per_token = 2 * shape.width * 4 + 2 * _text_hidden(raw)
        activations, held = side["image_tokens"] * per_token * setup.compute_bytes // 4, True
        activations = max(activations, side["frozen_forward_peak"])
    else:
        activations, held = side["frozen_forward_peak"], False
    tokens = side["image_tokens"] // max(1, images) * per_row if images else 0
    if images_per_row is None:
        warnings.append(f"{family}: {per_row} image per row assumed (the data's images are not counted here) at the "
                        f"resolution cap: {tokens:,} image tokens of each row's {run.train.seq_len:,}")
    if images and tokens >= run.train.seq_len:
        warnings.append(f"train.seq_len {run.train.seq_len:,} leaves no text beside {tokens:,} image tokens a row: "
                        "raise train.seq_len" + (" or lower vision.max_pixels" if family.startswith("qwen") else ""))
    language = cross_attention_bytes(raw, images, run.train.seq_len, setup.compute_bytes) if family == "mllama" else 0
    detail = {"family": family, "images_per_row": per_row, "images_per_row_known": images_per_row is not None,
              "image_tokens_per_row": tokens, "patches_per_image": side["patches"] // max(1, images),
              "cap": cap, "tower": {"tuning": vision.tower, **tower, "parameters": shape.tower_params},
              "projector": {"tuning": vision.projector, **projector, "parameters": shape.projector_params},
              "activations_held": held, "frozen_forward_peak": side["frozen_forward_peak"],
              "trained_activations": side["trained_activations"], "pixel_bytes": side["pixel_bytes"],
              "pixel_extra": side["pixel_extra"], "language_side": language}
    return VisionRows(tower=sum(v for k, v in tower.items() if k != "trained"),
                      projector=sum(v for k, v in projector.items() if k != "trained"),
                      activations=activations, held_activations=held, pixels=side["pixel_bytes"] + side["pixel_extra"],
                      forward_copies=side["forward_copies"] + max(0, side["forward_floor"] - activations),
                      language_side=language,
                      image_tokens_per_row=tokens, gradients=tower["gradients"] + projector["gradients"],
                      detail=detail)


def cross_attention_bytes(raw: dict[str, Any], images: int, seq_len: int, compute_bytes: int) -> int:
    """Mllama's language model over `images` images' vision tokens (every tile's patches and class token):
    each cross-attention layer saves k_proj's and v_proj's outputs and k_norm's (3 x kv width), its rstd (kv
    heads) and, with grouped-query attention, one copy repeated to every head; the text x vision mask is held once
    (measured on the CPU, sdpa, with bench/estimate_tensors.py's saved-tensor meter at 1, 2 and 4 kv heads of 4; held
    by tests/backend/test_estimate_vision.py)."""
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    vision = raw.get("vision_config") if isinstance(raw.get("vision_config"), dict) else {}
    hidden, heads = int(text.get("hidden_size") or 4096), int(text.get("num_attention_heads") or 32)
    kv = int(text.get("num_key_value_heads") or 8)
    head_dim = int(text.get("head_dim") or hidden // heads)
    layers = len(text.get("cross_attention_layers") or [3, 8, 13, 18, 23, 28, 33, 38])
    grid = int(vision.get("image_size") or 560) // int(vision.get("patch_size") or 14)
    tokens = int(vision.get("max_num_tiles") or 4) * (grid * grid + 1) * images
    per_token = 3 * kv * head_dim + kv + (heads * head_dim if 1 < kv < heads else 0)
    return (tokens * layers * per_token + seq_len * tokens) * compute_bytes


def image_tokens_per_row(raw: dict[str, Any] | None, run: RunConfig, images_per_row: int | None = None) -> int:
    """The image tokens one row puts into the language model's sequence at the run's cap (0: a text model,
    an untranscribed tower, or text-only data); None images: DEFAULT_IMAGES_PER_ROW."""
    family = vision_family(raw) if raw else None
    if family is None or images_per_row == 0:
        return 0
    cap = run.vision.max_pixels if family.startswith("qwen") else None
    per_row = images_per_row if images_per_row is not None else DEFAULT_IMAGES_PER_ROW
    side = image_side_bytes(raw, family, cap, compute_bytes=2, images=1,  # type: ignore[arg-type]
                            processor=folder_processor(raw))  # type: ignore[arg-type]
    return side["image_tokens"] * per_row


def folder_processor(raw: dict[str, Any]) -> dict[str, Any]:
    """The processor settings beside the config.json `raw` was read from (its cap: SmolVLM's longest_edge,
    Qwen's max_pixels); {} for a dict given without a file, or a folder without processor files."""
    source = raw.get("_source")
    if not isinstance(source, str) or not source.endswith("config.json"):
        return {}
    try:
        return processor_settings(Path(source).parent)[0]
    except (OSError, ValueError):
        return {}


def _text_hidden(raw: dict[str, Any]) -> int:
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    return int(text.get("hidden_size") or 4096)
