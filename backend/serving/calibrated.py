"""The calibrated exports (gptq-int4, awq-int4, w8a8) as a server sees them. Torch-free.

A compressed-tensors folder is recognised from config.json's quantization_config (what vLLM and
transformers read too), its weights are counted from the tensors its safetensors files hold (packed
int4 with 16-bit group scales, or int8 with 16-bit row scales; embeddings, norms and lm_head 16-bit),
and before the export exists they are predicted from config.json the way the export writes them
(docs/export.md, "GPTQ, AWQ and SmoothQuant").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backend.core.registries.export_formats import EXPORT_FORMATS, export_format, group_size_for
from backend.serving.safetensors_header import safetensors_sum
from backend.estimate.architectures import Arch, Dims, all_linears, count_params

FORMATS_OF = {kind: tuple(f.name for f in EXPORT_FORMATS.values() if f.calibrated and f.scheme == scheme)
              for kind, scheme in (("int4", "W4A16"), ("int4_asym", "W4A16_ASYM"), ("w8a8", "W8A8"))}
"""A scheme the export writes -> the formats written in it (gptq-int4 symmetric, awq-int4 asymmetric groups)."""
SCALE_BYTES = 2
"""A scale is stored in the export's 16-bit dtype (bf16 or fp16)."""
ZERO_BITS = 4
"""An asymmetric group's zero point: 4 bits, packed eight to an int32 along the output rows."""
SHAPE_BYTES = 16
"""pack-quantized keeps each layer's unpacked shape as an int64[2] tensor (weight_shape)."""


@dataclass(frozen=True)
class WeightFiles:
    """Bytes of the tensors an export's safetensors files hold, and what they are."""

    bytes: int
    how: str


def scheme_of(config: dict[str, Any]) -> str | None:
    """"int4" (W4A16 groups: gptq-int4), "int4_asym" (W4A16_ASYM groups: awq-int4) or "w8a8" for a
    compressed-tensors scheme the export writes, "" for another compressed-tensors scheme, None without a
    compressed-tensors quantization_config."""
    quant = config.get("quantization_config")
    if not isinstance(quant, dict) or quant.get("quant_method") != "compressed-tensors":
        return None
    kinds = set()
    for group in (quant.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        inputs = (group or {}).get("input_activations") or {}
        asymmetric = weights.get("symmetric") is False
        if weights.get("type") != "int":
            kinds.add("")
        elif weights.get("num_bits") == 4 and weights.get("strategy") == "group" and not inputs:
            kinds.add("int4_asym" if asymmetric else "int4")
        elif asymmetric:
            kinds.add("")
        elif weights.get("num_bits") == 8 and inputs.get("num_bits") == 8 and inputs.get("dynamic"):
            kinds.add("w8a8")
        else:
            kinds.add("")
    return kinds.pop() if len(kinds) == 1 else ""


def group_of(config: dict[str, Any]) -> int | None:
    """The 4-bit group size config.json's quantization_config names (None for w8a8 or when unsaid)."""
    for group in (config.get("quantization_config", {}).get("config_groups") or {}).values():
        size = ((group or {}).get("weights") or {}).get("group_size")
        if isinstance(size, int) and size > 0:
            return size
    return None


def describe(scheme: str, group: int | None) -> str:
    """The layout in words, for the estimate's `weights_how`."""
    if scheme in ("int4", "int4_asym"):
        zero = " and a 4-bit zero point" if scheme == "int4_asym" else ""
        return (f"int4 packed 8 to an int32 + a 16-bit scale{zero} per group of {group or '?'} in the decoder's "
                "linear layers; embeddings, norms and lm_head 16-bit")
    return "int8 + a 16-bit scale per row in the decoder's linear layers; embeddings, norms and lm_head 16-bit"


def folder_format(path: Path, config: dict[str, Any], fmt: str | None) -> str:
    """The format a compressed-tensors folder is served as, or a one-line ValueError for a --format it is not."""
    scheme = scheme_of(config)
    names = FORMATS_OF[scheme] if scheme else ()
    if fmt is None:
        return names[0]
    if fmt not in names:
        raise ValueError(f"--format {fmt}: {path} holds compressed-tensors {'/'.join(names)} weights (config.json's "
                         "quantization_config); leave --format out")
    return fmt


def check_export(path: Path, config: dict[str, Any], fmt: str) -> None:
    """A one-line ValueError when a calibrated export's config.json does not say what its report does."""
    if fmt not in FORMATS_OF.get(scheme_of(config) or "", ()):
        raise ValueError(f"{path / 'config.json'}: no compressed-tensors quantization_config of a {fmt} export "
                         "(vLLM and transformers read it from there); export the run again")


def weight_files(path: Path, config: dict[str, Any]) -> WeightFiles:
    """What the folder's safetensors files hold: every tensor's bytes from the headers, none read."""
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no .safetensors files beside config.json; export the run again")
    total = sum(tensor_bytes(f) for f in files)
    where = files[0].name if len(files) == 1 else f"{len(files)} safetensors files"
    return WeightFiles(total, f"as {where} holds them: {describe(scheme_of(config) or 'int4', group_of(config))}")


def tensor_bytes(path: Path) -> int:
    """Bytes of a safetensors file's tensors from its header's offsets."""
    return safetensors_sum(path, lambda entry: entry["data_offsets"][1] - entry["data_offsets"][0],
                           "export the run again")


def predicted(arch: Arch, dims: Dims, fmt: str) -> tuple[int, str]:
    """(bytes, how) of `fmt` before it is exported: the decoder's linear layers as the export writes them,
    everything else 16-bit; a one-line ValueError for a model the export refuses."""
    if dims.moe_layers or dims.model_type == "gpt2":
        why = "routes to experts" if dims.moe_layers else "keeps its weights in Conv1D layers"
        raise ValueError(f"--format {fmt}: model_type {dims.model_type} {why}, which the calibrated exports refuse "
                         "(docs/export.md); size merged, bnb-4bit or a GGUF")
    linears = all_linears(arch, dims)
    total = count_params(arch, dims).total
    quantized_weights = sum(lin.inp * lin.out * n for lin, n in linears)
    if export_format(fmt).bits == 8:  # int8 per row; 4-bit weights come in groups
        held = sum((lin.inp * lin.out + SCALE_BYTES * lin.out) * n for lin, n in linears)
        how = describe("w8a8", None)
    else:
        group = group_size_for(lin.inp for lin, _ in linears)
        if group is None:
            raise ValueError(f"--format {fmt}: the linear layers' input widths are not all multiples of 32, which "
                             "4-bit groups need; size w8a8 or gguf-q8_0")
        asymmetric = not export_format(fmt).symmetric
        zero_bytes = (lambda lin: -(-lin.out * ZERO_BITS // 32) * 4 * (lin.inp // group)) if asymmetric else (lambda lin: 0)
        held = sum((lin.inp * lin.out // 2 + SCALE_BYTES * lin.out * (lin.inp // group) + zero_bytes(lin)
                    + SHAPE_BYTES) * n for lin, n in linears)
        how = describe("int4_asym" if asymmetric else "int4", group)
    return held + 2 * (total - quantized_weights), "predicted from config.json: " + how
