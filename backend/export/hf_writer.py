"""Hugging Face folder exports: the adapter, the merged 16-bit model, bitsandbytes 8-bit and 4-bit.

Each `write_*` fills a temporary folder the export job renames once complete, the merged tensors
streamed from a MergedSource one at a time; each `load_*` opens what was written the way a user
would (plain transformers, in 16-bit) for the job's check. The
bitsandbytes formats are probed first: a tiny model is quantized, saved, reloaded and compared, so
a bitsandbytes build that cannot serialize (or, as seen with 0.50 on AVX512-BF16 CPUs, writes
repacked 4-bit weights after a forward pass) is refused in one sentence instead of shipping a
broken folder. The merged model is saved before any forward pass for the same reason.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

from backend.export.checkpoint_files import read_config
from backend.runtime.hub_kernels import LOAD_KWARGS
from backend.export.merge import DTYPES, TrainedRun, placement
from backend.core.vision_folder import VisionFolder
from backend.export.merged_source import MergedSource
from backend.export.model_layout import auto_model_class
from backend.export.safetensors_writer import write_safetensors
from backend.training.vision.parts import skip_quantization

log = logging.getLogger(__name__)
SKIP_FROM_ADAPTER = ("README.md", "training_args.bin")
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
                   "chat_template.jinja", "chat_template.json")
"""A vision-language model's processor beside its weights (AutoProcessor reads them; the run's copy holds
its vision.max_pixels cap)."""


def bnb_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def bnb_config(bits: int, dtype: str, skip: list[str] | None = None) -> Any:
    """skip: modules left 16-bit (a vision-language model's tower, projector and head; None: transformers' default)."""
    from transformers import BitsAndBytesConfig

    if bits == 4:
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=DTYPES[dtype], llm_int8_skip_modules=skip)
    return BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=skip)


@functools.lru_cache(maxsize=4)
def bnb_serialization_problem(bits: int, device: str) -> str | None:
    """None when this bitsandbytes saves and reloads `bits`-bit weights faithfully here, else why not."""
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed"
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    try:
        with tempfile.TemporaryDirectory(prefix="bnb-probe-") as scratch:
            root = Path(scratch)
            torch.manual_seed(0)
            config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
            LlamaForCausalLM(config).to(torch.float16).save_pretrained(root / "fp16")
            kwargs = {"quantization_config": bnb_config(bits, "fp16"), "device_map": {"": device}}
            quantized = AutoModelForCausalLM.from_pretrained(root / "fp16", dtype=torch.float32, **kwargs, **LOAD_KWARGS)
            quantized.save_pretrained(root / "q")
            reloaded = AutoModelForCausalLM.from_pretrained(root / "q", dtype=torch.float32, device_map={"": device},
                                                            **LOAD_KWARGS)
            ids = torch.arange(8, device=device)[None]
            with torch.no_grad():
                error = (quantized(ids).logits - reloaded(ids).logits).abs().max().item()
            if not error < 1e-3:
                return f"its saved {bits}-bit weights reload differently (max logit error {error:.3g})"
    except Exception as exc:  # the probe exists to catch whatever this build lacks
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None


# --- writers ------------------------------------------------------------------------------------


def write_adapter(run: TrainedRun, tmp: Path) -> None:
    for item in run.weights_dir.iterdir():
        if item.is_file() and item.name not in SKIP_FROM_ADAPTER:
            shutil.copy2(item, tmp / item.name)


def write_merged(source: MergedSource, run: TrainedRun, tokenizer: Any, tmp: Path, dtype: str,
                 progress: Callable[[int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> None:
    """The merged tensors streamed into safetensors shards, then the config, generation config and tokenizer."""
    write_safetensors(source, tmp, progress=progress, should_stop=should_stop)
    folder = run.weights_dir if run.full else run.base_path
    config = read_config(folder)
    config.pop("quantization_config", None)
    for key in ("dtype", "torch_dtype"):
        if key in config or key == "dtype":
            config[key] = str(DTYPES[dtype]).removeprefix("torch.")
    config["use_cache"] = True
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    for name in ("generation_config.json",):
        if (folder / name).is_file():
            shutil.copy2(folder / name, tmp / name)
    if config.get("auto_map"):  # the model's own code, which its config names
        for code in folder.glob("*.py"):
            shutil.copy2(code, tmp / code.name)
    if VisionFolder.read(folder).family is not None:
        for name in PROCESSOR_FILES:
            found = next((f / name for f in (run.weights_dir, run.base_path) if (f / name).is_file()), None)
            if found is not None:
                shutil.copy2(found, tmp / name)
    tokenizer.save_pretrained(tmp)


def write_bnb(source: MergedSource, run: TrainedRun, tokenizer: Any, tmp: Path, bits: int, dtype: str,
              progress: Callable[[int, int], None] | None = None,
              should_stop: Callable[[], bool] | None = None) -> None:
    """Merged 16-bit -> scratch folder -> transformers quantizes it while loading -> saved quantized.
    bitsandbytes owns the format, so its own loader quantizes; it holds the quantized model, never fp32."""
    scratch = tmp / ".scratch-16bit"
    scratch.mkdir()
    write_merged(source, run, tokenizer, scratch, dtype, progress, should_stop)
    family = VisionFolder.read(scratch).family  # its tower and projector stay 16-bit, as in a QLoRA run
    skip = skip_quantization(family) if family is not None else None
    quantized = auto_model_class(scratch).from_pretrained(
        scratch, dtype=DTYPES[dtype], quantization_config=bnb_config(bits, dtype, skip), device_map={"": bnb_device()},
        trust_remote_code=run.config.model.trust_remote_code, **LOAD_KWARGS,
    )
    # Saved before any forward pass: bitsandbytes repacks CPU 4-bit weights in place on the first one.
    quantized.save_pretrained(tmp, safe_serialization=True)
    for name in PROCESSOR_FILES:
        if (scratch / name).is_file():
            shutil.copy2(scratch / name, tmp / name)
    tokenizer.save_pretrained(tmp)
    del quantized
    shutil.rmtree(scratch)


# --- loaders for the checks (16-bit, on the check's device) -------------------------------------


def load_merged_export(path: Path, dtype: str, device: str, trust_remote_code: bool = False) -> tuple[Any, str]:
    """(model as plain transformers loads the folder, in its saved dtype, description): a vision-language
    folder as the whole image-text model, with its tower and projector."""
    auto = auto_model_class(path)
    model = auto.from_pretrained(path, dtype="auto", **placement(device), trust_remote_code=trust_remote_code,
                                 **LOAD_KWARGS)
    saved = {p.dtype for p in model.parameters()}
    if saved != {DTYPES[dtype]}:
        raise RuntimeError(f"{path} loaded as {sorted(str(s) for s in saved)}, expected {dtype}")
    model.eval()
    return model, f"transformers {auto.__name__}, all weights {dtype}, on {device}"


def load_bnb_export(path: Path, bits: int, dtype: str, device: str,
                    trust_remote_code: bool = False) -> tuple[Any, str]:
    """(model as transformers loads the folder, quantized, the rest in `dtype`; description)."""
    import bitsandbytes as bnb

    model = auto_model_class(path).from_pretrained(path, dtype=DTYPES[dtype], device_map={"": device},
                                                   trust_remote_code=trust_remote_code, **LOAD_KWARGS)
    kind = bnb.nn.Linear4bit if bits == 4 else bnb.nn.Linear8bitLt
    layers = [m for m in model.modules() if isinstance(m, kind)]
    if not layers:
        raise RuntimeError(f"{path} did not load quantized: no {kind.__name__} layers")
    if not device.startswith("cuda") and bits == 4:
        for layer in layers:
            layer.compute_dtype = torch.float32  # CPUs multiply fp32 fastest; the weights are what is checked
    model.eval()
    return model, f"transformers, {len(layers)} linear layers as {kind.__name__}, the rest {dtype}, on {device}"
