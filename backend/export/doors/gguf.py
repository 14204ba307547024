"""The GGUF formats' door: one GGUF file and an Ollama Modelfile, read back by transformers' own GGUF
loader (gguf_check.py), which shares no code with the writer. A vision-language run writes a second
file, the mmproj (gguf_mmproj.py), and both are read back into the image-text model
(gguf_mmproj_check.py). The gguf package is imported only once the refusal has found it, so a missing
one is refused in one sentence."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from backend.core.errors import JobError
from backend.core.registries.export_formats import MMPROJ_FILE as MMPROJ
from backend.core.vision_folder import VisionFolder
from backend.export import gguf_check
from backend.export.doors.work import ExportWork

__all__ = ["Writer", "checks", "not_verified", "read_back", "refuse"]
FILE = "model.gguf"
HELD = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _model_config(run: Any) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(run.weights_dir if run.full else run.base_path,
                                      trust_remote_code=run.config.model.trust_remote_code)


def _folder(run: Any) -> Path:
    return run.weights_dir if run.full else run.base_path


def _vision(run: Any) -> Any:
    """The run's vision family, or None for a text model."""
    return VisionFolder.read(_folder(run)).family


def refuse(name: str, run: Any) -> None:
    """Refuse a missing gguf package, and a model family llama.cpp's architectures do not cover."""
    if importlib.util.find_spec("gguf") is None:
        raise JobError("missing_dependency", f"{name}: GGUF export needs the gguf package, which is not installed",
                       "pip install gguf (or reinstall with the README's command)")
    from backend.export.gguf_writer import check_architecture

    check_architecture(_model_config(run))
    if _vision(run) is not None:
        from backend.export.checkpoint_files import read_config
        from backend.export.gguf_mmproj import layout_of

        layout_of(read_config(_folder(run)))


class Writer:
    """Plans every tensor's GGML type at once (its bytes size the disk check), then writes the file (and, for a
    vision-language run, the mmproj file beside it)."""

    def __init__(self, work: ExportWork):
        from backend.export.gguf_writer import GgufExport

        self.work = work
        self.export = GgufExport(work.source, work.tokenizer, work.fmt.name, work.run.config.name)
        self.mmproj = None
        if _vision(work.run) is not None:
            from backend.export.checkpoint_files import read_config
            from backend.export.gguf_mmproj import MmprojExport, processor_settings

            run = work.run
            self.mmproj = MmprojExport(work.source, read_config(_folder(run)),
                                       processor_settings((run.weights_dir, run.base_path)), run.config.name)
        self.planned_bytes = self.export.tensor_bytes + (self.mmproj.tensor_bytes if self.mmproj else 0)

    def write(self, folder: Path) -> list[str]:
        from backend.export.modelfile import modelfile

        self.export.write(folder / FILE, progress=self.work.progress, should_stop=self.work.should_stop)
        notes = [f"tensor types: {self.export.type_counts()}"]
        if self.mmproj is not None:
            self.mmproj.write(folder / MMPROJ, should_stop=self.work.should_stop)
            notes.append(f"{MMPROJ}: the vision tower and projector for llama.cpp's {self.mmproj.layout.projector_type} "
                         f"projector, {len(self.mmproj.plan)} tensors in F16 (vectors and embeddings F32)")
        text, note = modelfile(self.work.tokenizer, projector=MMPROJ if self.mmproj else None)
        (folder / "Modelfile").write_text(text, encoding="utf-8")
        return notes + ([note] if note else [])


def read_back(work: ExportWork, folder: Path) -> tuple[Any, str, str, str]:
    """The file as transformers' GGUF loader reads it, its weights in 16 bits, its activations in fp32
    (gguf_check.read_dtype, widen); (None, ..., why) where that reader cannot rebuild this model. A vision-language
    run's pair is rebuilt into the image-text model (gguf_mmproj_check.read_back_pair)."""
    if (folder / MMPROJ).is_file():
        from backend.export.checkpoint_files import read_config
        from backend.export.gguf_mmproj import layout_of
        from backend.export.gguf_mmproj_check import read_back_pair

        dtype = gguf_check.read_dtype(gguf_check.weight_types(folder / FILE) | gguf_check.weight_types(folder / MMPROJ))
        config = read_config(_folder(work.run))
        layout = layout_of(config)
        model, loaded_as, reason = read_back_pair(folder / FILE, folder / MMPROJ, layout, _folder(work.run),
                                                  _model_config(work.run), work.device, dtype,
                                                  config.get("vision_config") or {})
    else:
        model, loaded_as, reason = gguf_check.read_back(folder / FILE, _model_config(work.run), work.device)
    if model is None:
        return None, f"not verified by transformers: {reason}", "none", reason
    held = HELD[next(model.parameters()).dtype]
    return model, loaded_as, held if held == "fp32" else f"{held} weights, fp32 activations", ""


def _mmproj_checks(work: ExportWork, folder: Path) -> list[dict]:
    if not (folder / MMPROJ).is_file():
        return []
    from backend.export.checkpoint_files import read_config
    from backend.export.gguf_mmproj import layout_of
    from backend.export.gguf_mmproj_check import mmproj_check

    config = read_config(_folder(work.run))
    return [mmproj_check(folder / MMPROJ, layout_of(config), work.source, config.get("vision_config") or {})]


def not_verified(work: ExportWork, folder: Path, max_increase: float, reason: str) -> list[dict]:
    """No independent reader for this file here: say so, and still check the tokenizer (and mmproj) it holds."""
    path = folder / FILE
    return [gguf_check.not_verified("perplexity", max_increase, reason, path), _tokenizer_check(work, folder),
            *_mmproj_checks(work, folder)]


def checks(work: ExportWork, folder: Path, measured: list[dict]) -> list[dict]:
    """The measured checks, verified by an independent reader, and the tokenizer rebuilt from the file alone."""
    for check in measured:
        check["verified"] = True
    return [*measured, _tokenizer_check(work, folder), *_mmproj_checks(work, folder)]


def _tokenizer_check(work: ExportWork, folder: Path) -> dict:
    if not (folder / MMPROJ).is_file():
        return gguf_check.tokenizer_check(folder / FILE, work.tokenizer)
    from backend.export.gguf_mmproj_check import tokenizer_check
    from backend.export.gguf_writer import check_architecture

    return tokenizer_check(folder / FILE, work.tokenizer, check_architecture(_model_config(work.run)))
