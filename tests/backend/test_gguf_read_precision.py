"""The precision a GGUF export's check reads the file in: 16-bit weights, fp32 activations (issue 34).

gguf_check.read_dtype picks the weights' dtype from the file's GGML types alone (the same on every
device), gguf_check.widen keeps the activations fp32 around them: the read-back model costs 2 bytes a
weight (it cost 4 in fp32, 2.41x the 16-bit size at the check's peak), and Gemma's activations, which
overflow fp16, stay right.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.families import BUNDLED, build_tiny_model, tiny_config

torch.set_num_threads(1)
IDS = torch.tensor([[1, 4, 300, 517, 700, 911, 1200, 2, 5, 64, 128, 77, 99, 1000, 2000, 3000, 3500, 4095]])
TYPE_SETS = [
    ({"F16", "F32"}, torch.float16),  # F16 exactly, never bf16
    ({"BF16", "F32"}, torch.bfloat16),  # a BF16 file (not one we write) holds bf16 values
    ({"Q8_0", "F16", "F32"}, torch.float16),  # scale x integers, rounded by 2^-11 (read_dtype's docstring)
    ({"Q5_0", "F16", "F32"}, torch.float16),
    ({"Q4_0", "F32"}, torch.float16),
    ({"BF16", "F16"}, torch.float32),  # no 16-bit type holds both
    ({"Q8_0", "BF16", "F32"}, torch.float32),
    ({"F32"}, torch.float32),
]


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
@pytest.mark.parametrize("types, want", TYPE_SETS)
def test_each_type_set_is_read_in_its_dtype_on_every_device(types, want, device, monkeypatch, tmp_path):
    """What from_pretrained is given, checked on the CPU for both devices (a Gemma too: its activations,
    not its weights, are what overflow fp16)."""
    import transformers

    from backend.export import gguf_check

    seen = {}

    def fake(folder, **kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    assert gguf_check.read_dtype(types) == want
    monkeypatch.setattr(gguf_check, "weight_types", lambda path: types)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", staticmethod(fake))
    for family in ("llama", "gemma2"):
        model, _, why = gguf_check.read_back(tmp_path / "model.gguf", tiny_config(family), device)
        assert model is None and "RuntimeError: stop here" in why
        assert seen["dtype"] == want and seen["use_kernels"] is False and seen["device_map"] == {"": device}
        assert seen["quantization_config"].dequantize is True  # never the packed path's Hub kernels


@pytest.mark.parametrize("qtype, share", [("Q8_0", 0.05), ("Q5_0", 0.006), ("Q4_0", 0.003)])
def test_fp16_rounding_of_quantized_blocks_is_far_below_the_formats_own(qtype, share):
    """read_dtype's figures: the RMS of fp16's rounding of the dequantized values against the RMS of the
    format's own error, on Gaussian weights (measured 3.9%, 0.42%, 0.20%)."""
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    weights = (np.random.default_rng(0).standard_normal((256, 4096)) * 0.02).astype(np.float32)
    values = gguf.quants.dequantize(gguf.quants.quantize(weights, kind), kind).reshape(weights.shape)
    rounding = values.astype(np.float16).astype(np.float32) - values
    assert np.sqrt(np.mean(rounding ** 2)) <= share * np.sqrt(np.mean((values - weights) ** 2))


def _export(family: str, fmt: str, folder: Path, boost: str = "", **overrides) -> tuple[object, Path]:
    """A tiny bf16 model (the norm weights named `boost` set to 32768) and its GGUF export."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from backend.export.gguf_writer import GgufExport
    from backend.export.tensor_source import StateDictSource

    model = AutoModelForCausalLM.from_pretrained(
        build_tiny_model(family, folder / "model", seed=1, dtype="bfloat16", **overrides), dtype=torch.bfloat16)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if boost and name.endswith(boost):
                param.fill_(32768.0)
    model = model.float().eval()
    path = folder / "out" / "model.gguf"
    path.parent.mkdir(parents=True)
    GgufExport(StateDictSource(model), AutoTokenizer.from_pretrained(BUNDLED), fmt, "tiny").write(path)
    return model, path


@pytest.mark.parametrize("family, fmt", [("llama", "gguf-f16"), ("llama", "gguf-q8_0")] + [
    (family, "gguf-f16") for family in ("qwen2", "qwen3_moe", "gemma3_text", "phi3", "gpt2")])
def test_the_read_back_model_holds_2_bytes_a_weight_and_computes_in_fp32(family, fmt, tmp_path):
    """The check's memory: every matrix 16-bit (the 1-D norms fp32), logits fp32 and close to the model's,
    through each kind of layer widen handles (Linear, experts, tied and scaled embeddings, Conv1D)."""
    from backend.export.gguf_check import read_back
    from tests.backend.test_gguf_families import READABLE

    model, path = _export(family, fmt, tmp_path, **READABLE[family])
    read, loaded, why = read_back(path, model.config, "cpu")
    assert why is None and "float16 weights, float32 activations and products on cpu" in loaded
    matrices = [p for p in read.parameters() if p.dim() > 1]
    assert matrices and all(p.dtype == torch.float16 for p in matrices)
    assert all(p.dtype == torch.float32 for p in read.parameters() if p.dim() <= 1)
    weights = sum(p.numel() for p in model.parameters() if p.dim() > 1)
    assert sum(p.numel() * p.element_size() for p in matrices) == 2 * weights
    with torch.no_grad():
        want, got = model(IDS).logits[0], read(IDS).logits[0]
    assert got.dtype == torch.float32
    bound = {"gguf-f16": 1e-5, "gguf-q8_0": 3e-2}[fmt]  # F16: the bf16 model's values, read exactly
    assert (want - got).abs().max().item() <= bound * want.abs().max().item()


def test_gemma2_activations_beyond_fp16_stay_right_from_an_f16_file(tmp_path):
    """The case that once made the check read Gemma in fp32: its residual stream outgrows fp16's 65504.
    Weights read in fp16 with fp32 activations reproduce the model; fp16 activations would not."""
    from backend.export.gguf_check import read_back

    model, path = _export("gemma2", "gguf-f16", tmp_path, "layers.0.post_feedforward_layernorm.weight",
                          head_dim=256, query_pre_attn_scalar=256)
    with torch.no_grad():
        hidden = model(IDS, output_hidden_states=True).hidden_states
        assert max(h.abs().max().item() for h in hidden) > 65504  # fp16 could not hold it
        want = model(IDS).logits[0]
        read, _, why = read_back(path, model.config, "cpu")
        assert why is None and next(read.parameters()).dtype == torch.float16
        got = read(IDS).logits[0]
    assert torch.isfinite(got).all() and (want - got).abs().max().item() <= 3e-3 * want.abs().max().item()
