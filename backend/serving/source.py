"""What a serving estimate is of: a model folder, an export, or a run folder, turned into the
config.json to read, the format the server loads, and the path (and flags) vLLM is given.

A run folder is served from its export of the asked format when one is there (wherever `export --out` wrote
it: the run records each export's folder, run_exports); a run without a merged
export is served as its base with the adapter beside it (vLLM's --enable-lora); a format not yet
exported is predicted from the base's config.json and said so. A calibrated export (gptq-int4, awq-int4,
w8a8) is recognised by its export_report.json, or in a plain model folder by config.json's
compressed-tensors quantization_config, and its weights are counted from its files (calibrated.py).
Torch-free.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.estimate.families import ESTIMATE_FAMILIES, load_model_config, text_part
from backend.core.registries.export_formats import EXPORT_FORMATS, EXPORT_REPORT, export_format
from backend.core.registries.serving_options import SERVED_FORMATS
from backend.serving import calibrated
from backend.serving.calibrated import WeightFiles
from backend.serving.safetensors_header import safetensors_sum

ORDER = SERVED_FORMATS
"""Which of a run's exports is served or sized when --format is not given: the first one there (why this
order: serving_options.SERVED_FORMATS)."""


@dataclass
class ServeSource:
    """The model to size and the `vllm serve` target."""

    serve_path: str
    config: dict[str, Any]
    fmt: str
    lora_rank: int = 0
    """--max-lora-rank when the adapter is served beside its base (0: no LoRA)."""
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    weight_files: WeightFiles | None = None
    """A calibrated export's weights as its safetensors files hold them (None: counted from config.json)."""


def resolve(text: str, fmt: str | None) -> ServeSource:
    """The ServeSource of a folder the user named, or a one-line ValueError saying what it lacks."""
    if fmt is not None and fmt not in SERVED_FORMATS:
        raise ValueError(f"--format {fmt}: a server loads {', '.join(SERVED_FORMATS)}")
    path = Path(text).expanduser().absolute()
    if path.is_file() and path.suffix == ".gguf" and (path.parent / EXPORT_REPORT).is_file():
        path = path.parent
    if not path.exists():
        raise ValueError(f"{path}: no such folder; give a run folder, an export folder or a model folder with config.json")
    if not path.is_dir():
        raise ValueError(f"{path}: is a file; give a run folder, an export folder or a model folder with config.json")
    if (path / "config.yaml").is_file():
        return _run(path, fmt)
    if (path / EXPORT_REPORT).is_file():
        return _export(path, fmt)
    if (path / "config.json").is_file():
        return _model_folder(path, load_model_config(path), fmt)
    raise ValueError(f"{path}: no config.json, {EXPORT_REPORT} or config.yaml in it; give a model folder, an export "
                     "or a run folder (`finetune-studio runs list` shows the runs)")


def _model_folder(path: Path, config: dict[str, Any], fmt: str | None) -> ServeSource:
    """A folder with config.json: a compressed-tensors one as the calibrated format it holds, else 16-bit."""
    scheme = calibrated.scheme_of(config)
    if scheme:
        chosen = calibrated.folder_format(path, config, fmt)
        notes = []
        return ServeSource(str(path), config, chosen, notes=notes, weight_files=calibrated.weight_files(path, config))
    notes = [] if fmt is None or export_format(fmt).family == "hf" else [
        f"a model folder sized as if exported to {fmt}; the line serves the folder itself"]
    quant = config.get("quantization_config")
    if isinstance(quant, dict):
        notes.append(f"config.json's quantization_config ({quant.get('quant_method', '?')}) is not a scheme this "
                     f"project exports; the weights are sized as {fmt or 'merged'}, not from its files")
    return ServeSource(str(path), config, fmt or "merged", notes=notes)


