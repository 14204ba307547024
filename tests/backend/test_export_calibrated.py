"""Calibrated exports (gptq-int4, awq-int4, w8a8): each written for tiny Llama (the bundled model), Qwen2 and
Gemma 3 runs, reloaded by transformers through compressed-tensors and checked; GPT-2 and MoE refused; the
algorithms each measured against plain rounding on inputs where they should win.

Runs are trained once per module in-process (3 steps, one thread, seq_len 64); exports calibrate on 16 rows.
"""

from __future__ import annotations

import io
import json
import types
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from backend.core.errors import JobError
from backend.export.calibrated import grid, gptq, layers, scaling
from backend.training.model import packed_zero_points
from backend.export.calibrated.collect import calibrate, passes
from backend.core.registries.export_formats import CALIBRATION_SAMPLES_MAX as MAX_SAMPLES
from backend.export.calibrated.support import refusal, refuse
from tests.backend.test_export import _train, export
from tests.families import FAMILIES, build_tiny_model, tiny_config

torch.set_num_threads(1)
FORMATS = ("gptq-int4", "awq-int4", "w8a8")
FAMILY_RUNS = ("llama", "qwen2", "gemma3_text")
SHORT = ("train.max_steps=3", "train.seq_len=64", "data.max_examples=40")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("calibrated-runs")
    trained = {"llama": _train(root, "cal-llama", *SHORT)}  # the bundled model is a Llama
    for family in FAMILY_RUNS[1:]:
        base = build_tiny_model(family, root / f"base-{family}", seed=1)
        trained[family] = _train(root, f"cal-{family}", f"model.path={base}", *SHORT)
    return trained


