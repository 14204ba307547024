"""Every export format in one typed registry: what it is, who loads it, how it is checked, sized and
served, and the modules (its "doors") that refuse, write and read it back. Torch-free at every depth.

The CLI's `--format` choices, the Export page's list, the serving choices and the tolerances the
report states all come from here, so the code, the report and docs/export.md (which says how the
tolerances were chosen) state the same numbers. The doors import torch and the format's own library,
so they are named as dotted strings and load on first use, as backend/training/objectives/registry.py
does. A new format is one `register_format` line, plus its door module when it is a new family
(docs/architecture.md, "An export format"). FORMATS, CALIBRATED, GGUF_TYPES, TOLERANCES and
ALTERNATIVES are views of the registry for the callers that want a plain table.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from backend.core.errors import bad_input
from backend.core.registries.vision_families import VISION_FAMILIES

Family = Literal["adapter", "hf", "bnb", "gguf", "calibrated"]
"""adapter: the PEFT folder as trained; hf: the merged 16-bit folder; bnb: bitsandbytes-quantized folders;
gguf: one GGUF file for llama.cpp; calibrated: compressed-tensors folders fitted on the run's data."""


@dataclass(frozen=True)
class Bounds:
    """A check's tolerance against the trained model measured in one 16-bit dtype, and what to try when an
    export fails it (never the format and dtype that failed)."""

    max_increase: float  # largest relative perplexity increase
    min_top1: float  # smallest top-1 agreement at decided positions
    alternatives: tuple[tuple[str, str | None], ...]  # (format, dtype or None: any)
    why: str = "see export_report.json for the figures"  # the failure hint's reason


@dataclass(frozen=True)
class DiskRule:
    """The disk a format needs while it is written, per weight of the merged model (export_target.py adds
    5% and 1 MB for the tokenizer, metadata and report)."""

    linear_bytes: float  # bytes per linear-layer weight as written; every other weight stays 16-bit
    scratch: bool = False  # a 16-bit merged copy is written first, beside the result, and removed at the end


@dataclass(frozen=True)
class Doors:
    """The modules holding a format's code, imported on first use (each imports torch or the format's library).

    refusal: `refuse(name, run)` raises JobError for what is missing before anything loads (None: nothing
    beyond the run folder's own checks). writer: `Writer(work)` with `planned_bytes` and `write(folder) ->
    notes`. verifier: `read_back(work, folder) -> (model or None, loaded as, dtype held, why unread)`,
    `checks(work, folder, measured)` adding its tokenizer check, and `not_verified(...)` where read_back can
    decline. `work` is backend/export/doors/work.py's ExportWork."""

    writer: str
    verifier: str
    refusal: str | None = None


@dataclass(frozen=True)
class ExportFormat:
    """One `--format`: its declarative facts and its doors."""

    name: str
    description: str  # what is written and who loads it (the CLI's help, the Export page's tooltip)
    family: Family
    doors: Doors
    bounds: Mapping[str | None, Bounds] = field(hash=False)  # by the export's 16-bit dtype; None: any dtype
    disk: DiskRule | None  # None: the writer plans its bytes exactly (the adapter's files, a GGUF's tensors)
    merged: bool = True  # written from the merged model; False: the adapter folder as trained
    merge_precision: str | None = None  # the merged tensors' dtype handed to the writer (None: the export's)
    read_back_in: str | None = None  # what the check reads it back in, when not the export's 16-bit dtype
    offers_dtype: bool = False  # the Export page offers the 16-bit dtype (the CLI's --dtype takes any format)
    ggml_type: str | None = None  # GGUF: the GGML type of its 2-D weights (1-D tensors stay F32, odd rows F16)
    ggml_bytes: float | None = None  # GGUF: that type's bytes per weight (a block's bytes over its weights)
    bits: int | None = None  # bnb and calibrated: the bits of each quantized linear weight
    activation_bits: int | None = None  # calibrated: linear inputs rounded per token at run time (None: 16-bit)
    algorithm: str | None = None  # calibrated: what fits the weights to the run's data
    symmetric: bool = True  # calibrated: False, a zero point per group beside its scale (W4A16_ASYM)
    served_by: tuple[str, ...] = ()  # the `serve` engines that load it as it is, in the order `auto` prefers
    serve_order: int | None = None  # where it stands in SERVED_FORMATS (None: not served as it is)
    vllm_quantization: str | None = None  # vLLM's --quantization for it (None: vLLM reads config.json)
    method_hints: Mapping[str, str] = field(default_factory=dict, hash=False)  # a failure hint per run method
    vision_gap: str | None = None  # what is missing for a vision-language run (None: it exports one)
    vision_families: tuple[str, ...] | None = None  # the VLM family labels it is proven on (None: every one)
    vision_limit: str = ""  # the refusal's words for a family outside vision_families ({families}: those it is on)
    vision_writes: str = ""  # what a vision-language run's export holds of its image side (the Export page's help)

    @property
    def calibrated(self) -> bool:
        """Calibrated on the run's training data (backend/export/calibrated/)."""
        return self.family == "calibrated"

    @property
    def holds_dtype(self) -> bool:
        """Its files hold tensors in the export's 16-bit dtype (the report records it; a GGUF holds its GGML types)."""
        return self.merged and self.ggml_type is None

    @property
    def scheme(self) -> str | None:
        """The compressed-tensors preset of a calibrated format (W4A16, W4A16_ASYM, W8A8)."""
        if not self.calibrated:
            return None
        return f"W{self.bits}A{self.activation_bits or 16}" + ("" if self.symmetric else "_ASYM")

    def bounds_for(self, dtype: str) -> Bounds:
        return self.bounds.get(dtype) or self.bounds[None]

    def refuse(self, run: Any) -> None:
        """Raise JobError in one line for what is missing before anything loads (a package, a probe, the model)."""
        if self.doors.refusal:
            importlib.import_module(self.doors.refusal).refuse(self.name, run)

    def writer(self) -> ModuleType:
        return importlib.import_module(self.doors.writer)

    def verifier(self) -> ModuleType:
        return importlib.import_module(self.doors.verifier)


