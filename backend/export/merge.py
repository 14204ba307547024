"""The trained model of a run, as the export sees it: checked, then read two ways, never as an fp32 model.

`TrainedRun.check` refuses a run folder that cannot be exported (no adapter or a half-written one:
core/runs/trained_weights.py, which the CLI asks first; a pre-quantized base) before torch loads
anything. `merged_source` serves the merged model one tensor at a time for the writers (merged_source.py: for qlora the very NF4 weights the adapter trained
against, dequantized; never merged into 4-bit or 8-bit weights). `load_trained` builds the trained
model the way it computed while training (base as trained + adapter, unmerged, through peft) in
16-bit, the reference every export is measured against.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from backend.core.config.run_config import RunConfig
from backend.core.errors import bad_input
from backend.core.registries.export_formats import export_format, vision_refusal
from backend.runtime.hub_kernels import LOAD_KWARGS
from backend.core.runs.trained_weights import weights_problem
from backend.core.vision_folder import VisionFolder
from backend.training.vision.parts import skip_quantization
from backend.export.adapter_weights import AdapterWeights
from backend.export.checkpoint_files import CheckpointFiles, read_config
from backend.export.merged_source import MergedSource
from backend.export.model_layout import ModelLayout
from backend.export.quantized_base import bnb_config
from backend.core.runs.run_folder import RunFolder

log = logging.getLogger(__name__)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class TrainedRun:
    folder: RunFolder
    config: RunConfig
    base_path: Path
    weights_dir: Path  # adapter/ for adapter methods, model/ for method full
    precision: str  # the compute precision the run trained in (the base was loaded in it)
    device: str  # where the run quantized its base (cuda or cpu)
    bf16_base: bool = False  # a CPU LoRA run that held its adapted base weights in bf16 (lora_matmul.py)

    @property
    def method(self) -> str:
        return self.config.technique.method

    @property
    def full(self) -> bool:
        return self.method == "full"

    @property
    def quantization(self) -> str | None:
        return {"qlora": "nf4", "lora8": "int8"}.get(self.method)

    @property
    def load_dtype(self) -> torch.dtype:
        """The dtype the run held its base in (method full: its fp32 master weights)."""
        return torch.float32 if self.full else DTYPES[self.precision]

    @classmethod
    def check(cls, run_dir: Path, config: RunConfig, fmt: str, then: str = "export") -> "TrainedRun":
        """Refuse, in one sentence each, what cannot be exported as the format `fmt` (`then`: the job that
        asks, for the hint); nothing is loaded yet."""
        merged = export_format(fmt).merged
        folder = RunFolder(run_dir)
        full = config.technique.method == "full"
        weights = folder.path / "model" if full else folder.adapter_dir
        problem = weights_problem(folder, config, merged, then)
        if problem:
            raise bad_input(*problem)
        base = config.resolved_model_path()
        family = VisionFolder.read(base).family
        if family is not None and (refusal := vision_refusal(fmt, family.label)):
            raise bad_input(*refusal)
        if merged and not full and (base / "config.json").is_file() \
                and read_config(base).get("quantization_config"):
            raise bad_input(f"{base}/config.json has a quantization_config: the base is stored pre-quantized, and a "
                            f"{fmt} export needs its 16-bit weights to merge into",
                            "export --format adapter, or train on the original 16-bit model")
        precision, device, bf16_base = trained_plan(folder, config)
        return cls(folder, config, base, weights, precision, device, bf16_base)


def trained_plan(folder: RunFolder, config: RunConfig) -> tuple[str, str, bool]:
    """(precision, device, bf16 base) the run trained with: its plan event, else what the config implies."""
    precision = device = None
    bf16_base = False
    for event in folder.iter_events():
        if event.get("type") == "PhaseChanged" and event.get("phase") == "plan":
            detail = event.get("detail", "")
            if match := re.search(r"precision (bf16|fp16|fp32)", detail):
                precision = match.group(1)
            if match := re.search(r"device (cuda|cpu)", detail):
                device = match.group(1)
            bf16_base = "base products bf16" in detail
    if precision is None:
        asked = config.technique.precision
        precision = asked if asked != "auto" else ("bf16" if torch.cuda.is_available() else "fp32")
    return precision, device or ("cuda" if torch.cuda.is_available() else "cpu"), bf16_base


def load_tokenizer(run: TrainedRun) -> Any:
    """The tokenizer saved beside the adapter (it is the one the run trained with)."""
    from transformers import AutoTokenizer

    source = run.weights_dir if (run.weights_dir / "tokenizer_config.json").is_file() else run.base_path
    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=run.config.model.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def quant_device(run: TrainedRun) -> str:
    """Where to quantize the base again: where the run did, unless this machine lacks it."""
    return run.device if run.device == "cpu" or torch.cuda.is_available() else "cpu"


def check_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def placement(device: str) -> dict[str, Any]:
    """from_pretrained's arguments for `device`: on the CPU none (a matching dtype then maps the file
    instead of copying it, several times faster), elsewhere a device_map."""
    return {} if device == "cpu" else {"device_map": {"": device}}


def default_dtype(run: TrainedRun) -> str:
    """The base's own 16-bit dtype (bf16 for an fp32 base): what a merged export is written in unless asked."""
    stored = CheckpointFiles(run.base_path, run.config.model.allow_pickle).floating_dtype()
    return "fp16" if stored == torch.float16 else "bf16"