@pytest.mark.parametrize("family", FAMILY_RUNS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_is_written_in_compressed_tensors_reloaded_and_checked(runs, family, fmt):
    from transformers import AutoModelForCausalLM

    events, report = export(runs[family], fmt, calibration_samples=16)
    out = Path(report["path"])
    assert events[-1]["type"] == "JobFinished", events[-1]
    assert report["outcome"] == "passed" and {c["name"] for c in report["checks"]} == {"perplexity", "top1", "tokenizer"}
    assert "compressed-tensors" in report["loaded_as"]
    assert {"write", "check", "reference"} <= set(report["timings"]) and report["dtype"] == "bf16"
    assert any(n.startswith("calibrated on 16 rows of the run's training data") for n in report["notes"])
    ppl = report["checks"][0]  # every row of the run's data (2 validation, 38 training) within the quantized budget
    assert ppl["name"] == "perplexity" and ppl["rows"] == ppl["figures"]["rows"] == 40
    assert ppl["shown"].endswith(f"({ppl['tokens']:,} tokens in 40 rows)") and " ± " in ppl["shown"]
    assert ppl["precise_enough"] and ppl["standard_error"] < ppl["tolerance"] / 5, ppl["precision"]
    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    assert quant["quant_method"] == "compressed-tensors"
    assert quant["format"] == ("int-quantized" if fmt == "w8a8" else "pack-quantized")
    assert not (out / ".scratch-16bit").exists()
    with safe_open(out / "model.safetensors", "pt") as f:
        names = set(f.keys())
        if fmt == "w8a8":
            weight = f.get_tensor("model.layers.0.self_attn.q_proj.weight")
            assert weight.dtype == torch.int8 and quant["config_groups"]["group_0"]["input_activations"]["num_bits"] == 8
        else:
            assert "model.layers.0.mlp.down_proj.weight_packed" in names
            assert "model.layers.0.mlp.down_proj.weight" not in names
            assert f.get_tensor("model.layers.0.mlp.down_proj.weight_packed").dtype == torch.int32
    # Independently of the export code: plain transformers reads it and unpacks 4-bit or 8-bit integers (awq-int4's
    # asymmetric groups with compressed-tensors 0.20.1's meta zero-point shape fixed: packed_zero_points.py).
    packed_zero_points.allow()
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([[1, 4, 300, 517, 700]])).logits
    assert torch.isfinite(logits).all()
    linear = model.get_submodule("model.layers.0.mlp.down_proj")
    scale = linear.weight_scale.float()
    if fmt != "w8a8":
        scale = scale.repeat_interleave(linear.weight.shape[1] // scale.shape[1], dim=1)
    codes = linear.weight.float() / scale
    if fmt == "awq-int4":  # (q - z) s: the integers q are the codes plus the group's zero point
        group = linear.weight.shape[1] // linear.weight_scale.shape[1]
        codes = codes + linear.weight_zero_point.float().repeat_interleave(group, dim=1)
    assert torch.allclose(codes, codes.round(), atol=1e-3)
    low, high = (-128, 127) if fmt == "w8a8" else (-8, 7)
    assert low <= codes.round().min() and codes.round().max() <= high
    # The check's loader: 16-bit weights, fp32 products, and compressed-tensors' forward still rounding W8A8's inputs.
    from backend.export.calibrated.writer import load_calibrated_export

    checked, _, dtype = load_calibrated_export(out, "bf16", "cpu")
    layer = checked.get_submodule("model.layers.0.mlp.down_proj")
    assert dtype == "bf16" and layer.weight.dtype == torch.bfloat16
    with torch.no_grad():
        rounded_inputs = checked(torch.tensor([[1, 4, 300, 517, 700]])).logits
        for module in checked.modules():
            if getattr(module, "quantization_scheme", None) is not None:
                module.quantization_enabled = False
        plain_inputs = checked(torch.tensor([[1, 4, 300, 517, 700]])).logits
    assert torch.equal(rounded_inputs, plain_inputs) == (fmt != "w8a8")


def test_gpt2_and_moe_models_are_refused_in_one_line_before_anything_loads(tmp_path):
    assert "Conv1D" in refusal("gptq-int4", FAMILIES["gpt2"])
    assert "experts" in refusal("awq-int4", FAMILIES["qwen2_moe"])
    assert refusal("w8a8", FAMILIES["qwen2"]) == "" and refusal("merged", FAMILIES["gpt2"]) == ""
    base = tmp_path / "gpt2"
    base.mkdir()
    (base / "config.json").write_text(json.dumps(FAMILIES["gpt2"]))
    run = types.SimpleNamespace(full=False, base_path=base, weights_dir=tmp_path)
    with pytest.raises(JobError) as refused:
        refuse("w8a8", run)
    assert "w8a8: model_type gpt2" in refused.value.message and "\n" not in refused.value.message


@pytest.mark.parametrize("value", [0, -3, MAX_SAMPLES + 1, "64", True, 2.5])
def test_calibration_samples_out_of_range_is_refused(runs, value):
    from backend.jobs.export import Export

    with pytest.raises(JobError, match="calibration_samples"):
        Export(runs["llama"].path, {"format": "gptq-int4", "calibration_samples": value})
    assert Export(runs["llama"].path, {"format": "gptq-int4"}).calibration_samples == 128


# --- the algorithms against plain rounding -------------------------------------------------------


def _inputs(rows: int, columns: int, outliers: int = 0) -> torch.Tensor:
    """Correlated activations (as a layer's inputs are), optionally with a few large channels."""
    torch.manual_seed(0)
    x = torch.randn(rows, 16) @ torch.randn(16, columns) + 0.1 * torch.randn(rows, columns)
    if outliers:
        x[:, :outliers] *= 30.0
    return x


def test_gptq_output_error_is_well_below_plain_rounding_and_stays_on_the_grid():
    args = grid.scheme("gptq-int4", 64).weights
    torch.manual_seed(1)
    weight = torch.randn(48, 128) * 0.05
    x = _inputs(512, 128)
    hessian = gptq.Hessian(128, x.device)
    for chunk in x.split(100):
        hessian.add(chunk)
    rounded, scale, _ = gptq.quantize(weight, gptq.inverse_factor(hessian), args, torch.float32)
    plain_scale, _ = grid.weight_qparams(weight, args, torch.float32)
    plain = grid.fake_quantize(weight, plain_scale, args)
    error = (x @ (rounded - weight).T).pow(2).mean()
    baseline = (x @ (plain - weight).T).pow(2).mean()
    assert error < 0.5 * baseline, (error, baseline)
    codes = rounded / scale.repeat_interleave(64, dim=1)
    assert torch.allclose(codes, codes.round(), atol=1e-4) and codes.round().min() >= -8 and codes.round().max() <= 7


def _norm_mapping(columns: int, plus_one: bool) -> tuple[layers.Mapping, torch.nn.Module]:
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    torch.manual_seed(2)
    norm = Gemma3RMSNorm(columns) if plus_one else LlamaRMSNorm(columns)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(columns) * 0.5 + (0.0 if plus_one else 0.75))
    linears = [torch.nn.Linear(columns, 32, bias=False) for _ in range(2)]
    block = torch.nn.Sequential(norm)
    block.linears = torch.nn.ModuleList(linears)
    return layers.Mapping("test", norm, linears, plus_one), block


@pytest.mark.parametrize("plus_one", [False, True])
def test_folding_a_scale_leaves_the_unquantized_output_unchanged(plus_one):
    mapping, block = _norm_mapping(64, plus_one)
    x = _inputs(20, 64)
    before = [lin(block[0](x)) for lin in mapping.linears]
    mapping.fold(torch.rand(64) * 3 + 0.2)
    after = [lin(block[0](x)) for lin in mapping.linears]
    for a, b in zip(before, after):
        assert torch.allclose(a, b, atol=1e-4)


def _w8a8_error(mapping: layers.Mapping, x: torch.Tensor, reference: list[torch.Tensor]) -> float:
    """Output error with per-token int8 inputs and per-channel int8 weights (what w8a8 computes)."""
    args = grid.scheme("w8a8", 0).weights
    normed = mapping.feeder(x)
    step = normed.abs().amax(dim=-1, keepdim=True) / 127.5
    quantized_inputs = torch.clamp(torch.round(normed / step), -128, 127) * step
    error = 0.0
    for linear, expected in zip(mapping.linears, reference):
        scale, _ = grid.weight_qparams(linear.weight, args, torch.float32)
        error += float((quantized_inputs @ grid.fake_quantize(linear.weight, scale, args).T - expected).pow(2).mean())
    return error


