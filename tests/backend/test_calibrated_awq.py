"""AWQ (backend/export/calibrated/awq.py) against transcriptions of the references on small modules, the
mappings it takes, and the asymmetric file it writes loading in our stack (transformers + compressed-tensors).

The transcriptions below are the references' own loops with their framework plumbing (sessions, offloading,
observers, progress bars) taken out; they quantize with compressed-tensors' calculate_qparams/fake_quantize
(llmcompressor's memoryless min-max observer) or AutoAWQ's pseudo_quantize_tensor, never with our grid.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from backend.export.calibrated import awq, grid, layers, pack
from backend.export.calibrated.collect import calibrate
from backend.runtime.hub_kernels import LOAD_KWARGS
from tests.families import tiny_config

torch.set_num_threads(1)
GROUP = 32


def _args():
    return grid.scheme("awq-int4", GROUP).weights


# --- transcription: llmcompressor, src/llmcompressor/modifiers/transform/awq/base.py -----------------------------
# vllm-project/llm-compressor at ab1ba3effcafc15746cd6d6ca24cba3f7bd7a582 (after 0.13.0; the AWQ code is 0.14's),
# Apache-2.0: AWQModifier._get_grid_search_params (duo_scaling=True), _compute_layer_means (GROUP strategy),
# _compute_best_scale and _compute_loss (no loss mask, one process).

def _ct_fake_quantize(weight: torch.Tensor, args) -> torch.Tensor:
    """memoryless_minmax observer -> calculate_qparams -> forward_quantize, compressed-tensors' own functions."""
    from compressed_tensors.quantization.lifecycle.forward import fake_quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    grouped = weight.reshape(weight.shape[0], -1, args.group_size)
    scale, zero = calculate_qparams(grouped.amin(-1), grouped.amax(-1), args)
    return fake_quantize(weight, scale, zero, args)


def _llmc_grid_search_params(n_grid: int) -> list[tuple[float, bool]]:
    return [(0.0, False)] + [(grid_idx / (n_grid - 2), True) for grid_idx in range(n_grid - 1)]


def _llmc_compute_layer_means(layers_: list[torch.nn.Linear], group_size: int) -> torch.Tensor:
    weight_total_count = 0
    weight_total_sum = 0
    for layer in layers_:
        weight = layer.weight.clone()
        orig_shape = weight.shape
        chunk_size = group_size
        weight = weight.reshape(-1, chunk_size)
        weight.abs_()
        weight.div_(weight.amax(dim=1, keepdim=True) + 1e-6)
        weight = weight.reshape(orig_shape)
        weight_total_count += weight.size(0)
        weight_sum = weight.sum(0, dtype=torch.float64)
        weight_total_sum += weight_sum
    return weight_total_sum / weight_total_count


def _llmc_compute_best_scale(parent, batches, balance_layers, x_mean, args, n_grid=20) -> torch.Tensor:
    def run_samples():
        outputs = [parent(*batch[0], **batch[1]) for batch in batches]
        return [output[0] if isinstance(output, tuple) else output for output in outputs]

    def compute_loss(fp16_outputs, int_w_outputs):
        loss = torch.tensor(0.0)
        num_elements = torch.tensor(0)
        for fp16_batch, int_w_batch in zip(fp16_outputs, int_w_outputs):
            loss += torch.nn.functional.mse_loss(fp16_batch, int_w_batch, reduction="sum")
            num_elements += fp16_batch.numel()
        return (loss / num_elements).item()

    fp16_outputs = run_samples()
    orig_layer_weights = {layer: layer.weight.clone() for layer in balance_layers}
    best_error, best_scales = float("inf"), None
    w_mean = _llmc_compute_layer_means(balance_layers, args.group_size)
    for ratio, use_duo_scaling in _llmc_grid_search_params(n_grid):
        if use_duo_scaling:
            scales = (x_mean.pow(ratio) / (w_mean.pow(1 - ratio) + 1e-4)).clamp(min=1e-4)
        else:
            scales = x_mean.pow(ratio).clamp(min=1e-4).view(-1)
        scales = scales / (scales.max() * scales.min()).sqrt()
        scales[torch.isinf(scales)] = 1
        scales[torch.isnan(scales)] = 1
        _scalesview = scales.view(1, -1)
        for balance_layer in balance_layers:
            balance_layer.weight.data.copy_(orig_layer_weights[balance_layer] * _scalesview)
        for balance_layer in balance_layers:
            balance_layer.weight.data = (_ct_fake_quantize(balance_layer.weight, args) / _scalesview).to(
                balance_layer.weight.dtype)
        int_w_outputs = run_samples()
        loss = compute_loss(fp16_outputs, int_w_outputs)
        if loss < best_error:
            best_error = loss
            best_scales = scales.clone()
    for layer, weight in orig_layer_weights.items():
        layer.weight.data = weight
    return best_scales.float()