EXPORT_FORMATS: dict[str, ExportFormat] = {}


def register_format(fmt: ExportFormat) -> None:
    """Add a format; a name registered twice is a programming error."""
    if fmt.name in EXPORT_FORMATS:
        raise ValueError(f"export format {fmt.name!r} is registered twice")
    EXPORT_FORMATS[fmt.name] = fmt


def export_format(name: str) -> ExportFormat:
    """The registered format `name` (KeyError for another name: callers check against FORMATS first)."""
    return EXPORT_FORMATS[name]


# --- the formats (tolerances: the reasoning and the measured figures are in docs/export.md) --------

ADAPTER_DOORS = Doors("backend.export.doors.adapter", "backend.export.doors.adapter")
HF_DOORS = Doors("backend.export.doors.hf", "backend.export.doors.hf")
BNB_DOORS = Doors("backend.export.doors.bnb", "backend.export.doors.bnb", refusal="backend.export.doors.bnb")
GGUF_DOORS = Doors("backend.export.doors.gguf", "backend.export.doors.gguf", refusal="backend.export.doors.gguf")
CALIBRATED_DOORS = Doors("backend.export.doors.calibrated", "backend.export.doors.calibrated",
                         refusal="backend.export.calibrated.support")
SERVERS = ("vllm", "transformers")  # vLLM where it runs (a GPU), else transformers
FP16_RANGE = "fp16 holds values only up to 65504, which some models' activations exceed"

register_format(ExportFormat(
    "adapter", "the PEFT adapter folder; load it with peft on top of the base model", "adapter", ADAPTER_DOORS,
    {None: Bounds(1e-3, 0.999, (("merged", "fp16"),))},  # the same tensors reloaded and computed the same way
    disk=None, merged=False))
register_format(ExportFormat(
    "merged", "adapter merged into a 16-bit copy of the base (safetensors); load it with transformers", "hf", HF_DOORS,
    {"bf16": Bounds(0.03, 0.98, (("merged", "fp16"), ("adapter", None)),
                    "bf16 keeps 8 significant bits, so an adapter change below half a bf16 step of its weight is "
                    "rounded away; fp16 keeps 11 (8x finer) and the adapter keeps everything"),
     "fp16": Bounds(0.01, 0.99, (("merged", "bf16"), ("adapter", None)), FP16_RANGE)},
    disk=DiskRule(2.0), offers_dtype=True, served_by=SERVERS, serve_order=0,
    vision_writes="the vision tower and projector 16-bit beside the language model, and the processor"))
BNB_VISION = "the language model quantized; the vision tower, projector and head kept 16-bit (llm_int8_skip_modules)"

