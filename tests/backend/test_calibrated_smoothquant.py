"""SmoothQuant's scales (backend/export/calibrated/scaling.py) against a transcription of llmcompressor's, and
W8A8's GPTQ gathering its Hessian on the inputs SmoothQuant has smoothed."""

from __future__ import annotations

import torch

from backend.export.calibrated import collect, layers, scaling
from tests.backend.test_calibrated_collect import ROWS, Inputs, _model, _whole_model_inputs
from tests.backend.test_export_calibrated import _inputs, _norm_mapping

# --- A transcription of vllm-project/llm-compressor (https://github.com/vllm-project/llm-compressor, Apache-2.0),
# src/llmcompressor/modifiers/transform/smoothquant/base.py at commit 8a0b75f8db44ac37a1b1c261de08a92c393d1f8f:
# the forward hook on the smooth layer (`_setup_scale_hooks`' hook_fn, its output's per-channel min and max),
# `_apply_smoothing` and `_calculate_smoothing_scales`, for one mapping whose smooth layer is a norm. Left out:
# the logging, align_module_device (everything is on the CPU here) and the mapping resolution.
MINIMUM_SMOOTHING_SCALE = 1e-5


def _ref_hook(scales: dict, out: torch.Tensor) -> None:
    if isinstance(out, tuple):
        out = out[0]
    hidden_dim = out.shape[-1]
    out = out.view(-1, hidden_dim)
    latest_mins = torch.min(out, dim=0)[0]
    latest_maxes = torch.max(out, dim=0)[0]
    if "min" in scales:
        scales["min"] = torch.minimum(scales["min"], latest_mins)
        scales["max"] = torch.maximum(scales["max"], latest_maxes)
    else:
        scales["min"], scales["max"] = latest_mins, latest_maxes


def _ref_calculate_smoothing_scales(balance_layers, activation_scales, smoothing_strength):
    weight_scales = []
    for layer in balance_layers:
        scale = layer.weight.abs().max(dim=0, keepdim=True)[0]
        weight_scales.append(scale)
    weight_scales = 2.0 * torch.cat(weight_scales, dim=0).max(dim=0)[0]
    scales = activation_scales.pow(smoothing_strength) / weight_scales.pow(1 - smoothing_strength)
    scales = torch.where(weight_scales > 0.0, scales, activation_scales)
    return scales


@torch.no_grad()
def _ref_apply_smoothing(scales: dict, smooth_layer, balance_layers, smoothing_strength) -> None:
    activation_scales = scales["max"] - scales["min"]
    scales_ = _ref_calculate_smoothing_scales(balance_layers, activation_scales, smoothing_strength)
    scales_ = torch.maximum(scales_, torch.Tensor([MINIMUM_SMOOTHING_SCALE]).to(scales_.device))
    for module in balance_layers:
        module.weight.mul_(scales_.view(1, -1))
    if smooth_layer.weight.ndim == 1:
        smooth_layer.weight.div_(scales_)
    else:
        smooth_layer.weight.div_(scales_.view(-1, 1))
    if hasattr(smooth_layer, "bias") and smooth_layer.bias is not None:
        smooth_layer.bias.div_(scales_)

# --- end of the transcription


def test_smoothquant_matches_a_transcription_of_llmcompressors():
    mapping, block = _norm_mapping(64, False)
    reference, reference_block = _norm_mapping(64, False)  # the same seed: the same weights
    x = _inputs(300, 64, outliers=3)
    with torch.no_grad():
        x[:, 7] = -x[:, 7].abs()  # a channel that never goes positive: its range is not 2 max|x|
        reference.linears[1].weight[:, 9] = 0.0  # a channel only one of the two weights reads
        mapping.linears[1].weight[:, 9] = 0.0
        unit, statistics = scaling.SmoothQuantUnit(mapping), {}
        for chunk in x.split(100):
            unit.add(block[0](chunk))
            _ref_hook(statistics, reference_block[0](chunk))
    unit.finish()
    _ref_apply_smoothing(statistics, reference.feeder, reference.linears, scaling.SMOOTHING)
    assert scaling.SMOOTHING == 0.8
    for ours, theirs in zip([mapping.feeder, *mapping.linears], [reference.feeder, *reference.linears]):
        assert torch.allclose(ours.weight, theirs.weight, rtol=1e-6, atol=0), (ours.weight - theirs.weight).abs().max()
    assert not torch.allclose(mapping.feeder.weight, _norm_mapping(64, False)[0].feeder.weight)  # it did smooth


def test_w8a8_gptq_gathers_its_hessian_on_the_smoothed_inputs():
    """A stage-1 unit (GPTQ's) on q_proj sees what q_proj gets once layer 0's SmoothQuant is folded in; the
    stage-0 one beside SmoothQuant, the inputs before."""
    model = _model("llama")
    _, stack = layers.decoder_layers(model)
    q_proj = stack[0].self_attn.q_proj
    before = _whole_model_inputs(model, q_proj)
    smoothing = [scaling.SmoothQuantUnit(m) for m in layers.mappings(model, False) if m.name.startswith("model.layers.0")]
    alongside, after = Inputs(q_proj), Inputs(q_proj)
    after.stage = 1
    assert collect.calibrate(model, ROWS, [after, *smoothing, alongside], budget=1 << 30) == 2
    smoothed = _whole_model_inputs(model, q_proj)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(alongside.seen, before))
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(after.seen, smoothed))
    assert not torch.allclose(before[0], smoothed[0], atol=1e-3)
