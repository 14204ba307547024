"""The trained model of a run, as the export sees it: checked, loaded in fp32, merged.

`TrainedRun.check` refuses a run folder that cannot be exported (no adapter, a half-written one)
before torch loads anything. `load_reference` builds the trained model the way it computed while
training: the base as the run stored it (for qlora the very NF4 weights the adapter trained against,
dequantized; for lora8 the LLM.int8 weights) plus the adapter, all in fp32. Every export is checked
against that model, and `merge` folds the adapter into it: a quantized base is always dequantized
first, never merged into 4-bit or 8-bit weights.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.config import RunConfig
from backend.errors import JobError, bad_input
from backend.runs import RunFolder

log = logging.getLogger(__name__)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class TrainedRun:
    folder: RunFolder
    config: RunConfig
    base_path: Path
    weights_dir: Path  # adapter/ for adapter methods, model/ for method full
    precision: str  # the compute precision the run trained in (the base was loaded in it)
    device: str  # where the run quantized its base (cuda or cpu)

    @property
    def method(self) -> str:
        return self.config.technique.method

    @property
    def full(self) -> bool:
        return self.method == "full"

    @property
    def quantization(self) -> str | None:
        return {"qlora": "nf4", "lora8": "int8"}.get(self.method)

    @classmethod
    def check(cls, run_dir: Path, config: RunConfig, fmt: str) -> "TrainedRun":
        """Refuse, in one sentence each, what cannot be exported; nothing is loaded yet."""
        folder = RunFolder(run_dir)
        full = config.technique.method == "full"
        weights = folder.path / "model" if full else folder.adapter_dir
        resume = f"finetune-studio train --resume {folder.path}"
        if not weights.is_dir():
            what = "model/ (the fully tuned weights)" if full else "adapter/"
            raise bad_input(
                f"{folder.path} has no {what}: the run never finished or its folder is damaged, so there is nothing to export",
                f"resume it with `{resume}` (it continues from the newest complete checkpoint), then export",
            )
        if full:
            if fmt == "adapter":
                raise bad_input(f"{folder.path} is a full fine-tune: it has no adapter to export",
                                "export merged, bnb-* or gguf-* instead")
            if not any(weights.glob("*.safetensors")) or not (weights / "config.json").is_file():
                raise bad_input(f"{weights} is incomplete (no config.json or *.safetensors): its save was cut short",
                                f"resume the run with `{resume}` to write it again")
        else:
            missing = [name for name in ADAPTER_FILES if not (weights / name).is_file()]
            if missing:
                raise bad_input(
                    f"{weights} is incomplete ({', '.join(missing)} missing): the adapter's save was cut short",
                    f"resume the run with `{resume}` to write it again",
                )
            try:
                json.loads((weights / "adapter_config.json").read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise bad_input(f"{weights / 'adapter_config.json'} is not valid JSON: the adapter is damaged",
                                f"resume the run with `{resume}` to write it again") from None
        precision, device = trained_plan(folder, config)
        return cls(folder, config, config.resolved_model_path(), weights, precision, device)


def trained_plan(folder: RunFolder, config: RunConfig) -> tuple[str, str]:
    """(precision, device) the run trained with: its plan event, else what the config implies."""
    precision = device = None
    for event in folder.iter_events():
        if event.get("type") == "PhaseChanged" and event.get("phase") == "plan":
            detail = event.get("detail", "")
            if match := re.search(r"precision (bf16|fp16|fp32)", detail):
                precision = match.group(1)
            if match := re.search(r"device (cuda|cpu)", detail):
                device = match.group(1)
    if precision is None:
        asked = config.technique.precision
        precision = asked if asked != "auto" else ("bf16" if torch.cuda.is_available() else "fp32")
    return precision, device or ("cuda" if torch.cuda.is_available() else "cpu")


def load_tokenizer(run: TrainedRun) -> Any:
    """The tokenizer saved beside the adapter (it is the one the run trained with)."""
    from transformers import AutoTokenizer

    source = run.weights_dir if (run.weights_dir / "tokenizer_config.json").is_file() else run.base_path
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=run.config.model.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _dequantized_linears(run: TrainedRun) -> dict[str, torch.Tensor]:
    """fp32 copies of the base's quantized Linear weights, quantized exactly as the run did it."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    device = run.device if run.device == "cpu" or torch.cuda.is_available() else "cpu"
    load_dtype = DTYPES[run.precision]
    if run.quantization == "nf4":
        # Same settings as backend.training.loading.load_model; the compute dtype does not change the codes.
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=load_dtype)
    else:
        quant = BitsAndBytesConfig(load_in_8bit=True)
    model = AutoModelForCausalLM.from_pretrained(
        run.base_path, dtype=load_dtype, quantization_config=quant, device_map={"": device},
        trust_remote_code=run.config.model.trust_remote_code, use_safetensors=not run.config.model.allow_pickle,
    )
    weights: dict[str, torch.Tensor] = {}
    # No forward pass has run, so bitsandbytes' CPU weight repacking has not touched these tensors.
    for name, module in model.named_modules():
        if isinstance(module, bnb.nn.Linear4bit):
            state = module.weight.quant_state
            if getattr(state, "packing_format_for_cpu", False):
                raise JobError("crashed", f"{name}: the 4-bit weights were repacked before export could read them")
            weights[name + ".weight"] = F.dequantize_4bit(module.weight.data, state).float().cpu()
        elif isinstance(module, bnb.nn.Linear8bitLt):
            scb = module.weight.SCB if getattr(module.weight, "SCB", None) is not None else module.state.SCB
            weights[name + ".weight"] = (module.weight.data.float() * scb.float()[:, None] / 127.0).cpu()
    del model
    if not weights:
        raise JobError("crashed", f"loading {run.base_path} with bitsandbytes gave no quantized layers to dequantize")
    log.info("dequantized %d %s linear layers (quantized on %s from %s weights)", len(weights),
             run.quantization, device, run.precision)
    return weights


def load_base(run: TrainedRun) -> Any:
    """The base in fp32 holding exactly the values the run computed with (dequantized for qlora/lora8)."""
    from transformers import AutoModelForCausalLM

    source = run.weights_dir if run.full else run.base_path
    # Unquantized weights were loaded in the run's precision (bf16 rounds them): do the same, then widen.
    load_dtype = torch.float32 if run.full else DTYPES[run.precision]
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=load_dtype, trust_remote_code=run.config.model.trust_remote_code,
        use_safetensors=not run.config.model.allow_pickle,
    ).float()
    if run.quantization:
        weights = _dequantized_linears(run)
        missing, unexpected = model.load_state_dict(weights, strict=False)
        if unexpected:
            raise JobError("crashed", f"dequantized weights do not fit the model: {unexpected[:3]}")
    model.eval()
    return model


def load_reference(run: TrainedRun) -> Any:
    """The trained model in fp32: base (as trained) + the run's adapter, unmerged."""
    base = load_base(run)
    if run.full:
        return base
    from peft import PeftModel

    model = PeftModel.from_pretrained(base, run.weights_dir, is_trainable=False)
    model.eval()
    return model


def merge(reference: Any) -> Any:
    """Fold the adapter into the fp32 weights (in place) and return the plain transformers model."""
    if hasattr(reference, "merge_and_unload"):
        merged = reference.merge_and_unload(safe_merge=True)
    else:
        merged = reference
    merged.eval()
    return merged


def parameter_count(model: Any) -> int:
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def linear_parameter_count(model: Any) -> int:
    """Parameters in Linear layers other than lm_head: what bitsandbytes quantizes."""
    total = 0
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.endswith("lm_head"):
            total += module.weight.numel()
    return total