def test_smoothquant_lowers_the_8bit_error_of_inputs_with_outlier_channels():
    mapping, block = _norm_mapping(64, False)
    x = _inputs(256, 64, outliers=3)
    with torch.no_grad():
        reference = [lin(block[0](x)) for lin in mapping.linears]
        plain = _w8a8_error(mapping, x, reference)
        unit = scaling.SmoothQuantUnit(mapping)
        unit.add(block[0](x))
        unit.finish()
        smoothed = _w8a8_error(mapping, x, reference)
    assert smoothed < 0.5 * plain, (smoothed, plain)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3_text"])
def test_every_mapping_folds_into_the_model_without_changing_its_logits(family):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(tiny_config(family)).eval()
    ids = torch.tensor([[1, 4, 300, 517, 700, 911, 1200, 2]])
    found = layers.mappings(model, with_up_down=True)
    kinds = {m.name.split(" ", 1)[1] for m in found}
    assert kinds == {"attention", "mlp", "up->down"}, kinds
    assert len(found) == 3 * tiny_config(family).num_hidden_layers
    with torch.no_grad():
        before = model(ids).logits
        for mapping in found:
            mapping.fold(torch.rand(mapping.linears[0].in_features) * 2 + 0.5)
        after = model(ids).logits
    assert torch.allclose(before, after, atol=1e-3), (before - after).abs().max()


def test_statistics_over_budget_take_more_runs_of_their_layer_and_every_unit_is_finished():
    class Recorder:
        def __init__(self, module, cost):
            self.module, self.cost, self.rows, self.finished = module, cost, 0, False

        def add(self, x):
            self.rows += x.reshape(-1, x.shape[-1]).shape[0]

        def finish(self):
            self.finished = True

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config("llama")).eval()
    units = [Recorder(m, 100) for m in layers.quantized_linears(model).values()]
    per_layer = len(units) // tiny_config("llama").num_hidden_layers  # 7: q, k, v, o, gate, up, down
    assert [len(g) for g in passes(units[:per_layer], 250)] == [2, 2, 2, 1]
    ran = calibrate(model, [[1, 5, 9], [1, 7]], units, budget=250)
    assert ran == 4 * tiny_config("llama").num_hidden_layers
    assert all(u.finished and u.rows == 5 for u in units)


# --- GPU --------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FORMATS)
def test_gpu_export_checks_on_cuda_and_vllm_loads_it_where_installed(runs, fmt, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    events, report = export(runs["llama"], fmt, calibration_samples=16, out=str(tmp_path / fmt))
    assert report["outcome"] == "passed" and report["check"]["device"] == "cuda", report["checks"]
    pytest.importorskip("vllm")
    from vllm import LLM, SamplingParams

    llm = LLM(model=str(tmp_path / fmt), gpu_memory_utilization=0.2, max_model_len=256, enforce_eager=True)
    out = llm.generate(["What is the capital of France?"], SamplingParams(max_tokens=4, temperature=0))
    assert out[0].outputs[0].token_ids


def test_cli_passes_calibration_samples_to_the_worker(runs, tmp_path):
    from tests.backend.test_export import _cli

    out = tmp_path / "cli-w8a8"
    done = _cli(str(runs["llama"].path), "--format", "w8a8", "--out", str(out), "--calibration-samples", "8")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "PASSED: w8a8" in done.stdout and "Traceback" not in done.stderr
    report = json.loads((out / "export_report.json").read_text())
    assert any(n.startswith("calibrated on 8 rows") for n in report["notes"])


def test_stop_while_calibrating_cancels_and_leaves_nothing(runs, tmp_path, monkeypatch):
    from backend.export.calibrated import writer
    from backend.runtime.stop_listener import StopListener

    stop = StopListener(io.StringIO())
    original = writer.calibrate

    def stopped_calibrate(*args, **kwargs):
        stop.request(save=False)  # the Stop button, pressed as calibration starts
        return original(*args, **kwargs)

    monkeypatch.setattr(writer, "calibrate", stopped_calibrate)
    out = tmp_path / "stopped"
    with pytest.raises(JobError) as caught:
        export(runs["llama"], "gptq-int4", stop=stop, out=str(out), calibration_samples=4)
    assert caught.value.kind == "cancelled" and "while writing" in caught.value.message
    assert not out.exists() and not list(tmp_path.glob(".stopped.*"))


def test_group_size_is_the_largest_that_divides_every_width_or_refused():
    def linears(*widths):
        return {str(i): torch.nn.Linear(w, 8) for i, w in enumerate(widths)}

    assert layers.group_size(linears(256, 768)) == 128
    assert layers.group_size(linears(64, 128)) == 64
    assert layers.group_size(linears(96, 160)) == 32
    with pytest.raises(ValueError, match="multiples of 32"):
        layers.group_size(linears(100, 128))