register_format(ExportFormat(
    "bnb-8bit", "merged model quantized with bitsandbytes LLM.int8; transformers loads it 8-bit", "bnb", BNB_DOORS,
    {None: Bounds(0.05, 0.95, (("merged", None), ("gguf-q8_0", None)))},
    disk=DiskRule(1.0, scratch=True), offers_dtype=True, bits=8, served_by=SERVERS, serve_order=4,
    vllm_quantization="bitsandbytes", vision_writes=BNB_VISION))
register_format(ExportFormat(
    "bnb-4bit", "merged model quantized with bitsandbytes NF4; transformers loads it 4-bit", "bnb", BNB_DOORS,
    {None: Bounds(0.25, 0.85, (("bnb-8bit", None), ("gguf-q8_0", None), ("adapter", None)))},
    disk=DiskRule(0.53, scratch=True), offers_dtype=True, bits=4, served_by=SERVERS, serve_order=5,
    vllm_quantization="bitsandbytes", vision_writes=BNB_VISION,
    method_hints={"qlora": "a QLoRA adapter's changes are finer than the NF4 grid its base was trained on, so "
                           "quantizing the merged model to NF4 again rounds most of them away; serve the adapter on "
                           "the 4-bit base (--format adapter) or export --format bnb-8bit, gguf-q8_0 or gguf-q4_0"}))


GGUF_VISION = tuple(f.label for f in VISION_FAMILIES.values() if f.gguf_projector)
"""The VLM families whose GGUF export writes the mmproj file beside the language model (VisionFamily.gguf_projector)."""


def _gguf(name: str, description: str, bounds: Mapping[str | None, Bounds], *, ggml_type: str, ggml_bytes: float,
          order: int) -> None:
    """A GGUF format: the merged tensors handed over in fp32 and rounded once, to its own types."""
    register_format(ExportFormat(name, description, "gguf", GGUF_DOORS, bounds, disk=None, merge_precision="fp32",
                                 vision_families=GGUF_VISION,
                                 vision_limit="built yet (the mmproj half: llama.cpp reads the tower and projector "
                                              "from a second GGUF file, written for {families} only)",
                                 vision_writes="model.gguf holds the language model; mmproj.gguf beside it the vision "
                                               "tower and projector in F16, for llama.cpp's mtmd (the Modelfile "
                                               "names both)",
                                 read_back_in="16-bit weights with fp32 activations and products", ggml_type=ggml_type, ggml_bytes=ggml_bytes,
                                 served_by=("llama-cpp",), serve_order=order))


# A block of 32 weights: one fp16 scale plus 8-, 5- or 4-bit values.
_gguf("gguf-f16", "GGUF, 16-bit weights, for llama.cpp and Ollama",
      {"bf16": Bounds(0.03, 0.98, (("merged", "fp16"), ("adapter", None)),  # F16 read exactly, against bf16
                      "the trained model was measured in bf16, whose rounding can hide small adapter changes"),
       "fp16": Bounds(0.01, 0.99, (("merged", "bf16"), ("adapter", None)), FP16_RANGE)},
      ggml_type="F16", ggml_bytes=2.0, order=6)
_gguf("gguf-q8_0", "GGUF, 8-bit Q8_0 weights (about 1.06 bytes/parameter), for llama.cpp and Ollama",
      {None: Bounds(0.05, 0.95, (("gguf-f16", None), ("merged", None)))}, ggml_type="Q8_0", ggml_bytes=34 / 32, order=7)
_gguf("gguf-q5_0", "GGUF, 5-bit Q5_0 weights (about 0.69 bytes/parameter), for llama.cpp and Ollama",
      {None: Bounds(0.15, 0.90, (("gguf-q8_0", None), ("gguf-f16", None)))}, ggml_type="Q5_0", ggml_bytes=22 / 32,
      order=8)
_gguf("gguf-q4_0", "GGUF, 4-bit Q4_0 weights (about 0.56 bytes/parameter), for llama.cpp and Ollama",
      {None: Bounds(0.25, 0.85, (("gguf-q5_0", None), ("gguf-q8_0", None)))}, ggml_type="Q4_0", ggml_bytes=18 / 32,
      order=9)


CALIBRATED_VISION = tuple(f.label for f in VISION_FAMILIES.values() if f.calibrated_layers)
"""The VLM families whose calibrated exports are proven (`VisionFamily.calibrated_layers`)."""


