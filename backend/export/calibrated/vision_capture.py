"""A vision-language run's calibrated export: its own rows with their images feed the language model's
decoder layers, and the vision tower and projector stay 16-bit on compressed-tensors' ignore list.

collect.py captures decoder layer 0's inputs from one run of the whole model per batch; for a VLM that run
takes each row's processor tensors (pixels, Qwen's `image_grid_thw`, Gemma's `token_type_ids`, Idefics3's
`pixel_attention_mask`, as training's collator builds them), so the captured hidden states hold the image
embeddings merged into the text and the layers' other arguments hold the positions the model derives from
the images (Qwen's M-RoPE) and its masks (Gemma 3's bidirectional image spans). Image rows go one at a
time, as the export's check runs them: an image's pixels belong to its own row.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from backend.core.config.run_config import RunConfig
from backend.core.registries.vision_families import VisionFamily


class ImageRows(list):
    """Calibration rows of a VLM run: each row's token ids (what the algorithms count and size by), with that
    row's processor tensors, which `feeds` hands to the whole model one row at a time (collect.feeds)."""

    def __init__(self, rows: list[dict[str, Any]], dtype: torch.dtype):
        super().__init__(list(row["input_ids"]) for row in rows)
        self.inputs = [row["inputs"] for row in rows]
        self.dtype = dtype  # the model's: pixels are handed over in it, as the check and training do

    def feeds(self, device: torch.device) -> list[tuple[dict[str, Any], torch.Tensor]]:
        """(forward arguments, real-token mask) per row: no padding, so every position is real."""
        out = []
        for inputs in self.inputs:
            moved = {k: (v.to(device, self.dtype) if v.is_floating_point() else v.to(device))
                     if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
            out.append((moved, moved["attention_mask"]))
        return out


def image_calibration_rows(config: RunConfig, samples: int, dtype: torch.dtype) -> tuple[ImageRows, str]:
    """(rows, where they came from in words): `samples` rows spread evenly over the run's training data, built
    as training built them (backend/training/vision: rows.py, collator.py), images and all, never cut."""
    from backend.core.errors import JobError
    from backend.export.calibrated.samples import spread
    from backend.training.vision.door import VisionRun

    try:
        vision = VisionRun.open(config.resolved_model_path(), config)
        train, _, _, side = vision.build_datasets(config)
    except (OSError, ValueError) as exc:
        raise JobError("bad_input", f"calibrating on the run's image rows: {config.data.path}: {exc}",
                       "restore the run's data file, or export merged or bnb-8bit instead") from None
    collator = vision.collator(side)
    rows, images = [], 0
    for i in spread(len(train), samples):
        feature = train[i]
        images += vision.image_token_id in feature["input_ids"]
        batch = collator([feature])
        rows.append({"input_ids": feature["input_ids"], "inputs": {k: v for k, v in batch.items() if k != "labels"}})
    return ImageRows(rows, dtype), (f"{len(rows)} rows of the run's training data ({images} with their images, "
                                    f"{vision.family.label} rows as training built them, each whole)")


def ignored_parts(family: VisionFamily) -> list[str]:
    """compressed-tensors ignore entries for the tower and projector by their module names' last part, as
    llmcompressor's VLM recipes write them (`re:.*vision_tower.*`)."""
    parts = [prefix.rstrip(".").rsplit(".", 1)[-1] for prefix in family.tower + family.projector]
    return [f"re:.*{part}.*" for part in dict.fromkeys(parts)]


def ignore_by_pattern(compressor: Any, family: VisionFamily, ignore: list[str]) -> None:
    """Complete the ignore list config.json will hold. compressed-tensors writes each ignored layer under its
    checkpoint name (Qwen2.5-VL's `visual.blocks.0.attn.qkv`, an old LLaVA's `language_model.lm_head`), which
    transformers does not map back when it loads the folder (the modules are `model.visual.blocks.0.attn.qkv`
    and `lm_head`, so it would quantize them with scales the file lacks). Added: the tower's and projector's
    patterns, which match both names and those vLLM maps them to, and the other layers' in-memory names
    (`ignore`)."""
    config = compressor.quantization_config
    patterns = ignored_parts(family)
    plain = [name for name in ignore if not any(re.fullmatch(p[3:], name) for p in patterns)]
    config.ignore = list(dict.fromkeys([*(config.ignore or []), *plain, *patterns]))


def kept_parts(family: VisionFamily, ignore: list[str]) -> str:
    """The report's words for what stayed 16-bit: the tower and projector by prefix, then the other layers."""
    prefixes = family.tower + family.projector
    rest = [name for name in ignore if not name.startswith("re:") and not name.startswith(prefixes)]
    return ", ".join([f"the vision tower ({', '.join(p.rstrip('.') for p in family.tower)})",
                      f"the projector ({', '.join(p.rstrip('.') for p in family.projector)})", *rest])


def check_layers(family: VisionFamily, prefix: str) -> None:
    """The decoder layers found (layers.decoder_layers) must be those the registry names for the family: a
    transformers release that moved them would otherwise calibrate another stack."""
    if prefix != family.calibrated_layers:
        raise RuntimeError(f"{family.label}: the language model's decoder layers are at {prefix}, not at "
                           f"{family.calibrated_layers} as backend/core/registries/vision_families.py says")


class _Deepstack:
    """Where the model adds to the hidden states between decoder layers (Qwen3-VL's deepstack: features of
    the tower's early layers added at the image positions after each of the first decoder layers), which
    collect.py's layer-by-layer runs would skip. While the model's own forward runs (collect.capture) each
    addition is recorded under its batch (the identity of the position embeddings its layers share); when a
    layer runs alone, a pre-hook adds the previous layer's recorded addition to its input, as the model would."""

    def __init__(self, language: torch.nn.Module, stack: torch.nn.ModuleList):
        self.language, self.stack, self.inside, self.batch = language, stack, False, 0
        self.added: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self.add = language._deepstack_process
        self.handles: list[Any] = []

    def __enter__(self) -> _Deepstack:
        outer, add = self.language.forward, self.add

        def forward(*args: Any, **kwargs: Any) -> Any:
            self.inside = True
            try:
                return outer(*args, **kwargs)
            finally:
                self.inside = False

        def record(hidden: torch.Tensor, mask: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
            self.added.setdefault(self.batch, []).append((mask, embeds))
            return add(hidden, mask, embeds)

        self.language.forward, self.language._deepstack_process = forward, record
        self.handles = [layer.register_forward_pre_hook(self._before(index), with_kwargs=True)
                        for index, layer in enumerate(self.stack)]
        return self

    def _before(self, index: int) -> Any:
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
            key = id(kwargs["position_embeddings"][0])
            if self.inside:  # the model's own forward: it adds them itself
                if index == 0:
                    self.batch = key
                return None
            added = self.added.get(key, [])
            if index == 0 or index > len(added):
                return None
            hidden = self.add(args[0] if args else kwargs["hidden_states"], *added[index - 1])
            if args:
                return (hidden, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": hidden}
        return hook

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()
        del self.language.forward, self.language._deepstack_process


def between_layers(model: torch.nn.Module, stack: torch.nn.ModuleList) -> Any:
    """A context in which collect.calibrate's layer-by-layer runs see what the model adds between its decoder
    layers: Qwen3-VL's deepstack features (_Deepstack), nothing for the other families."""
    import contextlib

    language = model.get_decoder()
    if hasattr(language, "_deepstack_process"):
        return _Deepstack(language, stack)
    return contextlib.nullcontext()
