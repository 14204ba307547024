"""Hugging Face folder exports: the adapter, the merged 16-bit model, bitsandbytes 8-bit and 4-bit.

Each `write_*` fills a temporary folder the export job renames once complete; each `load_*` opens
what was written the way a user would (plain peft or transformers) for the job's check. The
bitsandbytes formats are probed first: a tiny model is quantized, saved, reloaded and compared, so
a bitsandbytes build that cannot serialize (or, as seen with 0.50 on AVX512-BF16 CPUs, writes
repacked 4-bit weights after a forward pass) is refused in one sentence instead of shipping a
broken folder. The merged model is saved before any forward pass for the same reason.
"""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from backend.export.merge import DTYPES, TrainedRun, load_base

log = logging.getLogger(__name__)
SKIP_FROM_ADAPTER = ("README.md", "training_args.bin")


def bnb_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def bnb_config(bits: int, dtype: str) -> Any:
    from transformers import BitsAndBytesConfig

    if bits == 4:
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                  bnb_4bit_compute_dtype=DTYPES[dtype])
    return BitsAndBytesConfig(load_in_8bit=True)


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
            quantized = AutoModelForCausalLM.from_pretrained(root / "fp16", dtype=torch.float32, **kwargs)
            quantized.save_pretrained(root / "q")
            reloaded = AutoModelForCausalLM.from_pretrained(root / "q", dtype=torch.float32, device_map={"": device})
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


def write_merged(merged: Any, tokenizer: Any, tmp: Path, dtype: str) -> None:
    """Cast the fp32 merged model to the chosen 16-bit dtype (in place) and save it with its tokenizer."""
    merged.to(DTYPES[dtype])
    merged.config.use_cache = True
    merged.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)


def write_bnb(merged: Any, tokenizer: Any, tmp: Path, bits: int, dtype: str) -> None:
    """Merged 16-bit -> scratch folder -> transformers quantizes it while loading -> saved quantized."""
    scratch = tmp / ".scratch-16bit"
    write_merged(merged, tokenizer, scratch, dtype)
    from transformers import AutoModelForCausalLM

    quantized = AutoModelForCausalLM.from_pretrained(
        scratch, dtype=DTYPES[dtype], quantization_config=bnb_config(bits, dtype), device_map={"": bnb_device()},
    )
    # Saved before any forward pass: bitsandbytes repacks CPU 4-bit weights in place on the first one.
    quantized.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    del quantized
    shutil.rmtree(scratch)


# --- loaders for the checks ---------------------------------------------------------------------


def load_adapter_export(run: TrainedRun, path: Path) -> Any:
    """Plain peft on top of the base, rebuilt as the run trained it (dequantized for qlora/lora8)."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(load_base(run), path, is_trainable=False)
    model.eval()
    return model


def load_merged_export(path: Path, dtype: str) -> tuple[Any, str]:
    """(model widened to fp32 for the check, description of the dtype it was saved in)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype="auto")
    saved = {p.dtype for p in model.parameters()}
    if saved != {DTYPES[dtype]}:
        raise RuntimeError(f"{path} loaded as {sorted(str(s) for s in saved)}, expected {dtype}")
    model.float().eval()
    return model, f"all weights {dtype}"


def load_bnb_export(path: Path, bits: int) -> tuple[Any, str]:
    """(model as transformers loads it from the folder, how many Linear layers came back quantized)."""
    import bitsandbytes as bnb
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map={"": bnb_device()})
    kind = bnb.nn.Linear4bit if bits == 4 else bnb.nn.Linear8bitLt
    layers = [m for m in model.modules() if isinstance(m, kind)]
    if not layers:
        raise RuntimeError(f"{path} did not load quantized: no {kind.__name__} layers")
    # The check measures the stored weights, not 16-bit arithmetic: unquantized tensors (embeddings,
    # norms; transformers keeps them in the saved 16-bit dtype whatever `dtype` says) and the 4-bit
    # matmuls are widened to fp32.
    for param in model.parameters():
        if param.dtype in (torch.bfloat16, torch.float16):
            param.data = param.data.float()
    for layer in layers:
        if bits == 4:
            layer.compute_dtype = torch.float32
    model.eval()
    return model, f"{len(layers)} linear layers load as {kind.__name__}, the rest widened to fp32"