def _calibrated(name: str, description: str, bounds: Bounds, *, bits: int, algorithm: str, order: int,
                linear_bytes: float, activation_bits: int | None = None, symmetric: bool = True) -> None:
    """A calibrated format: fitted on the run's data over a 16-bit scratch copy, written by compressed-tensors."""
    register_format(ExportFormat(name, description, "calibrated", CALIBRATED_DOORS, {None: bounds},
                                 vision_families=CALIBRATED_VISION,
                                 vision_limit="proven (its language model's layers, calibrated on image rows, are "
                                              "proven for {families})",
                                 vision_writes="the language model's layers calibrated on the run's image rows; the "
                                               "vision tower, projector and head 16-bit (the ignore list vLLM reads)",
                                 disk=DiskRule(linear_bytes, scratch=True), bits=bits, activation_bits=activation_bits,
                                 algorithm=algorithm, symmetric=symmetric, served_by=SERVERS, serve_order=order))


# 4-bit groups like Q4_0 (and bnb-4bit's bytes on disk), with the rounding fitted to the run's data
_calibrated("gptq-int4", "merged model, 4-bit GPTQ weights calibrated on the run's data (compressed-tensors; vLLM, "
            "transformers)", Bounds(0.25, 0.85, (("awq-int4", None), ("w8a8", None))),
            bits=4, algorithm="gptq", order=2, linear_bytes=0.53)
_calibrated("awq-int4", "merged model, 4-bit AWQ-scaled asymmetric weights (a zero point per group) calibrated on the "
            "run's data (compressed-tensors W4A16_ASYM; vLLM from mid-2025, transformers)",
            Bounds(0.25, 0.85, (("gptq-int4", None), ("w8a8", None))),
            bits=4, algorithm="awq", order=3, linear_bytes=0.54, symmetric=False)
# 8-bit weights as Q8_0, plus every linear layer's input rounded to 8 bits per token
_calibrated("w8a8", "merged model, SmoothQuant then 8-bit weights and activations (compressed-tensors; vLLM, "
            "transformers)", Bounds(0.10, 0.90, (("gguf-q8_0", None), ("merged", None))),
            bits=8, algorithm="smoothquant", order=1, linear_bytes=1.0, activation_bits=8)


# --- views of the registry ---------------------------------------------------------------------

FORMATS: dict[str, str] = {f.name: f.description for f in EXPORT_FORMATS.values()}
CALIBRATED = tuple(f.name for f in EXPORT_FORMATS.values() if f.calibrated)
"""Formats calibrated on the run's training data (backend/export/calibrated/)."""
GGUF_TYPES: dict[str, str] = {f.name: f.ggml_type for f in EXPORT_FORMATS.values() if f.ggml_type}
"""GGUF format -> the GGML type of its 2-D weights."""


def vision_formats(family: str | None = None) -> tuple[str, ...]:
    """The formats a vision-language run can export (of the family labelled `family`; None: of some family)."""
    return tuple(f.name for f in EXPORT_FORMATS.values() if f.vision_gap is None
                 and (family is None or f.vision_families is None or family in f.vision_families))


def vision_refusal(fmt: str, family: str) -> tuple[str, str] | None:
    """(the one line, the fix) when a `family` vision-language run cannot be exported as `fmt`, else None."""
    spec, works = export_format(fmt), vision_formats(family)
    fix = f"export --format {', '.join(works[:-1])} or {works[-1]}"
    if spec.vision_gap is not None:
        return f"{fmt} of a {family} run is not built yet ({spec.vision_gap})", fix
    if spec.vision_families is not None and family not in spec.vision_families:
        return f"{fmt} of a {family} run is not {spec.vision_limit.format(families=', '.join(spec.vision_families))}", fix
    return None


def format_names() -> str:
    """Every format for a help line, a family whose names share a prefix as one pattern ("bnb-*"), so a
    format added to the registry shows up in every help text that lists them."""
    prefixes = [name.split("-", 1)[0] if "-" in name else name for name in EXPORT_FORMATS]
    shown: list[str] = []
    for name, prefix in zip(EXPORT_FORMATS, prefixes):
        word = f"{prefix}-*" if "-" in name and prefixes.count(prefix) > 1 else name
        if word not in shown:
            shown.append(word)
    return ", ".join(shown)


def _key(name: str, dtype: str | None) -> str:
    return name if dtype is None else f"{name}:{dtype}"


TOLERANCES: dict[str, tuple[float, float]] = {
    _key(f.name, dtype): (b.max_increase, b.min_top1) for f in EXPORT_FORMATS.values() for dtype, b in f.bounds.items()}
