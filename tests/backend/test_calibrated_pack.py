"""Packing a calibrated model one linear layer at a time (backend/export/calibrated/pack.py): the folder is the
one compressed-tensors' whole-model path writes, each 16-bit weight is freed as its layer is packed, and the
memory the calibration's rewritten weights held is handed back as they are packed."""

from __future__ import annotations

import importlib
import json
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from backend.runtime.hub_kernels import LOAD_KWARGS
from backend.export.calibrated import gptq, grid, layers, pack
from backend.export.calibrated.collect import calibrate
from backend.export.memory import anonymous_bytes, release
from tests.families import BUNDLED, build_tiny_model

torch.set_num_threads(1)
SCALE_DTYPE = torch.bfloat16


def _prepared(fmt: str, folder: Path) -> tuple[Any, dict[str, torch.nn.Linear], Any, list[str]]:
    """The model as writer.py loads it (bf16, from safetensors), its quantized linears, scheme and ignore list."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, **LOAD_KWARGS).eval()
    linears = layers.quantized_linears(model)
    scheme = grid.scheme(fmt, layers.group_size(linears) if fmt != "w8a8" else 0)
    ignore = sorted({n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)} - set(linears))
    return model, linears, scheme, ignore


def _whole_model_path(model: Any, linears: dict, qparams: dict, scheme: Any, ignore: list[str], out: Path) -> None:
    """What writer.py did before pack.py: compressed-tensors' lifecycle for the whole model at once."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import apply_quantization_config

    apply_quantization_config(model, pack.quantization_config(scheme, ignore), show_progress=False)
    with torch.no_grad():
        for linear in linears.values():
            scale, zero = qparams[linear]
            linear.weight_scale.copy_(scale.reshape(linear.weight_scale.shape).to(linear.weight_scale.dtype))
            linear.weight_zero_point.copy_(zero.reshape(linear.weight_zero_point.shape).to(linear.weight_zero_point.dtype))
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out, safe_serialization=True)
    compressor.update_config(str(out))


@pytest.mark.parametrize("fmt", ["gptq-int4", "w8a8"])
def test_layer_by_layer_packing_writes_what_the_whole_model_path_writes(tmp_path, fmt):
    written = {}
    for way in ("whole", "layers"):
        model, linears, scheme, ignore = _prepared(fmt, BUNDLED)
        with torch.no_grad():  # a calibration's change, the same in both
            for linear in linears.values():
                layers.rewrite(linear, "weight", linear.weight.float() * 1.5)
        qparams = {m: grid.weight_qparams(m.weight, scheme.weights, SCALE_DTYPE) for m in linears.values()}
        out = tmp_path / way
        if way == "whole":
            _whole_model_path(model, linears, qparams, scheme, ignore, out)
        else:
            pack.save(model, pack.pack(model, linears, qparams, scheme, ignore, SCALE_DTYPE), out)
            assert not qparams  # each layer's scale is dropped once it is packed
        written[way] = out
    whole, by_layer = (json.loads((written[w] / "config.json").read_text()) for w in ("whole", "layers"))
    assert whole == by_layer
    quant = by_layer["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors" and quant["quantization_status"] == "compressed"
    assert quant["format"] == ("int-quantized" if fmt == "w8a8" else "pack-quantized")
    assert quant["ignore"] == ["lm_head"]
    files = [written[w] / "model.safetensors" for w in ("whole", "layers")]
    with safe_open(files[0], "pt") as a, safe_open(files[1], "pt") as b:
        assert a.metadata() == b.metadata() and sorted(a.keys()) == sorted(b.keys())
        for key in a.keys():
            assert a.get_tensor(key).dtype == b.get_tensor(key).dtype and torch.equal(a.get_tensor(key), b.get_tensor(key)), key
        names = set(b.keys())
    down = "model.layers.0.mlp.down_proj."
    if fmt == "w8a8":
        assert {down + "weight", down + "weight_scale"} <= names and down + "weight_packed" not in names
    else:
        assert {down + "weight_packed", down + "weight_scale", down + "weight_shape"} <= names
        assert down + "weight" not in names and down + "weight_zero_point" not in names
    assert files[0].read_bytes() == files[1].read_bytes()


def test_each_16bit_weight_is_freed_as_its_layer_is_packed(monkeypatch):
    base = importlib.import_module("compressed_tensors.compressors.base")  # the package's `base` is another module

    model, linears, scheme, ignore = _prepared("gptq-int4", BUNDLED)
    weights = [weakref.ref(m.weight) for m in linears.values()]
    alive: list[int] = []
    compress_module = base.compress_module

    def counting(module: torch.nn.Module, *args: Any) -> None:
        alive.append(sum(ref() is not None for ref in weights))
        compress_module(module, *args)

    monkeypatch.setattr(base, "compress_module", counting)
    pack.pack(model, linears, {}, scheme, ignore, SCALE_DTYPE)
    # As each layer is packed, only its own 16-bit weight and those of the layers after it are left.
    assert alive == list(range(len(weights), 0, -1))
    assert all(ref() is None for ref in weights)


@pytest.mark.skipif(anonymous_bytes() is None, reason="reads RssAnon from /proc/self/status (Linux)")
def test_packing_hands_back_the_memory_of_the_weights_the_calibration_rewrote(tmp_path):
    """Weights loaded from safetensors are views of the file's private mapping: rounding them in place (as this
    export once did) made copied-on-write pages that stayed resident under the packed copies."""
    folder = build_tiny_model("llama", tmp_path / "model", dtype="bfloat16", hidden_size=1024, intermediate_size=4096,
                              num_attention_heads=8, num_key_value_heads=8, head_dim=128)
    import compressed_tensors.compressors  # noqa: F401  (its code, imported before the first measure)

    model, linears, scheme, ignore = _prepared("gptq-int4", folder)
    linear_bytes = sum(m.weight.numel() * 2 for m in linears.values())  # 67 MB of 16-bit linear weights
    qparams: dict = {}
    units = [gptq.GptqUnit(g, scheme.weights, SCALE_DTYPE, qparams) for g in gptq.shared_inputs(linears)]
    generator = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 4096, (32,), generator=generator).tolist() for _ in range(4)]
    calibrate(model, rows, units, budget=1 << 30)
    assert len(qparams) == len(linears)
    release()
    before = anonymous_bytes()
    pack.pack(model, linears, qparams, scheme, ignore, SCALE_DTYPE)
    release()
    change = anonymous_bytes() - before
    # 16-bit weights freed, 4-bit ones (a quarter of their size) and scales made: about -0.72x of their size.
    # Had the 16-bit ones stayed resident, the change would be about +0.27x.
    assert change < -0.4 * linear_bytes, (change, linear_bytes)
