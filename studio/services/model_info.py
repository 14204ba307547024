"""ModelInfo: what a Hugging Face model folder is, read from its config.json without loading it.

Only files are read (config.json, the names of the weight files): no torch, no transformers, no
network. The parameter count comes from the memory estimator's architecture table, so the Model
page and the Techniques page agree on the number; a vision-language folder's parts are counted later,
off the GUI thread (backend/api/vision.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backend.core.paths import resolve_resource
from backend.core.vision_folder import VisionFolder


@dataclass(frozen=True)
class ModelInfo:
    """The facts the Model page shows; `problem` says why a folder cannot be used ("" when it can)."""

    path: str
    folder: Path | None = None
    architecture: str = ""
    model_type: str = ""
    parameters: int | None = None
    layers: int | None = None
    hidden_size: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    vocab_size: int | None = None
    context_length: int | None = None
    dtype: str = ""
    needs_remote_code: bool = False
    auto_map: dict[str, Any] = field(default_factory=dict)
    weights: str = ""
    """"safetensors", "pickle (.bin)" or "" (none found)."""
    has_tokenizer: bool = False
    problem: str = ""
    warnings: tuple[str, ...] = ()
    vision: VisionFolder = field(default_factory=VisionFolder)
    """The vision side: a proven vision-language family, a refused one (its line is `problem`), or none."""

    @classmethod
    def read(cls, path: str) -> "ModelInfo":
        """Read `path` (a folder, or `bundled:NAME`); never raises: problems land in `problem`."""
        folder = resolve_resource(path) if path else Path()
        if not path:
            return cls(path, problem="Choose a model folder.")
        if not folder.is_dir():
            return cls(path, folder, problem=f"{folder}: no such folder")
        try:
            raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls(path, folder, problem=f"{folder}: no config.json; pick a Hugging Face model folder")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return cls(path, folder, problem=f"{folder / 'config.json'}: not readable JSON ({exc})")
        if not isinstance(raw, dict):
            return cls(path, folder, problem=f"{folder / 'config.json'}: expected a JSON object")
        return cls._from_config(path, folder, raw)

    @classmethod
    def _from_config(cls, path: str, folder: Path, raw: dict[str, Any]) -> "ModelInfo":
        text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
        architectures = raw.get("architectures") or []
        parameters, warnings = None, []
        try:
            from backend.api.estimates import count_params, read_dims

            arch, dims, warnings = read_dims(raw)
            parameters = count_params(arch, dims).total
        except (ValueError, KeyError, TypeError, ImportError) as exc:
            warnings = [f"parameter count unavailable: {exc}"]
        auto_map = raw.get("auto_map") if isinstance(raw.get("auto_map"), dict) else {}
        vision = VisionFolder.from_config(raw, folder)
        weights = ""
        if any(folder.glob("*.safetensors")):
            weights = "safetensors"
        elif any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
            weights = "pickle (.bin): needs model.allow_pickle"
        return cls(
            path=path,
            folder=folder,
            architecture=str(architectures[0]) if architectures else "",
            model_type=str(raw.get("model_type", "")),
            parameters=parameters,
            layers=_int(text.get("num_hidden_layers")),
            hidden_size=_int(text.get("hidden_size")),
            heads=_int(text.get("num_attention_heads")),
            kv_heads=_int(text.get("num_key_value_heads") or text.get("num_attention_heads")),
            vocab_size=_int(text.get("vocab_size")),
            context_length=_int(text.get("max_position_embeddings") or text.get("max_sequence_length")
                                or text.get("n_positions") or text.get("seq_length")),
            dtype=str(raw.get("dtype") or raw.get("torch_dtype") or ""),
            needs_remote_code=bool(auto_map),
            auto_map=dict(auto_map),
            weights=weights,
            has_tokenizer=(folder / "tokenizer.json").is_file(),
            problem=vision.refusal,
            warnings=tuple(warnings),
            vision=vision,
        )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
