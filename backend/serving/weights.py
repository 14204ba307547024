"""The weights an export holds on the GPU, by format: the parameter count times each format's bytes.

16-bit: 2 B per parameter (vLLM's dtype auto serves an fp32 checkpoint in 16-bit too). bitsandbytes
quantizes the decoder's nn.Linear weights only (backend.estimate.states says why the fused experts
and routers stay 16-bit): LLM.int8 1 B plus one fp32 scale per output row; NF4 with double
quantization as backend.estimate.quantization counts it. GGUF: the block sizes of the GGML types
(Q8_0 34 B, Q5_0 22 B, Q4_0 18 B per 32 weights: each GGUF entry's ggml_bytes in the export registry)
for every matrix, F32 for 1-D tensors. The calibrated exports (gptq-int4, awq-int4, w8a8): the tensors
their safetensors files hold when the export is there, else as calibrated.py predicts them (4-bit or
8-bit decoder linears with 16-bit scales, the rest 16-bit). Each format is sized by its family's rule
(BY_FAMILY). Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from backend.core.registries.export_formats import ExportFormat, export_format
from backend.estimate.architectures import Arch, Dims, all_linears, count_params
from backend.core.registries.serving_options import SERVED_FORMATS
from backend.estimate.quantization import nf4_bytes
from backend.serving.calibrated import WeightFiles, predicted


@dataclass(frozen=True)
class Weights:
    """Bytes of the weights per GPU, and how they were counted."""

    bytes: int
    params: int
    how: str


def weight_bytes(arch: Arch, dims: Dims, fmt: str, tensor_parallel: int = 1, files: WeightFiles | None = None) -> Weights:
    """The weights of `fmt` on one GPU; tensor parallelism splits every matrix (and vLLM's
    vocabulary-parallel embedding) across the GPUs, so the share is 1/T of the whole. `files`: what a
    calibrated export's safetensors hold (vLLM repacks them for its kernels at the same size: an
    assumption, not measured here)."""
    if fmt not in SERVED_FORMATS:
        raise ValueError(f"--format {fmt}: a server loads {', '.join(SERVED_FORMATS)} (an adapter is served on its base)")
    spec = export_format(fmt)
    total = count_params(arch, dims).total
    held, how = BY_FAMILY[spec.family](arch, dims, spec, files)
    return Weights(-(-held // tensor_parallel), total, how + (f", split over {tensor_parallel} GPUs" if tensor_parallel > 1 else ""))


def _sixteen_bit(arch: Arch, dims: Dims, spec: ExportFormat, files: WeightFiles | None) -> tuple[int, str]:
    return 2 * count_params(arch, dims).total, "16-bit: 2 B per parameter"


def _bitsandbytes(arch: Arch, dims: Dims, spec: ExportFormat, files: WeightFiles | None) -> tuple[int, str]:
    counts = count_params(arch, dims)
    linears = [(lin.inp, lin.out, n) for lin, n in all_linears(arch, dims)] + list(dims.extra_linears)
    linear = counts.linear_weights + dims.extra_linear_params
    if spec.bits == 8:
        scales = sum(out * n for _, out, n in linears) * 4
        return (linear + scales + 2 * (counts.total - linear),
                "LLM.int8: 1 B per linear weight + one fp32 scale per row; the rest 16-bit")
    nf4 = sum(sum(nf4_bytes(inp * out, double_quant=True).values()) * n for inp, out, n in linears)
    return (nf4 + 2 * (counts.total - linear),
            "NF4 with double quantization: about 0.52 B per linear weight; the rest 16-bit")


def _calibrated(arch: Arch, dims: Dims, spec: ExportFormat, files: WeightFiles | None) -> tuple[int, str]:
    return (files.bytes, files.how) if files is not None else predicted(arch, dims, spec.name)


def _gguf(arch: Arch, dims: Dims, spec: ExportFormat, files: WeightFiles | None) -> tuple[int, str]:
    counts = count_params(arch, dims)
    vectors = counts.norms + counts.linear_biases
    per = spec.ggml_bytes
    held = int((counts.text - vectors) * per) + 4 * vectors  # the GGUF writer skips a vision tower
    return held, f"GGUF {spec.ggml_type}: {per:.4g} B per matrix weight, 1-D tensors F32"


BY_FAMILY = {"hf": _sixteen_bit, "bnb": _bitsandbytes, "calibrated": _calibrated, "gguf": _gguf}
"""A served format's family (export_formats.py) -> (bytes on one GPU before tensor parallelism, how)."""
