"""Whether a run holds a whole trained model to export or prune: torch-free, so the CLI refuses an
unfinished run before a worker starts (and writes nothing into it), and the export and prune jobs
refuse it with the same sentence when the window starts them.
"""

from __future__ import annotations

import json

from backend.core.config.run_config import RunConfig
from backend.core.runs.run_continuation import how_to_finish
from backend.core.runs.run_folder import RunFolder

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
"""The files peft writes that an adapter cannot be read without."""


def weights_problem(folder: RunFolder, config: RunConfig, merged: bool, then: str) -> tuple[str, str] | None:
    """(refusal, hint) when the run has no complete adapter/ (model/ for method full) to read, or a full
    fine-tune is asked for an adapter (`merged` False); None when its trained model is whole. `then` is
    what the hint says to do once the run is finished ("export", "prune")."""
    full = config.technique.method == "full"
    weights = folder.path / "model" if full else folder.adapter_dir
    resume = f"finetune-studio train --resume {folder.path}"
    if not weights.is_dir():
        what = "model/ (the fully tuned weights)" if full else "adapter/"
        status = folder.status()
        state = "still training or stopped without a word" if status == "incomplete" else status
        return (f"{folder.path} has no {what}: the run never finished ({state}) or its folder is damaged, so there "
                f"is nothing to {then}", how_to_finish(folder, then))
    if full:
        if not merged:
            return (f"{folder.path} is a full fine-tune: it has no adapter to export",
                    "export one of the merged formats (merged, bnb-*, gguf-*, the calibrated ones) instead")
        if not any(weights.glob("*.safetensors")) or not (weights / "config.json").is_file():
            return (f"{weights} is incomplete (no config.json or *.safetensors): its save was cut short",
                    f"resume the run with `{resume}` to write it again")
        return None
    missing = [name for name in ADAPTER_FILES if not (weights / name).is_file()]
    if missing:
        return (f"{weights} is incomplete ({', '.join(missing)} missing): the adapter's save was cut short",
                f"resume the run with `{resume}` to write it again")
    try:
        json.loads((weights / "adapter_config.json").read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return (f"{weights / 'adapter_config.json'} is not valid JSON: the adapter is damaged",
                f"resume the run with `{resume}` to write it again")
    return None