# --- transcription: AutoAWQ, awq/quantize/quantizer.py -----------------------------------------------------------
# casper-hansen/AutoAWQ at 88e4c76b20755db275574e6a03c83c84ba3bece5, MIT (Copyright (c) 2023 MIT HAN Lab):
# AwqQuantizer.pseudo_quantize_tensor (zero_point=True, w_bit=4) and _compute_best_clip, device moves removed.

def _autoawq_pseudo_quantize_tensor(w: torch.Tensor, group_size: int, w_bit: int = 4) -> torch.Tensor:
    org_w_shape = w.shape
    w = w.reshape(-1, group_size)
    max_val = w.amax(dim=1, keepdim=True)
    min_val = w.amin(dim=1, keepdim=True)
    max_int = 2**w_bit - 1
    min_int = 0
    scales = (max_val - min_val).clamp(min=1e-5) / max_int
    zeros = (-torch.round(min_val / scales)).clamp_(min_int, max_int)
    w = (torch.clamp(torch.round(w / scales) + zeros, min_int, max_int) - zeros) * scales
    return w.reshape(org_w_shape)


def _autoawq_compute_best_clip(w, input_feat, group_size, n_grid=20, max_shrink=0.5, n_sample_token=512):
    org_w_shape = w.shape
    input_feat = input_feat.view(-1, input_feat.shape[-1])
    input_feat = input_feat.reshape(1, input_feat.shape[0], -1, group_size)
    step_size = max(1, input_feat.shape[1] // n_sample_token)
    input_feat = input_feat[:, ::step_size]
    w = w.reshape(org_w_shape[0], 1, -1, group_size)
    oc_batch_size = 256 if org_w_shape[0] % 256 == 0 else 64
    w_all = w
    best_max_val_all = []
    for i_b in range(org_w_shape[0] // oc_batch_size):
        w = w_all[i_b * oc_batch_size: (i_b + 1) * oc_batch_size]
        org_max_val = w.abs().amax(dim=-1, keepdim=True)
        best_max_val = org_max_val.clone()
        min_errs = torch.ones_like(org_max_val) * 1e9
        org_out = (input_feat * w).sum(dim=-1)
        for i_s in range(int(max_shrink * n_grid)):
            max_val = org_max_val * (1 - i_s / n_grid)
            min_val = -max_val
            cur_w = torch.clamp(w, min_val, max_val)
            q_w = _autoawq_pseudo_quantize_tensor(cur_w, group_size)
            cur_out = (input_feat * q_w).sum(dim=-1)
            err = (cur_out - org_out).pow(2).mean(dim=1).view(min_errs.shape)
            cur_best_idx = err < min_errs
            min_errs[cur_best_idx] = err[cur_best_idx]
            best_max_val[cur_best_idx] = max_val[cur_best_idx]
        best_max_val_all.append(best_max_val)
    return torch.cat(best_max_val_all, dim=0).squeeze(1)


# --- the tests ---------------------------------------------------------------------------------------------------

def _tiny(kv_heads: int = 2):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(5)
    config = tiny_config("llama", num_key_value_heads=kv_heads)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # a few large input channels meeting small weights, where AWQ has something to win
        for layer in model.model.layers:
            for norm, linears in ((layer.input_layernorm, ("q_proj", "k_proj", "v_proj")),
                                  (layer.post_attention_layernorm, ("gate_proj", "up_proj"))):
                norm.weight[:3] *= 30.0
                for name in linears:
                    parent = layer.self_attn if name.endswith(("q_proj", "k_proj", "v_proj")) else layer.mlp
                    getattr(parent, name).weight[:, :3] *= 0.05
    return model


def _recorded_units(model, rows: int = 6) -> list:
    """Each mapping's unit, after one calibration pass has given it the parent's calls (nothing finished)."""
    generator = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 4000, (24,), generator=generator).tolist() for _ in range(rows)]
    units = awq.units(model, layers.quantized_linears(model), _args(), torch.float32, sum(map(len, ids)))
    recorded = [u for u in units if isinstance(u, awq.AwqUnit)]
    for unit in units:
        unit.finish = lambda: None  # keep what was gathered; the test finishes by hand
    calibrate(model, ids, units, 10**9)
    return recorded


