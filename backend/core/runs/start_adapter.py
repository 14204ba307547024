"""model.adapter: start from an earlier run's LoRA/DoRA adapter and keep training it.

The usual path past supervised tuning: SFT first, then DPO, KTO or GRPO on the same adapter. The
adapter keeps its own rank, alpha and method, so technique's must match (a silent mismatch would
make the estimate and the run folder's config lie); the result is still one adapter on model.path,
so export, chat and evaluation treat the run like any other. This check is torch-free (the studio, the
CLI and the worker call it before loading anything); loading it is backend.training.model.start_adapter.
"""

from __future__ import annotations

import json
from pathlib import Path

from backend.core.config.run_config import RunConfig
from backend.core.errors import bad_input
from backend.core.paths import resolve_resource


def start_adapter_folder(config: RunConfig) -> Path | None:
    """The adapter folder model.adapter names (a run folder's adapter/ or the folder itself), checked
    against technique; None when no start adapter is set."""
    if not config.model.adapter:
        return None
    given = resolve_resource(config.model.adapter)
    folder = given / "adapter" if (given / "adapter" / "adapter_config.json").is_file() else given
    if not given.exists():
        raise bad_input(f"model.adapter: {given} does not exist", "give a finished run's folder or its adapter folder")
    meta_path = folder / "adapter_config.json"
    if not meta_path.is_file():
        raise bad_input(f"model.adapter: {given} holds no adapter (no adapter_config.json; a full-tuning run has "
                        "none, and a run that did not finish has only checkpoints)",
                        "pick a finished LoRA or DoRA run, or leave model.adapter empty")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise bad_input(f"model.adapter: {meta_path} is not readable JSON ({exc})") from None
    if meta.get("peft_type") != "LORA":
        raise bad_input(f"model.adapter: {folder} is a {meta.get('peft_type')} adapter; only LoRA and DoRA continue")
    technique = config.technique
    checks = [("lora_rank", meta.get("r"), technique.lora_rank), ("lora_alpha", meta.get("lora_alpha"), technique.lora_alpha)]
    for name, theirs, ours in checks:
        if theirs is not None and float(theirs) != float(ours):
            raise bad_input(f"technique.{name} is {ours:g} but the start adapter {folder} has {float(theirs):g}",
                            f"set technique.{name} to {float(theirs):g} (the adapter keeps its own)")
    method = "dora" if meta.get("use_dora") else "lora"
    kind = "dora" if technique.method == "dora" else "lora"  # qlora and lora8 train LoRA adapters on a quantized base
    if kind != method:
        fix = "dora" if method == "dora" else "lora (or qlora / lora8 for a quantized base)"
        raise bad_input(f"technique.method is {technique.method} but the start adapter {folder} is {method}",
                        f"set technique.method to {fix}")
    return folder