"""(largest relative perplexity increase, smallest top-1 agreement at decided positions) per format, or
per format:dtype, against the trained model measured in the export's 16-bit dtype (a GGUF is read back with
16-bit weights and fp32 activations: backend/export/gguf_check.py's read_dtype)."""
ALTERNATIVES: dict[str, list[tuple[str, str | None]]] = {
    _key(f.name, dtype): list(b.alternatives) for f in EXPORT_FORMATS.values() for dtype, b in f.bounds.items()}
"""What to try after a failed check: never the (format, dtype) that failed."""


def tolerance(fmt: str, dtype: str) -> tuple[float, float]:
    bounds = export_format(fmt).bounds_for(dtype)
    return bounds.max_increase, bounds.min_top1


def failure_hint(fmt: str, dtype: str, method: str) -> str:
    """One sentence for a failed check, naming other formats only."""
    entry = export_format(fmt)
    if method in entry.method_hints:
        return entry.method_hints[method]
    bounds = entry.bounds_for(dtype)
    flags = " or ".join(f"--format {f}" + (f" --dtype {d}" if d else "") for f, d in bounds.alternatives)
    return f"try {flags} ({bounds.why})"


def is_gguf(fmt: str) -> bool:
    return fmt in GGUF_TYPES


GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
    "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gemma2": "gemma2", "gemma3_text": "gemma3", "gemma3": "gemma3",
    "phi3": "phi3", "gpt2": "gpt2", "gpt_neox": "gptneox",
    "qwen2_5_vl": "qwen2vl", "qwen3_vl": "qwen3vl", "idefics3": "llama", "smolvlm": "llama",
}
"""Hugging Face model_type -> llama.cpp architecture written (backend/export/gguf_families.py has the
details); anything else is refused. SmolLM, TinyLlama and Llama 2/3 are model_type llama."""

DTYPES = ("bf16", "fp16")

DECIDED_MARGIN = 1.0
"""A position counts for the top-1 check when the trained model's first choice leads its second by at
least this many logits (it is e times likelier): a smaller lead can flip on rounding alone."""

GROUP_SIZES = (128, 64, 32)
"""The 4-bit group sizes vLLM's kernels take, largest first."""


def group_size_for(widths: Iterable[int]) -> int | None:
    """The largest of GROUP_SIZES dividing every input width of the layers quantized in 4-bit groups (None:
    none does). One rule for the export that writes the groups and the serving estimate that predicts them."""
    widths = list(widths)
    return next((size for size in GROUP_SIZES if all(width % size == 0 for width in widths)), None)


# --- the export job's options --------------------------------------------------------------------

EXPORT_OPTIONS = ("format", "out", "overwrite", "dtype", "calibration_samples")
"""The export job's options (calibration_samples: the calibrated formats only)."""
CALIBRATION_SAMPLES_DEFAULT = 128
CALIBRATION_SAMPLES_MAX = 1024
"""Rows of training data a calibrated export fits its scales to: more only lengthen the export, since
the statistics the algorithms use settle well before this."""


def calibration_samples(value: object) -> int:
    """The export option `calibration_samples` (rows of training data to calibrate on), checked."""
    if value is None:
        return CALIBRATION_SAMPLES_DEFAULT
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= CALIBRATION_SAMPLES_MAX:
        raise bad_input(f"export option calibration_samples={value!r} must be a whole number from 1 to "
                        f"{CALIBRATION_SAMPLES_MAX}", f"pass calibration_samples between 1 and "
                        f"{CALIBRATION_SAMPLES_MAX} (default {CALIBRATION_SAMPLES_DEFAULT})")
    return value


EXPORT_REPORT = "export_report.json"
MMPROJ_FILE = "mmproj.gguf"
"""A vision-language run's GGUF export: the tower and projector beside model.gguf (llama.cpp's mtmd reads it)."""
"""Every export folder holds it (backend/core/runs/export_report.py); it is how an earlier export is recognised."""


def overwrite_refusal(out: Path) -> str:
    """Why `out` must not be replaced by an export ("" when it may): only an earlier export, or an empty
    folder, is ever replaced, so --overwrite can never delete a person's own files."""
    if not out.exists():
        return ""
    if not out.is_dir():
        return f"{out} exists and is a file; pick another folder"
    try:
        empty = not any(out.iterdir())
    except OSError as exc:
        return f"{out} cannot be read ({exc.strerror}); pick another folder"
    if empty or (out / EXPORT_REPORT).is_file():
        return ""
    return (f"{out} is not an earlier export (it has no {EXPORT_REPORT}) and overwriting would delete what it "
            "holds; pick a new or empty folder")