def _export(path: Path, fmt: str | None) -> ServeSource:
    try:
        report = json.loads((path / EXPORT_REPORT).read_text(encoding="utf-8"))
        written = str(report["format"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"{path / EXPORT_REPORT}: unreadable or without a format; export the run again") from None
    if fmt is not None and fmt != written:
        raise ValueError(f"--format {fmt}: {path} is a {written} export; leave --format out or name its run folder")
    spec = EXPORT_FORMATS.get(written)
    if spec is None:
        raise ValueError(f"{path / EXPORT_REPORT}: format {written!r} is not one this project exports; export the run "
                         "again")
    if not spec.merged:
        raise ValueError(f"{path} is an adapter; give its run folder to serve it on its base")
    if spec.ggml_type:
        base = Path(str(report.get("base_model", "")))
        config = load_model_config(base if (base / "config.json").is_file() else path)
        # The GGUF export holds the tokenizer inside the file only; vLLM reads a Hugging Face one beside it.
        flags = ["--tokenizer", str(path if (path / "tokenizer.json").is_file() else base)]
        return ServeSource(str(path / "model.gguf"), config, written, flags=flags,
                           notes=["vLLM's GGUF loading is experimental; llama.cpp's server loads the same file"])
    config = load_model_config(path)
    if spec.calibrated:
        # No --quantization: vLLM reads config.json's quantization_config and takes its quant_method
        # (compressed-tensors) when the flag is absent (ModelConfig's quantization check; a flag that named
        # another method would be refused as a mismatch), as llm-compressor's docs serve such folders.
        calibrated.check_export(path, config, written)
        return ServeSource(str(path), config, written, weight_files=calibrated.weight_files(path, config))
    return ServeSource(str(path), config, written, flags=vllm_flags(written))


def _run(path: Path, fmt: str | None) -> ServeSource:
    found, gone = run_exports(path)
    chosen = fmt or next((f for f in ORDER if f in found), "merged")
    source = _export(found[chosen], None) if chosen in found else _unexported(path, chosen)
    source.notes[:0] = [f"the {chosen} export recorded at {where} is gone (moved or deleted); skipped"
                        for where in gone.get(chosen, [])]
    return source


def _unexported(path: Path, chosen: str) -> ServeSource:
    """A run without a `chosen` export: its base with the adapter beside it, or sized as if exported."""
    from backend.core.config.run_config import RunConfig

    config = RunConfig.load(path / "config.yaml")
    method = config.technique.method
    base = path / "model" if method == "full" else config.resolved_model_path()
    raw = load_model_config(base)
    adapter = path / "adapter"
    if export_format(chosen).family == "hf" and method != "full" and (adapter / "adapter_model.safetensors").is_file():
        params = safetensors_params(adapter / "adapter_model.safetensors")
        slot = lora_slot(config.technique.lora_rank)
        return ServeSource(str(base), raw, "merged", lora_rank=slot,
                           flags=["--enable-lora", "--lora-modules", f"{path.name}={adapter}", "--max-lora-rank",
                                  str(slot)],
                           notes=[f"no merged export: the base served with the adapter ({params:,} parameters) in a "
                                  f"LoRA slot of rank {slot}; `finetune-studio export {path} --format merged` serves "
                                  "it without LoRA's extra matmuls"])
    target = path / "exports" / chosen
    return ServeSource(str(target), raw, chosen,
                       flags=vllm_flags(chosen),
                       notes=[f"not exported yet: sized from {base}/config.json; `finetune-studio export {path} "
                              f"--format {chosen}` writes {target}"])


def run_exports(path: Path) -> tuple[dict[str, Path], dict[str, list[Path]]]:
    """A run's exports by format, wherever they were written: those the export job recorded in the run
    (run_folder.EXPORTS_RECORD; the newest of a format first), then RUN/exports/FORMAT. Also, by format,
    the recorded folders that no longer hold that export (moved or deleted), to be named and skipped."""
    from backend.core.runs.run_folder import RunFolder

    found: dict[str, Path] = {}
    gone: dict[str, list[Path]] = {}
    for entry in reversed(RunFolder(path).recorded_exports()):
        where, fmt = Path(entry["path"]), entry["format"]
        if _written_format(where) != fmt:
            gone.setdefault(fmt, []).append(where)
        else:
            found.setdefault(fmt, where)
    for fmt in SERVED_FORMATS:
        default = path / "exports" / fmt
        if fmt not in found and (default / EXPORT_REPORT).is_file():
            found[fmt] = default
    return found, gone


def _written_format(folder: Path) -> str | None:
    """The format export_report.json in `folder` names (None: no readable report there)."""
    try:
        return str(json.loads((folder / EXPORT_REPORT).read_text(encoding="utf-8"))["format"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def vllm_flags(fmt: str) -> list[str]:
    """vLLM's --quantization for a format that names one (bitsandbytes); others it reads from config.json."""
    quantization = export_format(fmt).vllm_quantization
    return ["--quantization", quantization] if quantization else []


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM's --max-lora-rank accepts (vllm/config/lora.py, MaxLoRARanks)."""


def lora_slot(rank: int) -> int:
    """The smallest --max-lora-rank that holds the run's rank, or a one-line refusal above 512."""
    slot = next((r for r in LORA_RANKS if r >= rank), None)
    if slot is None:
        raise ValueError(f"technique.lora_rank {rank}: vLLM serves LoRA ranks up to {LORA_RANKS[-1]}; export the run "
                         "merged (`finetune-studio export RUN_DIR --format merged`) and size that")
    return slot


def safetensors_params(path: Path) -> int:
    """Element count of a safetensors file from its header: no tensor read."""
    return safetensors_sum(path, lambda entry: math.prod(entry["shape"]), "train or export the run again")


def max_positions(raw: dict[str, Any]) -> int:
    """The longest context the model takes (vLLM refuses a longer --max-model-len): config.json's
    max_position_embeddings (GPT-2: n_positions), else its config class's default."""
    text, _ = text_part(raw)
    value = text.get("max_position_embeddings", text.get("n_positions"))
    if value is None:
        value = ESTIMATE_FAMILIES.get(str(text.get("model_type")), (None, {}))[1].get(
            "n_positions" if text.get("model_type") == "gpt2" else "max_position_embeddings")
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        source = raw.get("_source", "config.json")
        raise ValueError(f"{source}: max_position_embeddings is {value!r}, not a positive integer; copy config.json "
                         "unchanged from the model's Hugging Face repository")
    return value