def test_scale_search_is_llmcompressors_with_duo_scaling():
    model = _tiny(kv_heads=4)
    searched = 0
    for unit in _recorded_units(model)[:4]:  # layer 0: attention (parent self_attn), v->o, mlp, up->down
        linears = unit.found.mapping.linears
        x_mean = unit.total / unit.count
        with torch.no_grad():
            ours = awq.search_scale(unit.found.parent, unit.calls, linears, x_mean, _args(), torch.float32)
            theirs = _llmc_compute_best_scale(unit.found.parent, unit.calls, linears, x_mean, _args())
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
        searched += not torch.equal(ours, torch.ones_like(ours))
    assert searched >= 2  # the identity did not win everywhere: the duo formula's points were compared


def test_clip_search_is_autoawqs(monkeypatch):
    torch.manual_seed(1)
    args = _args()
    weight = torch.randn(128, 4 * GROUP) * 0.05
    weight[:, 3] *= 8  # an outlier column: clipping it helps the rest of its group
    x = torch.randn(1500, 4 * GROUP) @ torch.randn(4 * GROUP, 4 * GROUP) * 0.2
    ours = awq.best_clip(weight, x, args, torch.float32)
    theirs = _autoawq_compute_best_clip(weight, x, GROUP)
    assert ours.shape == (128, 4) and theirs.shape == (128, 4, 1)
    torch.testing.assert_close(ours, theirs.squeeze(-1), rtol=1e-6, atol=0)
    assert (ours < weight.reshape(128, 4, GROUP).abs().amax(-1)).any()  # some groups were clipped
    monkeypatch.setattr(awq, "CLIP_CHUNK", 750 * 4 * 10)  # ten rows at a time: the same limits
    assert torch.equal(awq.best_clip(weight, x, args, torch.float32), ours)


def test_parent_is_the_lowest_common_module_of_the_balance_layers():
    found = awq.awq_mappings(_tiny(kv_heads=4))
    layer0 = [f for f in found if f.mapping.name.startswith("model.layers.0 ")]
    parents = {f.mapping.name.split(" ")[1]: type(f.parent).__name__ for f in layer0}
    assert parents == {"attention": "LlamaAttention", "v->o": "Linear", "mlp": "LlamaMLP", "up->down": "Linear"}
    vo = next(f for f in layer0 if f.mapping.name.endswith("v->o"))
    assert vo.parent is vo.mapping.linears[0] and vo.names == ["self_attn.o_proj"]


def test_v_to_o_is_taken_where_shapes_allow_and_skipped_with_grouped_query_attention():
    model = _tiny(kv_heads=4)
    names = [f.mapping.name.split(" ")[1] for f in awq.awq_mappings(model)]
    assert names.count("v->o") == model.config.num_hidden_layers
    grouped = _tiny(kv_heads=2)
    assert all(not f.mapping.name.endswith("v->o") for f in awq.awq_mappings(grouped))
    units = awq.units(grouped, layers.quantized_linears(grouped), _args(), torch.float32, 100)
    clipped_alone = {type(u).__name__ for u in units if u.module is grouped.model.layers[0].self_attn.o_proj}
    assert clipped_alone == {"ClipUnit"}  # o_proj is still clipped, as AutoAWQ clips every linear but q and k


def test_v_to_o_fold_leaves_the_unquantized_model_unchanged():
    model = _tiny(kv_heads=4)
    ids = torch.tensor([[1, 4, 300, 517, 700, 911]])
    with torch.no_grad():
        before = model(ids).logits
        for found in awq.awq_mappings(model):
            found.mapping.fold(torch.rand(found.mapping.linears[0].in_features) * 2 + 0.5)
        after = model(ids).logits
    torch.testing.assert_close(before, after, atol=1e-4, rtol=1e-4)


