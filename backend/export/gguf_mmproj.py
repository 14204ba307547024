"""MmprojExport: a vision-language run's tower and projector as llama.cpp's mmproj GGUF (arch `clip`).

llama.cpp reads a VLM as two files: the language model (gguf_writer.GgufExport, the text half) and this
one, which its mtmd library (clip.cpp) loads beside it. The family's layout (names, keys, rearrangements)
is mmproj_layouts.py's; tensor names come from gguf-py's MMPROJ map, as convert_hf_to_gguf.py's do.
The file is F16 whatever the text half's type (1-D tensors, and those the converter forces, F32), as the
converter writes an mmproj with `--outtype f16`: the tower is small beside the language model, and
llama.cpp quantizes it only on request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import gguf
import numpy as np

from backend.core.errors import bad_input
from backend.core import vision_folder
from backend.core.vision_folder import VisionFolder
from backend.export.mmproj_layouts import MMPROJ_LAYOUTS, MmprojLayout
from backend.export.tensor_source import TensorSource

Q = gguf.GGMLQuantizationType
MIN_BLOCKS = 8
POSITIONS = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_ENC_EMBD_POS]


@dataclass
class MmprojTensor:
    """One GGUF tensor and where it comes from: `part` of the source tensor (axis 0 thirds, or a Conv3D time slice)."""

    gguf_name: str
    source: str
    converter: str  # the name convert_hf_to_gguf.py maps
    shape: tuple[int, ...]
    part: tuple[str, int] | None = None  # ("third", i) of a fused QKV, ("time", t) of a Conv3D kernel
    shift: float = 0.0
    ggml_type: Any = field(default=None)


def processor_settings(folders: tuple[Path, ...]) -> dict[str, Any]:
    """The image processor's settings from the first folder holding them (the run's copy first: it holds the
    `vision.max_pixels` cap), merged as the converter merges preprocessor_config.json and processor_config.json."""
    for folder in folders:
        settings, _ = vision_folder.processor_settings(folder)
        if "image_mean" in settings and "image_std" in settings:
            return settings
    raise bad_input(f"no image processor settings (image_mean/image_std) in {', '.join(map(str, folders))}",
                    "keep the model folder's preprocessor_config.json or processor_config.json beside it")


def layout_of(config: dict[str, Any]) -> MmprojLayout:
    """The family's mmproj layout, or a one-line refusal naming the families written."""
    family = VisionFolder.from_config(config).family
    layout = MMPROJ_LAYOUTS.get(family.key) if family is not None else None
    if layout is None:
        raise bad_input(f"the mmproj GGUF is written for {', '.join(MMPROJ_LAYOUTS)}; this model is "
                        f"{config.get('model_type')}", "export merged instead")
    problems = layout.problems(config.get("vision_config") or {})
    if problems:
        raise bad_input(f"llama.cpp's {layout.projector_type} projector would not compute what this model computes: "
                        + "; ".join(problems), "export merged instead")
    return layout


