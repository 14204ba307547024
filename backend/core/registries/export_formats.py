"""The export formats, their loaders and the tolerances their checks use. Torch-free.

The CLI builds its `--format` choices from FORMATS and the studio can list them without importing
torch; backend/jobs/export.py and backend/export/verify.py read the tolerances from here so that the
report, the docs and the code state the same numbers (docs/export.md explains how they were chosen).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

FORMATS: dict[str, str] = {
    "adapter": "the PEFT adapter folder; load it with peft on top of the base model",
    "merged": "adapter merged into a 16-bit copy of the base (safetensors); load it with transformers",
    "bnb-8bit": "merged model quantized with bitsandbytes LLM.int8; transformers loads it 8-bit",
    "bnb-4bit": "merged model quantized with bitsandbytes NF4; transformers loads it 4-bit",
    "gguf-f16": "GGUF, 16-bit weights, for llama.cpp and Ollama",
    "gguf-q8_0": "GGUF, 8-bit Q8_0 weights (about 1.06 bytes/parameter), for llama.cpp and Ollama",
    "gguf-q5_0": "GGUF, 5-bit Q5_0 weights (about 0.69 bytes/parameter), for llama.cpp and Ollama",
    "gguf-q4_0": "GGUF, 4-bit Q4_0 weights (about 0.56 bytes/parameter), for llama.cpp and Ollama",
    "gptq-int4": "merged model, 4-bit GPTQ weights calibrated on the run's data (compressed-tensors; vLLM, transformers)",
    "awq-int4": "merged model, 4-bit AWQ-scaled weights calibrated on the run's data (compressed-tensors; vLLM, transformers)",
    "w8a8": "merged model, SmoothQuant then 8-bit weights and activations (compressed-tensors; vLLM, transformers)",
}

CALIBRATED = ("gptq-int4", "awq-int4", "w8a8")
"""Formats calibrated on the run's training data (backend/export/calibrated/)."""
CALIBRATION_SAMPLES_DEFAULT = 128
CALIBRATION_SAMPLES_MAX = 1024
"""Rows of training data a calibrated export fits its scales to: more only lengthen the export, since
the statistics the algorithms use settle well before this."""
GROUP_SIZES = (128, 64, 32)
"""The 4-bit group sizes vLLM's kernels take, largest first."""


def group_size_for(widths: Iterable[int]) -> int | None:
    """The largest of GROUP_SIZES dividing every input width of the layers quantized in 4-bit groups (None:
    none does). One rule for the export that writes the groups and the serving estimate that predicts them."""
    widths = list(widths)
    return next((size for size in GROUP_SIZES if all(width % size == 0 for width in widths)), None)

GGUF_TYPES: dict[str, str] = {"gguf-f16": "F16", "gguf-q8_0": "Q8_0", "gguf-q5_0": "Q5_0", "gguf-q4_0": "Q4_0"}
"""GGUF format -> the GGML type of its 2-D weights (1-D tensors stay F32, odd rows F16)."""

GGUF_ARCHITECTURES: dict[str, str] = {
    "llama": "llama", "mistral": "llama", "mixtral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
    "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe", "gemma2": "gemma2", "gemma3_text": "gemma3", "gemma3": "gemma3",
    "phi3": "phi3", "gpt2": "gpt2", "gpt_neox": "gptneox",
}
"""Hugging Face model_type -> llama.cpp architecture written (backend/export/gguf_families.py has the
details); anything else is refused. SmolLM, TinyLlama and Llama 2/3 are model_type llama."""

DTYPES = ("bf16", "fp16")

# --- tolerances (the reasoning and the measured figures: docs/export.md) --------------------------

DECIDED_MARGIN = 1.0
"""A position counts for the top-1 check when the trained model's first choice leads its second by at
least this many logits (it is e times likelier): a smaller lead can flip on rounding alone."""