def merged_source(run: TrainedRun, dtype: torch.dtype) -> MergedSource:
    """The trained model's tensors, merged one at a time into `dtype` (nothing is loaded yet)."""
    folder = run.weights_dir if run.full else run.base_path
    quantization = None if run.full else run.quantization
    files = CheckpointFiles(folder, run.config.model.allow_pickle)
    layout = ModelLayout.build(folder, files.shapes(), run.config.model.trust_remote_code, quantization,
                               DTYPES[run.precision])
    adapter = None if run.full else AdapterWeights(run.weights_dir, layout)
    return MergedSource(files, layout, adapter, dtype, load_dtype=run.load_dtype,
                        adapted_dtype=torch.bfloat16 if run.bf16_base else None,
                        quantization=quantization, quant_device=quant_device(run))


def load_trained(run: TrainedRun, dtype: torch.dtype, device: str, adapter_dir: Path | None = None) -> Any:
    """The trained model in 16-bit on `device`: the base as the run held it (its quantized layers quantized
    again the same way) + the adapter from `adapter_dir` (the run's by default), unmerged, through peft;
    method full: the run's model/ folder. A vision-language run's base loads with its image side
    (AutoModelForImageTextToText), so the adapter's names find their layers."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    family = VisionFolder.read(run.base_path).family
    auto = AutoModelForImageTextToText if family is not None else AutoModelForCausalLM
    skip = skip_quantization(family) if family is not None else None  # the tower stayed 16-bit in training
    common = {"trust_remote_code": run.config.model.trust_remote_code,
              "use_safetensors": not run.config.model.allow_pickle, **LOAD_KWARGS}
    if run.full:
        model = auto.from_pretrained(run.weights_dir, dtype=dtype, **placement(device), **common)
    elif run.quantization:
        # Quantized from the dtype the run loaded in (the codes depend on it), the rest then cast to 16-bit.
        compute = dtype if device.startswith("cuda") else torch.float32  # CPUs multiply fp32 fastest
        model = auto.from_pretrained(
            run.base_path, dtype=run.load_dtype, quantization_config=bnb_config(run.quantization, compute, skip),
            device_map={"": quant_device(run)}, **common)
        for param in model.parameters():
            if param.dtype.is_floating_point and param.dtype != dtype and type(param).__name__ == "Parameter":
                param.data = param.data.to(dtype)
    else:
        model = auto.from_pretrained(run.base_path, dtype=dtype, **placement(device), **common)
    if not run.full:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir or run.weights_dir, is_trainable=False)
    model.eval()
    return model
