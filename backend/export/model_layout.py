"""ModelLayout: how a checkpoint's on-disk tensor names meet the modules peft and bitsandbytes saw.

The merge works in the checkpoint's own names (what `save_pretrained` writes: per-expert tensors
for MoE, `block_sparse_moe` for Mixtral), while an adapter's keys follow the in-memory module names
of the model transformers built (fused `mlp.experts`, `mlp` for Mixtral). The model is built on
the meta device (no memory) and transformers' own conversion mapping renames every disk name, so
the two sides meet without a table of our own. The same meta model says which modules are
Conv1D (GPT-2 stores those weights transposed) or embeddings, and, passed through transformers'
bitsandbytes quantizer, which Linear layers a qlora/lora8 run held in 4 or 8 bits.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from backend.core.errors import bad_input
from backend.core.vision_folder import VisionFolder
from backend.training.vision.parts import skip_quantization

EXPERT_INDEX = re.compile(r"\.experts\.(\d+)\.")


def slice_of(disk_name: str, part: int, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """Where one per-expert disk tensor sits in its fused parameter: (expert or -1, first row, end row).
    transformers stacks the experts along axis 0 and concatenates the parts (gate, then up) along axis 1."""
    match = EXPERT_INDEX.search(disk_name)
    return (int(match[1]) if match else -1), part * shape[0], (part + 1) * shape[0]


def auto_model_class(folder: Path) -> Any:
    """The transformers Auto class that builds the model as trained: a proven vision-language folder's whole
    image-text model (its tower and projector have checkpoint tensors too), else the causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if VisionFolder.read(folder).family is not None else AutoModelForCausalLM


@dataclass
class ModelLayout:
    config: Any
    to_memory: dict[str, str]  # disk name -> in-memory parameter name (1:1 renames only)
    to_disk: dict[str, str]  # in-memory parameter name -> disk name
    fused: dict[str, list[str]]  # in-memory fused parameter (MoE experts) -> the disk tensors it is built from
    kinds: dict[str, str]  # in-memory module name -> linear | conv1d | embedding
    shapes: dict[str, tuple[int, ...]]  # disk name -> shape
    quantized: set[str] = field(default_factory=set)  # in-memory module names bitsandbytes replaced
    quant_kwargs: dict[str, Any] = field(default_factory=dict)  # Params4bit/Int8Params attributes
    experts: dict[str, tuple[int, ...]] = field(default_factory=dict)  # 3-D expert parameter -> shape, in registration order
    transposed: set[str] = field(default_factory=set)  # expert modules holding (experts, in, out): not merged
    slices: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # per-expert disk tensor -> (expert, rows)

    @classmethod
    def build(cls, folder: Path, shapes: dict[str, tuple[int, ...]], trust_remote_code: bool = False,
              quantization: str | None = None, compute_dtype: torch.dtype = torch.bfloat16) -> "ModelLayout":
        from transformers import AutoConfig
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key
        from transformers.pytorch_utils import Conv1D

        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        auto = auto_model_class(folder)
        with torch.device("meta"):
            meta = auto.from_config(config, trust_remote_code=trust_remote_code)
        conversions = get_model_conversion_mapping(meta)
        renamings = [c for c in conversions if isinstance(c, WeightRenaming)]
        converters = [c for c in conversions if isinstance(c, WeightConverter)]
        meta_state = meta.state_dict()
        to_memory, to_disk, fused, parts = {}, {}, {}, {}
        for name in shapes:
            renamed, pattern = rename_source_key(name, renamings, converters, meta.base_model_prefix, meta_state)
            if pattern is not None:
                fused.setdefault(renamed, []).append(name)
                parts[name] = next(c.source_patterns.index(pattern) for c in converters if pattern in c.source_patterns)
            else:
                to_memory[name] = renamed
                to_disk[renamed] = name
        kinds = {}
        for name, module in meta.named_modules():
            if isinstance(module, Conv1D):
                kinds[name] = "conv1d"
            elif isinstance(module, torch.nn.Linear):
                kinds[name] = "linear"
            elif isinstance(module, torch.nn.Embedding):
                kinds[name] = "embedding"
        layout = cls(config, to_memory, to_disk, fused, kinds, dict(shapes),
                     experts={name: tuple(t.shape) for name, t in meta_state.items() if t.dim() == 3},
                     transposed={name for name, module in meta.named_modules() if getattr(module, "is_transposed", False)})
        layout.slices = {disk: slice_of(disk, parts[disk], shapes[disk]) for names in fused.values() for disk in names}
        if quantization:
            layout._find_quantized(config, quantization, compute_dtype, trust_remote_code, folder)
        return layout

    def _find_quantized(self, config: Any, quantization: str, compute_dtype: torch.dtype, trust: bool,
                        folder: Path) -> None:
        """The Linear layers transformers' bitsandbytes quantizer replaces, asked of the quantizer itself (a
        vision-language model's tower and projector stayed 16-bit in training: the same skip list here)."""
        import bitsandbytes as bnb
        from transformers.quantizers import AutoHfQuantizer

        from backend.export.quantized_base import bnb_config

        family = VisionFolder.read(folder).family
        skip = skip_quantization(family) if family is not None else None
        quantizer = AutoHfQuantizer.from_config(bnb_config(quantization, compute_dtype, skip), pre_quantized=False)
        with torch.device("meta"):
            model = auto_model_class(folder).from_config(config, trust_remote_code=trust)
        quantizer.preprocess_model(model, device_map={"": "cpu"}, keep_in_fp32_modules=model._keep_in_fp32_modules)
        kind = bnb.nn.Linear4bit if quantization == "nf4" else bnb.nn.Linear8bitLt
        for name, module in model.named_modules():
            if isinstance(module, kind):
                self.quantized.add(name)
                if not self.quant_kwargs:
                    attrs = dict(module.weight.__dict__)
                    for transient in ("module", "quant_state", "bnb_quantized", "CB", "SCB"):
                        attrs.pop(transient, None)
                    self.quant_kwargs = attrs
        if not self.quantized:
            raise bad_input(f"bitsandbytes {quantization} finds no Linear layers to quantize in this {config.model_type} model")

    # --- queries --------------------------------------------------------------------------------
    def module_of(self, disk_name: str) -> tuple[str, str] | None:
        """(in-memory module name, parameter name) of a disk tensor, or None for fused experts."""
        memory = self.to_memory.get(disk_name)
        if memory is None or "." not in memory:
            return None
        module, _, param = memory.rpartition(".")
        return module, param

    def expert_parameters(self, module: str) -> list[str]:
        """The 3-D expert parameters of a module (peft's ParamWrapper targets), in registration order."""
        return [name for name in self.experts if name.rpartition(".")[0] == module]

    def disk_tensors(self, parameter: str) -> list[str]:
        """The checkpoint tensors an in-memory parameter is built from (one, or one per expert and part)."""
        return self.fused.get(parameter) or ([self.to_disk[parameter]] if parameter in self.to_disk else [])