TOLERANCES: dict[str, tuple[float, float]] = {
    # key: (largest relative perplexity increase, smallest top-1 agreement at decided positions)
    "adapter": (1e-3, 0.999),  # the same tensors reloaded and computed the same way: identical
    "merged:bf16": (0.03, 0.98),
    "merged:fp16": (0.01, 0.99),
    "gguf-f16:bf16": (0.03, 0.98),  # F16 weights read exactly, against the trained model measured in bf16
    "gguf-f16:fp16": (0.01, 0.99),
    "bnb-8bit": (0.05, 0.95),
    "gguf-q8_0": (0.05, 0.95),
    "gguf-q5_0": (0.15, 0.90),
    "gguf-q4_0": (0.25, 0.85),
    "bnb-4bit": (0.25, 0.85),
    "gptq-int4": (0.25, 0.85),  # 4-bit groups like Q4_0, with the rounding fitted to the run's data
    "awq-int4": (0.25, 0.85),
    "w8a8": (0.10, 0.90),  # 8-bit weights as Q8_0, plus every linear layer's input rounded to 8 bits per token
}
"""Each check's tolerance against the trained model measured in the export's 16-bit dtype (a GGUF is
read back in the precision it holds: backend/export/gguf_check.py's read_dtype)."""


def tolerance(fmt: str, dtype: str) -> tuple[float, float]:
    return TOLERANCES.get(f"{fmt}:{dtype}") or TOLERANCES[fmt]


ALTERNATIVES: dict[str, list[tuple[str, str | None]]] = {
    "adapter": [("merged", "fp16")],
    "merged:bf16": [("merged", "fp16"), ("adapter", None)],
    "merged:fp16": [("merged", "bf16"), ("adapter", None)],
    "gguf-f16:bf16": [("merged", "fp16"), ("adapter", None)],
    "gguf-f16:fp16": [("merged", "bf16"), ("adapter", None)],
    "bnb-8bit": [("merged", None), ("gguf-q8_0", None)],
    "gguf-q8_0": [("gguf-f16", None), ("merged", None)],
    "gguf-q5_0": [("gguf-q8_0", None), ("gguf-f16", None)],
    "gguf-q4_0": [("gguf-q5_0", None), ("gguf-q8_0", None)],
    "bnb-4bit": [("bnb-8bit", None), ("gguf-q8_0", None), ("adapter", None)],
    "gptq-int4": [("awq-int4", None), ("w8a8", None)],
    "awq-int4": [("gptq-int4", None), ("w8a8", None)],
    "w8a8": [("gguf-q8_0", None), ("merged", None)],
}
"""What to try after a failed check: never the (format, dtype) that failed."""


def failure_hint(fmt: str, dtype: str, method: str) -> str:
    """One sentence for a failed check, naming other formats only."""
    if method == "qlora" and fmt == "bnb-4bit":
        return ("a QLoRA adapter's changes are finer than the NF4 grid its base was trained on, so quantizing the "
                "merged model to NF4 again rounds most of them away; serve the adapter on the 4-bit base "
                "(--format adapter) or export --format bnb-8bit, gguf-q8_0 or gguf-q4_0")
    options = ALTERNATIVES.get(f"{fmt}:{dtype}") or ALTERNATIVES[fmt]
    flags = " or ".join(f"--format {f}" + (f" --dtype {d}" if d else "") for f, d in options)
    why = {
        "merged:bf16": "bf16 keeps 8 significant bits, so an adapter change below half a bf16 step of its weight is "
                       "rounded away; fp16 keeps 11 (8x finer) and the adapter keeps everything",
        "merged:fp16": "fp16 holds values only up to 65504, which some models' activations exceed",
        "gguf-f16:bf16": "the trained model was measured in bf16, whose rounding can hide small adapter changes",
        "gguf-f16:fp16": "fp16 holds values only up to 65504, which some models' activations exceed",
    }.get(f"{fmt}:{dtype}", "see export_report.json for the figures")
    return f"try {flags} ({why})"


def is_gguf(fmt: str) -> bool:
    return fmt in GGUF_TYPES

EXPORT_REPORT = "export_report.json"
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