class MmprojExport:
    """Plan, then write, the mmproj GGUF from the merged model's tensors (a TensorSource, one at a time)."""

    def __init__(self, source: TensorSource, config: dict[str, Any], processor: dict[str, Any], name: str):
        self.source = source
        self.config = config
        self.vision = config.get("vision_config") or {}
        self.processor = processor
        self.name = name
        self.layout = layout_of(config)
        self.plan = self._plan()

    def _plan(self) -> list[MmprojTensor]:
        # the projector's numbered layers (Qwen's merger.mlp.2) use the block pattern too, so a tower shallower
        # than them still needs their numbers in the map
        depth = max(int(self.vision[self.layout.depth_keys[0]]), MIN_BLOCKS)
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, depth)
        plan: list[MmprojTensor] = []
        for hf_name in self.source.names():
            converter = self.layout.converter_name(hf_name, self.vision)
            if converter is None:
                continue
            shape = tuple(self.source.shape(hf_name))
            shift = 1.0 if converter in self.layout.norm_shift else 0.0
            if self.layout.split_qkv and ".qkv." in converter:  # Qwen2VLVisionModel.modify_tensors: thirds
                third = (shape[0] // 3, *shape[1:])
                for i, part in enumerate(("q", "k", "v")):
                    mapped = self._mapped(names, converter.replace(".qkv.", f".{part}."), hf_name)
                    plan.append(MmprojTensor(mapped, hf_name, converter, third, ("third", i)))
            elif converter.endswith("patch_embed.proj.weight") and len(shape) == 5:  # Conv3D -> two Conv2D kernels
                base = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.V_ENC_EMBD_PATCH] + ".weight"
                for t, suffix in enumerate(("", ".1")):
                    plan.append(MmprojTensor(base + suffix, hf_name, converter, (*shape[:2], *shape[3:]), ("time", t)))
            else:
                plan.append(MmprojTensor(self._mapped(names, converter, hf_name), hf_name, converter, shape, shift=shift))
        if not plan:
            raise bad_input(f"no tower or projector tensors found for {self.layout.projector_type}",
                            "export merged instead")
        for t in plan:
            t.ggml_type = self._type_for(t)
        return plan

    @staticmethod
    def _mapped(names: Any, converter: str, hf_name: str) -> str:
        mapped = names.get_name(converter, try_suffixes=(".weight", ".bias"))
        if mapped is None:
            raise bad_input(f"tensor {hf_name} has no name in llama.cpp's mmproj layout", "export merged instead")
        return mapped

    def _type_for(self, t: MmprojTensor) -> Any:
        """F16 for weights of 2 or more dimensions; F32 for vectors, the position table (the converter's rule for
        V_ENC_EMBD_POS: clip.cpp resizes it, which ggml does in F32 only) and what the family's converter forces."""
        if (len(t.shape) <= 1 or t.gguf_name.startswith(POSITIONS)
                or any(part in t.converter for part in self.layout.f32)):
            return Q.F32
        return Q.F16

    @property
    def tensor_bytes(self) -> int:
        return sum(int(np.prod(t.shape)) * (2 if t.ggml_type == Q.F16 else 4) for t in self.plan)

    def arrays(self, t: MmprojTensor) -> np.ndarray:
        """The tensor as written: its part of the source tensor, shifted, in its GGML type's numpy dtype."""
        array = self.source.get(t.source).float().numpy()
        if t.part and t.part[0] == "third":
            size = array.shape[0] // 3
            array = array[t.part[1] * size:(t.part[1] + 1) * size]
        elif t.part and t.part[0] == "time":
            array = array[:, :, t.part[1]]
        if t.shift:
            array = array + t.shift
        dtype = np.float16 if t.ggml_type == Q.F16 else np.float32
        out = np.ascontiguousarray(array, dtype=dtype)
        if not np.isfinite(out).all():
            raise bad_input(f"tensor {t.source} has values beyond float16's range (±65504), which the mmproj's F16 "
                            "cannot hold", "export merged instead")
        return out

    def _metadata(self, w: Any) -> None:
        w.add_type(gguf.GGUFType.MMPROJ)
        w.add_name(self.name)
        w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
        text = self.config.get("text_config") or self.config
        self.layout.common(self.vision, self.processor, int(text["hidden_size"]), w)
        self.layout.extra(self.config, self.vision, self.processor, w)

    def tensors(self) -> Iterator[MmprojTensor]:
        return iter(self.plan)

    def write(self, path: Path, should_stop: Callable[[], bool] | None = None) -> None:
        writer = gguf.GGUFWriter(path, "clip")
        try:
            self._metadata(writer)
            for t in self.plan:
                dtype = np.float16 if t.ggml_type == Q.F16 else np.float32
                writer.add_tensor_info(t.gguf_name, t.shape, np.dtype(dtype), int(np.prod(t.shape)) * np.dtype(dtype).itemsize)
            writer.write_header_to_file(path)
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for t in self.plan:
                if should_stop and should_stop():
                    raise InterruptedError("stop requested")
                writer.write_tensor_data(self.arrays(t))
        finally:
            writer.close()