def test_awq_never_does_worse_than_plain_rounding_on_the_parent_output():
    """The identity is the grid's first point, so the chosen scale's parent-output error is at most plain
    rounding's; with large inputs on small weights it is well below."""
    model = _tiny()
    unit = _recorded_units(model)[1]  # layer 0's MLP: parent mlp, gate and up balanced
    mlp, linears = unit.found.parent, unit.found.mapping.linears
    with torch.no_grad():
        for linear in linears:
            linear.weight[:, :3] *= 0.05
        for call in unit.calls:
            call[0][0][..., :3] *= 40.0
        unit.total = sum(c[0][0].abs().reshape(-1, c[0][0].shape[-1]).sum(0) for c in unit.calls)
        unit.count = sum(c[0][0].numel() // c[0][0].shape[-1] for c in unit.calls)

        def error(scales: torch.Tensor) -> float:
            originals = [lin.weight.data for lin in linears]
            for lin in linears:
                lin.weight.data = awq.quantized_scaled(lin.weight.data, scales, _args(), torch.float32)
            total = sum(float((mlp(*c[0]) - expected).pow(2).mean()) for c, expected in zip(unit.calls, reference))
            for lin, w in zip(linears, originals):
                lin.weight.data = w
            return total

        reference = [mlp(*c[0]) for c in unit.calls]
        best = awq.search_scale(mlp, unit.calls, linears, unit.total / unit.count, _args(), torch.float32)
        plain, chosen = error(torch.ones_like(best)), error(best)
    assert chosen < 0.5 * plain, (chosen, plain)


def test_asymmetric_file_loads_in_our_stack_close_to_the_fake_quantized_model(tmp_path):
    from transformers import AutoModelForCausalLM

    from backend.training.model import packed_zero_points

    model = _tiny()
    units = _recorded_units(model)
    for unit in units:
        del unit.finish  # the class's finish again
        unit.finish()
    linears = layers.quantized_linears(model)
    args = _args()
    fake = {}
    for name, lin in linears.items():
        scale, zero = grid.weight_qparams(lin.weight, args, torch.float32)
        fake[name] = grid.fake_quantize(lin.weight, scale, args, zero)
    ids = torch.tensor([[1, 4, 300, 517, 700, 911, 1200]])
    with torch.no_grad():
        for name, lin in linears.items():
            lin.weight.data = fake[name].clone()
        expected = model(ids).logits
    scheme = grid.scheme("awq-int4", GROUP)
    ignore = sorted({n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)} - set(linears))
    compressor = pack.pack(model, linears, {}, scheme, ignore, torch.float32)
    pack.save(model, compressor, tmp_path)
    with safe_open(Path(tmp_path) / "model.safetensors", "pt") as f:
        zero = f.get_tensor("model.layers.0.mlp.down_proj.weight_zero_point")
    assert zero.dtype == torch.int32 and zero.shape == (64 // 8, 128 // GROUP)  # packed along the rows, as vLLM reads
    packed_zero_points.allow()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, **LOAD_KWARGS).eval()
    quant = json.loads((Path(tmp_path) / "config.json").read_text())["quantization_config"]
    assert quant["config_groups"]["group_0"]["weights"]["symmetric"] is False
    with torch.no_grad():
        got = loaded(ids).logits
    torch.testing.assert_close(got, expected, atol=2e-3, rtol=1e-3)


@pytest.mark.parametrize("family", ["qwen2", "gemma3_text", "phi3"])
def test_mappings_of_other_families_fold_without_changing_the_model(family):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(tiny_config(family, num_key_value_heads=4)).eval()
    found = awq.awq_mappings(model)
    kinds = {f.mapping.name.split(" ")[1] for f in found}
    expected = {"gemma3_text": {"v->o", "mlp", "up->down"}, "phi3": {"attention", "qkv->o", "mlp", "up->down"}}
    assert kinds == expected.get(family, {"attention", "v->o", "mlp", "up->down"}), kinds
    ids = torch.tensor([[1, 4, 300, 517, 700]])
    with torch.no_grad():
        before = model(ids).logits
        for f in found:
            f.mapping.fold(torch.rand(f.mapping.linears[0].in_features) * 2 + 0.5)
        after = model(ids).logits
    torch.testing.assert_close(before, after, atol=1e-3, rtol=1e-3)


def test_row_wise_steps_made_a_band_at_a_time_equal_the_whole_weights(monkeypatch):
    """layers.BAND bounds the fp32 scratch of the candidates, the clipping, the duo means and the folds; bands of
    a few rows give the values one band over the whole weight gives."""
    torch.manual_seed(6)
    args = _args()
    norm = torch.nn.LayerNorm(128)
    norm.weight.data = torch.rand(128) + 0.5
    linears = [torch.nn.Linear(128, rows, bias=False).to(torch.bfloat16) for rows in (40, 13)]
    scales, x = torch.rand(128) + 0.5, torch.randn(300, 128)

    def steps() -> list[torch.Tensor]:
        clipped, mapping = copy.deepcopy(linears[0]), layers.Mapping("m", copy.deepcopy(norm), copy.deepcopy(linears))
        awq.clip(clipped, x, args, torch.bfloat16)
        mapping.fold(scales)
        return [awq.weight_means(linears, args.group_size), awq.quantized_scaled(linears[1].weight, scales, args,
                torch.bfloat16), clipped.weight, mapping.feeder.weight, *[lin.weight for lin in mapping.linears]]

    whole = steps()
    monkeypatch.setattr(layers, "BAND", 3 * 128)
    assert layers.row_bands(linears[0].weight)[:2] == [(0, 3), (3, 6)]
    for got, want in zip(steps(), whole):
        assert torch.equal(got, want)
