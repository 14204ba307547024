"""The GGUF formats' door: one GGUF file and an Ollama Modelfile, read back by transformers' own GGUF
loader (gguf_check.py), which shares no code with the writer. The gguf package is imported only once the
refusal has found it, so a missing one is refused in one sentence."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from backend.core.errors import JobError
from backend.export import gguf_check
from backend.export.doors.work import ExportWork

__all__ = ["Writer", "checks", "not_verified", "read_back", "refuse"]
FILE = "model.gguf"
HELD = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _model_config(run: Any) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(run.weights_dir if run.full else run.base_path,
                                      trust_remote_code=run.config.model.trust_remote_code)


def refuse(name: str, run: Any) -> None:
    """Refuse a missing gguf package, and a model family llama.cpp's architectures do not cover."""
    if importlib.util.find_spec("gguf") is None:
        raise JobError("missing_dependency", f"{name}: GGUF export needs the gguf package, which is not installed",
                       "pip install gguf (or reinstall with the README's command)")
    from backend.export.gguf_writer import check_architecture

    check_architecture(_model_config(run))


class Writer:
    """Plans every tensor's GGML type at once (its bytes size the disk check), then writes the file."""

    def __init__(self, work: ExportWork):
        from backend.export.gguf_writer import GgufExport

        self.work = work
        self.export = GgufExport(work.source, work.tokenizer, work.fmt.name, work.run.config.name)
        self.planned_bytes = self.export.tensor_bytes

    def write(self, folder: Path) -> list[str]:
        from backend.export.modelfile import modelfile

        self.export.write(folder / FILE, progress=self.work.progress, should_stop=self.work.should_stop)
        text, note = modelfile(self.work.tokenizer)
        (folder / "Modelfile").write_text(text, encoding="utf-8")
        return [f"tensor types: {self.export.type_counts()}"] + ([note] if note else [])


def read_back(work: ExportWork, folder: Path) -> tuple[Any, str, str, str]:
    """The file as transformers' GGUF loader reads it, its weights in 16 bits, its activations in fp32
    (gguf_check.read_dtype, widen); (None, ..., why) where that reader cannot rebuild this model."""
    model, loaded_as, reason = gguf_check.read_back(folder / FILE, _model_config(work.run), work.device)
    if model is None:
        return None, f"not verified by transformers: {reason}", "none", reason
    held = HELD[next(model.parameters()).dtype]
    return model, loaded_as, held if held == "fp32" else f"{held} weights, fp32 activations", ""


def not_verified(work: ExportWork, folder: Path, max_increase: float, reason: str) -> list[dict]:
    """No independent reader for this file here: say so, and still check the tokenizer it holds."""
    path = folder / FILE
    return [gguf_check.not_verified("perplexity", max_increase, reason, path),
            gguf_check.tokenizer_check(path, work.tokenizer)]


def checks(work: ExportWork, folder: Path, measured: list[dict]) -> list[dict]:
    """The measured checks, verified by an independent reader, and the tokenizer rebuilt from the file alone."""
    for check in measured:
        check["verified"] = True
    return [*measured, gguf_check.tokenizer_check(folder / FILE, work.tokenizer)]
